--[[ renew: the heartbeat. Extend this worker's lease on one queue and collect the ids of
its running tasks that someone asked to cancel.

KEYS[1]     the lease
KEYS[2]     the worker's cancel requests (a set of task ids)
ARGV[1]     the worker's token (unique per process)
ARGV[2]     lease ttl ms

A lease this process still holds is extended with PEXPIRE, which a server at its memory
limit (maxmemory with noeviction) still accepts: a full server must not make live workers
look dead. Only a lapsed (or foreign) lease is written anew with SET, which a full server
refuses with an OOM error before this script has changed anything.

Returns {previous token or nil, task ids to cancel}. A previous token that is nil means
the lease had lapsed; a different token means another process took over this name.
]]
local previous = redis.call('GET', KEYS[1])
if previous == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
local cancels = redis.call('SMEMBERS', KEYS[2])
if #cancels > 0 then redis.call('DEL', KEYS[2]) end
return {previous, cancels}
