--[[ promote: move due delayed tasks into their streams. Idempotent and bounded, so any
worker may run it in its maintenance pass and no task is moved twice.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     scheduled payloads
ARGV[1]     the most tasks to move in this call

Returns {moved, next due time ms or nil, server time ms}.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  local v = redis.call('HGET', KEYS[6], id)
  if v then
    local sidx = tonumber(string.sub(v, 1, 1))
    local eid = redis.call('XADD', KEYS[sidx], '*', 'm', string.sub(v, 2))
    redis.call('HSET', KEYS[4], id, sidx .. eid)
    redis.call('HDEL', KEYS[6], id)
  end
  redis.call('ZREM', KEYS[5], id)
end
local head = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
return {#due, head[2] or false, now}
