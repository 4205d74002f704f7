--[[ fetch: deliver up to `count` new entries of one queue to this consumer, highest
priority first, never more than `count` in all.

KEYS[1..k]  the queue's streams in priority order
ARGV[1]     group
ARGV[2]     consumer
ARGV[3]     count: the worker's free capacity
ARGV[4]     '1' to return each stream's last-delivered id when nothing was delivered
            (the worker then waits with XREAD from those ids without taking anything)

Returns {entries, last_ids}. entries is flat: stream index, entry id, payload (nil when
the entry has no 'm' field), repeated. last_ids is empty unless asked for and idle.
]]
local count = tonumber(ARGV[3])
local out = {}
for i = 1, #KEYS do
  if count <= 0 then break end
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count,
                       'STREAMS', KEYS[i], '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      local payload = false
      local f = e[2]
      for j = 1, #f, 2 do
        if f[j] == 'm' then payload = f[j + 1]; break end
      end
      out[#out + 1] = i
      out[#out + 1] = e[1]
      out[#out + 1] = payload
      count = count - 1
    end
  end
end
local last = {}
if #out == 0 and ARGV[4] == '1' then
  for i = 1, #KEYS do
    local lid = '0-0'
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[i])) do
      local name, delivered = nil, nil
      for j = 1, #g, 2 do
        if g[j] == 'name' then name = g[j + 1]
        elseif g[j] == 'last-delivered-id' then delivered = g[j + 1] end
      end
      if name == ARGV[1] then lid = delivered end
    end
    last[i] = lid
  end
end
return {out, last}
