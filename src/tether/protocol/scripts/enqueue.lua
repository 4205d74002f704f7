--[[ enqueue: add tasks to one queue, now or later, at most once per dedup key.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash: task id -> "<stream index><entry id>" while queued or running
KEYS[5]     delayed set: task id scored by its due time (ms, server clock)
KEYS[6]     scheduled payloads: task id -> "<stream index><payload>"
KEYS[7..]   dedup keys named by this call
ARGV[1]     n, the number of tasks; then 7 values per task:
            task id, payload, stream index (1..3),
            when ('n' now, 'r' relative, 'a' absolute unix ms), when value (ms),
            dedup key index into KEYS (0 = none), dedup hold (ms the key outlives the due time)

Returns one value per task: the entry id when queued now, "d" when delayed, or
"=<task id>" when a task with the same dedup key is already queued, scheduled or running.
]]
local n = tonumber(ARGV[1])
local out = {}
local now = nil
for i = 0, n - 1 do
  local b = 2 + i * 7
  local id, payload, sidx = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2])
  local mode, when = ARGV[b + 3], tonumber(ARGV[b + 4])
  local dedup_k, hold = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  local due = 0
  if mode ~= 'n' then
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    if mode == 'r' then due = now + when else due = when end
    if due <= now then mode = 'n' end
  end
  local duplicate = false
  if dedup_k > 0 then
    local ttl = hold
    if mode ~= 'n' then ttl = ttl + (due - now) end
    if not redis.call('SET', KEYS[dedup_k], id, 'NX', 'PX', ttl) then
      out[#out + 1] = '=' .. redis.call('GET', KEYS[dedup_k])
      duplicate = true
    end
  end
  if not duplicate then
    if mode == 'n' then
      local eid = redis.call('XADD', KEYS[sidx], '*', 'm', payload)
      redis.call('HSET', KEYS[4], id, sidx .. eid)
      out[#out + 1] = eid
    else
      redis.call('ZADD', KEYS[5], due, id)
      redis.call('HSET', KEYS[6], id, sidx .. payload)
      out[#out + 1] = 'd'
    end
  end
end
return out
