--[[ handoff: give this consumer's entries to the reserved consumer 'abandoned', where
any worker may claim them at its next maintenance pass (shutdown, cancelled fetches).

KEYS[1]     the stream
ARGV[1]     group
ARGV[2]     consumer (the one handing off)
ARGV[3..]   pairs: entry id, '1' if the task started here else '0'

An entry that never started gives back the delivery it used, so a rolling deploy does not
push healthy tasks toward quarantine. Returns the number of entries handed off.
]]
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local moved = 0
for i = 3, #ARGV, 2 do
  local eid, started = ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', stream, group, eid, eid, 1)
  if #p == 1 and p[1][2] == me then
    local count = p[1][4]
    if started == '0' and count > 0 then count = count - 1 end
    redis.call('XCLAIM', stream, group, 'abandoned', 0, eid, 'RETRYCOUNT', count, 'JUSTID')
    moved = moved + 1
  end
end
return moved
