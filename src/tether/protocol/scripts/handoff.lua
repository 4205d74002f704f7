--[[ handoff: give this consumer's entries to the reserved consumer 'abandoned', where
any worker may claim them at its next maintenance pass (shutdown, cancelled fetches).

KEYS[1]     the stream
ARGV[1]     group
ARGV[2]     consumer (the one handing off)
ARGV[3..]   pairs: entry id, '1' to give back the delivery this worker counted, else '0'

A handoff is not a crash: the delivery this worker counted (its fetch, or its start of a
reclaimed entry) is given back, so rolling deploys never push healthy tasks toward
quarantine. Returns the number of entries handed off.
]]
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local moved = 0
for i = 3, #ARGV, 2 do
  local eid, give_back = ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', stream, group, eid, eid, 1)
  if #p == 1 and p[1][2] == me then
    local count = p[1][4]
    if give_back == '1' and count > 0 then count = count - 1 end
    redis.call('XCLAIM', stream, group, 'abandoned', 0, eid, 'RETRYCOUNT', count, 'JUSTID')
    moved = moved + 1
  end
end
return moved
