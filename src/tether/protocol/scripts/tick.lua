--[[ tick: enqueue a schedule's ticks at most once each, whichever scheduler calls it.

Each queue keeps, per schedule, the last tick handled ("<tick ms>|<task id>"). A tick is
enqueued only if it is later than that marker, in this one atomic step, so two schedulers that
both believe they lead (a failover, a partition, a frozen leader that wakes up) can never
enqueue the same tick twice.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     the queue's tick markers (hash: schedule name -> "<tick ms>|<task id>")
ARGV[1]     schedule name
ARGV[2]     '1' if runs may overlap, '0' to skip a tick while the previous run is queued,
            retrying or running
ARGV[3]     stream index (1..3)
ARGV[4..]   triples, ascending by tick: tick ms, task id, payload ('' = advance the marker
            past this tick without enqueuing: a skipped or missed tick)

Returns one value per tick: 'enqueued', 'skipped' (advanced), 'overlap' (previous run still
active), or 'done' (an earlier call already handled this tick).
]]
local name, overlap, sidx = ARGV[1], ARGV[2], tonumber(ARGV[3])
local marker = redis.call('HGET', KEYS[6], name)
local last_tick, last_id = -1, ''
if marker then
  local sep = string.find(marker, '|', 1, true)
  last_tick = tonumber(string.sub(marker, 1, sep - 1))
  last_id = string.sub(marker, sep + 1)
end
local out = {}
for i = 4, #ARGV, 3 do
  local tick, id, payload = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  if tick <= last_tick then
    out[#out + 1] = 'done'
  elseif payload == '' then
    last_tick = tick
    out[#out + 1] = 'skipped'
  elseif overlap == '0' and last_id ~= '' and
      (redis.call('HEXISTS', KEYS[4], last_id) == 1 or redis.call('ZSCORE', KEYS[5], last_id)) then
    last_tick = tick
    out[#out + 1] = 'overlap'
  else
    local eid = redis.call('XADD', KEYS[sidx], '*', 'm', payload)
    redis.call('HSET', KEYS[4], id, sidx .. eid)
    last_tick, last_id = tick, id
    out[#out + 1] = 'enqueued'
  end
end
redis.call('HSET', KEYS[6], name, string.format('%d', last_tick) .. '|' .. last_id)
return out
