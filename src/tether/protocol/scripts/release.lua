--[[ release: delete a lease only if it still holds this process's token
(compare-and-delete), so a late process never drops a successor's lease.

KEYS[1]     the lease
ARGV[1]     the token
Returns 1 when deleted, 0 otherwise.
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
