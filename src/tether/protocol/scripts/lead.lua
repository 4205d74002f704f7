--[[ lead: take the scheduler leadership if it is free, or extend it if this instance holds it
(compare-and-extend). Only the holder extends; the lease expires on its own otherwise.

KEYS[1]     the leader key
ARGV[1]     this instance's token
ARGV[2]     lease ttl ms

Returns 1 when this instance leads after the call, 0 otherwise.
]]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
