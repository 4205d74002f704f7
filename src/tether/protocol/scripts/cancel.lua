--[[ cancel: remove a queued or scheduled task, or ask the worker running it to stop.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     scheduled payloads
KEYS[7]     the task's result record
KEYS[8]     the task's done list
KEYS[9]     the cancel requests of the expected owner
KEYS[10]    the task's dedup key (released if it still names this task)
ARGV[1]     group
ARGV[2]     task id
ARGV[3]     the owner the caller expects to run it ('' when it does not know yet)
ARGV[4]     the 'cancelled' record
ARGV[5]     record ttl ms
ARGV[6]     cancel request ttl ms
ARGV[7]     for a derived task id: the stream index of its entry ('' otherwise)
ARGV[8]     for a derived task id: its entry id

Returns {'cancelled'} when removed, {'requested'} when the owner was asked to stop,
{'owner', name} when another owner runs it (call again with that owner's key), or
{'finished'} when the task is neither queued, scheduled nor running.
]]
local id = ARGV[2]
local function finish()
  redis.call('SET', KEYS[7], ARGV[4], 'PX', ARGV[5])
  redis.call('RPUSH', KEYS[8], 1)
  redis.call('PEXPIRE', KEYS[8], ARGV[5])
  if redis.call('GET', KEYS[10]) == id then redis.call('DEL', KEYS[10]) end
end
if redis.call('ZREM', KEYS[5], id) == 1 then
  redis.call('HDEL', KEYS[6], id)
  finish()
  return {'cancelled'}
end
local where = redis.call('HGET', KEYS[4], id)
local sidx, eid
if where then
  -- An entry no Tether writes (set by hand) is read past, as the status script does.
  sidx, eid = string.match(where, '^([123])(%d+%-%d+)$')
  sidx = tonumber(sidx)
end
if sidx then
  -- found in the index
elseif ARGV[7] ~= '' and #redis.call('XRANGE', KEYS[tonumber(ARGV[7])], ARGV[8], ARGV[8]) > 0 then
  sidx, eid = tonumber(ARGV[7]), ARGV[8]
else
  return {'finished'}
end
local ok, p = pcall(redis.call, 'XPENDING', KEYS[sidx], ARGV[1], eid, eid, 1)
if not ok then p = {} end  -- no group yet: nobody has read it
if #p == 0 then
  redis.call('XDEL', KEYS[sidx], eid)
  redis.call('HDEL', KEYS[4], id)
  finish()
  return {'cancelled'}
end
if p[1][2] ~= ARGV[3] then return {'owner', p[1][2]} end
redis.call('SADD', KEYS[9], id)
redis.call('PEXPIRE', KEYS[9], ARGV[6])
return {'requested'}
