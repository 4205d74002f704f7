--[[ status: where a task is now, read in one consistent step.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     the task's result record
ARGV[1]     group
ARGV[2]     task id
ARGV[3]     for a derived task id: the stream index of its entry ('' otherwise)
ARGV[4]     for a derived task id: its entry id

Returns {state, detail, unreadable}: 'running' with the owner, 'queued', 'scheduled',
'retrying' with the record of the failed attempt, 'record' with the final record, or
'unknown'; unreadable is the task's index entry when it is not '<stream 1-3><entry id>'
(no Tether wrote it: it is read past, and the caller reports it), else ''.
]]
local id = ARGV[2]
local unreadable = ''
local function in_stream(sidx, eid, must_exist)
  -- no group yet (no worker ever read this stream): the task is queued
  local ok, p = pcall(redis.call, 'XPENDING', KEYS[sidx], ARGV[1], eid, eid, 1)
  if ok and #p > 0 then return {'running', p[1][2]} end
  if must_exist and #redis.call('XRANGE', KEYS[sidx], eid, eid) == 0 then return nil end
  return {'queued', eid}
end
-- an index entry (a retried, delayed or deduplicated task) wins over the derived entry
local where = redis.call('HGET', KEYS[4], id)
if where then
  -- KEYS[sidx] of any other first character is no stream (nil failed the whole script)
  local sidx, eid = string.match(where, '^([123])(%d+%-%d+)$')
  if sidx then return in_stream(tonumber(sidx), eid, false) end
  unreadable = string.sub(where, 1, 200)
end
local function answer(state, detail) return {state, detail, unreadable} end
if ARGV[3] ~= '' then
  local found = in_stream(tonumber(ARGV[3]), ARGV[4], true)
  if found then return answer(found[1], found[2]) end
end
local record = redis.call('GET', KEYS[6])
if redis.call('ZSCORE', KEYS[5], id) then
  if record then return answer('retrying', record) end
  return answer('scheduled', '')
end
if record then return answer('record', record) end
return answer('unknown', '')
