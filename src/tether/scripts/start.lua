--[[ start: count a start of a reclaimed entry, just before its task runs again.

KEYS[1]     the stream
ARGV[1]     group
ARGV[2]     consumer
ARGV[3]     entry id

Returns the delivery count after this start, or 0 if this consumer no longer owns the entry
(then the task must not run here).
]]
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
local count = p[1][4] + 1
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', count, 'JUSTID')
return count
