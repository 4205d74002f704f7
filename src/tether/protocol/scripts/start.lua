--[[ start: count a start of a reclaimed entry, just before its task runs again.

KEYS[1]     the stream
ARGV[1]     group
ARGV[2]     consumer
ARGV[3]     entry id
ARGV[4]     (optional) the delivery count this consumer saw when it took the entry

Given ARGV[4], idempotent, so a call whose reply was lost can be sent again: when the count
is already above the one seen, this consumer's earlier call counted the start (only the
owner raises the count, and a claim keeps it), and the count is returned unchanged.

Returns the delivery count after this start, or 0 if this consumer no longer owns the entry
(then the task must not run here).
]]
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
local seen = tonumber(ARGV[4])
if seen and p[1][4] > seen then return p[1][4] end
local count = p[1][4] + 1
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', count, 'JUSTID')
return count
