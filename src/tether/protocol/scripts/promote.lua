--[[ promote: move due delayed tasks into their streams, and say whether the queue is
paused. Idempotent and bounded, so any worker may run it in its maintenance pass and no task
is moved twice.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     scheduled payloads
KEYS[7]     dead-letter stream (for malformed members)
KEYS[8]     the queue's pause flag
ARGV[1]     the most tasks to move in this call
ARGV[2]     dead-letter stream cap (approximate MAXLEN)

A member whose payload is missing or does not start with a stream index 1..3 cannot be
promoted: it goes to the dead-letter stream with the reason, so one bad member never stops
the queue.

Returns {moved, next due time ms or nil, server time ms, 1 if paused else 0, malformed}.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local moved, malformed = 0, 0
for _, id in ipairs(due) do
  local v = redis.call('HGET', KEYS[6], id)
  local sidx = v and tonumber(string.sub(v, 1, 1))
  if sidx == 1 or sidx == 2 or sidx == 3 then
    local eid = redis.call('XADD', KEYS[sidx], '*', 'm', string.sub(v, 2))
    redis.call('HSET', KEYS[4], id, sidx .. eid)
    moved = moved + 1
  else
    local reason = 'malformed delayed task: no payload'
    local payload = ''
    if v then
      reason = 'malformed delayed task: its payload does not start with a stream index 1..3'
      payload = v
    end
    redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[2], '*', 'm', payload, 'id', id,
               'status', 'dead', 'reason', reason, 'at', now)
    malformed = malformed + 1
  end
  redis.call('HDEL', KEYS[6], id)
  redis.call('ZREM', KEYS[5], id)
end
local head = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
local paused = 0
if redis.call('EXISTS', KEYS[8]) == 1 then paused = 1 end
return {moved, head[2] or false, now, paused, malformed}
