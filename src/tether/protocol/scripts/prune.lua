--[[ prune: remove a dead consumer from a queue's groups, only if it has no lease and no
pending entries, checked in the same step (DELCONSUMER on a consumer with pending entries
would destroy them).

KEYS[1..k]  the queue's streams
KEYS[k+1]   the consumer's lease
ARGV[1]     group
ARGV[2]     consumer
Returns 1 when removed, 0 when kept.
]]
local group, consumer = ARGV[1], ARGV[2]
local lease = KEYS[#KEYS]
if redis.call('EXISTS', lease) == 1 then return 0 end
for i = 1, #KEYS - 1 do
  local ok, p = pcall(redis.call, 'XPENDING', KEYS[i], group, '-', '+', 1, consumer)
  if ok and #p > 0 then return 0 end
end
for i = 1, #KEYS - 1 do
  pcall(redis.call, 'XGROUP', 'DELCONSUMER', KEYS[i], group, consumer)
end
return 1
