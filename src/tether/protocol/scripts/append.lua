--[[ append: add a batch of tasks to one stream in one atomic step (enqueue_many).

KEYS[1]     the stream
ARGV[1..]   payloads

Returns the entry ids, in order. A task enqueued this way has no index entry: its id is
derived from its stream entry ("<queue>:<stream index>-<entry id>").
]]
local ids = {}
for i = 1, #ARGV do
  ids[i] = redis.call('XADD', KEYS[1], '*', 'm', ARGV[i])
end
return ids
