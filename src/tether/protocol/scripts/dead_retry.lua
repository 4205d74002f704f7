--[[ dead_retry: put a dead-lettered task back in its stream as a fresh attempt, and remove
it from the dead-letter stream, in one step (so it is never in both, nor in neither).

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     dead-letter stream
KEYS[6]     the task's result record (removed: the task is queued again)
ARGV[1]     dead-letter entry id
ARGV[2]     stream index to enqueue into (1..3)
ARGV[3]     task id
ARGV[4]     the payload of the fresh attempt

Returns the new entry id, or nil when the dead-letter entry is gone.
]]
if #redis.call('XRANGE', KEYS[5], ARGV[1], ARGV[1]) == 0 then return false end
local sidx = tonumber(ARGV[2])
local eid = redis.call('XADD', KEYS[sidx], '*', 'm', ARGV[4])
redis.call('HSET', KEYS[4], ARGV[3], sidx .. eid)
redis.call('XDEL', KEYS[5], ARGV[1])
redis.call('DEL', KEYS[6])
return eid
