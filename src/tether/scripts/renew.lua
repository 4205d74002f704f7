--[[ renew: the heartbeat. Extend this worker's lease on one queue and collect the ids of
its running tasks that someone asked to cancel.

KEYS[1]     the lease
KEYS[2]     the worker's cancel requests (a set of task ids)
ARGV[1]     the worker's token (unique per process)
ARGV[2]     lease ttl ms

Returns {previous token or nil, task ids to cancel}. A previous token that is nil means
the lease had lapsed; a different token means another process took over this name.
]]
local previous = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'GET')
local cancels = redis.call('SMEMBERS', KEYS[2])
if #cancels > 0 then redis.call('DEL', KEYS[2]) end
return {previous, cancels}
