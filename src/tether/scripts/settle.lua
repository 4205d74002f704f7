--[[ settle: record the outcome of entries this consumer ran, fenced by ownership.

For each entry: if it is still pending and owned by this consumer, acknowledge and delete
it, drop it from the index and apply its outcome, all in this one atomic step. If another
consumer owns it now (this worker lost its lease), nothing is touched and its id is
returned, so a late worker can never release a task that another worker is running.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     scheduled payloads
KEYS[7]     dead-letter stream
KEYS[8..]   result, done and dedup keys named by the entries
ARGV[1]     group
ARGV[2]     consumer
ARGV[3]     dead-letter stream cap (approximate MAXLEN)
ARGV[4..]   the entries. A bare success (nothing to record, no index entry) takes 3 values:
  'o', stream index, entry id. Every other entry takes 12:
  1 op: 'ok' | 'retry' | 'fail' | 'dead' | 'cancel'
  2 stream index   3 entry id   4 task id ('' when the payload could not be decoded)
  5 result key index (0 none)   6 done key index (0 none)   7 dedup key index (0 none)
  8 outcome record ('' none)    9 record ttl ms
  10 retry: delay ms; fail/dead: the reason
  11 retry: the next attempt's payload; fail/dead: the error (type, message, traceback)
  12 dedup hold ms after the outcome (0 = release the key now)

Returns the ids of entries that are no longer ours (lost leases).
]]
local group, me, dead_cap = ARGV[1], ARGV[2], ARGV[3]
local lost = {}
local now = nil
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local b = 4
while b <= #ARGV do
  local op, sidx, eid = ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 2]
  local tid, rk, dk, xk, record, ttl, a1, a2, hold = '', 0, 0, 0, '', 0, '', '', 0
  if op == 'o' then
    b = b + 3
  else
    tid = ARGV[b + 3]
    rk, dk, xk = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
    record, ttl = ARGV[b + 7], ARGV[b + 8]
    a1, a2, hold = ARGV[b + 9], ARGV[b + 10], tonumber(ARGV[b + 11])
    b = b + 12
  end
  local stream = KEYS[sidx]
  local p = redis.call('XPENDING', stream, group, eid, eid, 1)
  if #p == 0 or p[1][2] ~= me then
    lost[#lost + 1] = eid
  else
    if op == 'fail' or op == 'dead' then
      local payload = ''
      local e = redis.call('XRANGE', stream, eid, eid)
      if #e > 0 then
        local f = e[1][2]
        for j = 1, #f, 2 do
          if f[j] == 'm' then payload = f[j + 1] end
        end
      end
      local status = 'dead'
      if op == 'fail' then status = 'failed' end
      redis.call('XADD', KEYS[7], 'MAXLEN', '~', dead_cap, '*', 'm', payload, 'id', tid,
                 'status', status, 'reason', a1, 'error', a2, 'queue_stream', stream,
                 'entry', eid, 'deliveries', p[1][4], 'at', clock())
    end
    redis.call('XACK', stream, group, eid)
    redis.call('XDEL', stream, eid)
    if tid ~= '' then
      redis.call('HDEL', KEYS[4], tid)
      if op == 'retry' then
        redis.call('ZADD', KEYS[5], clock() + tonumber(a1), tid)
        redis.call('HSET', KEYS[6], tid, sidx .. a2)
      end
    end
    if rk > 0 and record ~= '' then redis.call('SET', KEYS[rk], record, 'PX', ttl) end
    if op ~= 'retry' then
      if dk > 0 then
        redis.call('RPUSH', KEYS[dk], 1)
        redis.call('PEXPIRE', KEYS[dk], ttl)
      end
      if xk > 0 and redis.call('GET', KEYS[xk]) == tid then
        if hold > 0 then redis.call('PEXPIRE', KEYS[xk], hold) else redis.call('DEL', KEYS[xk]) end
      end
    end
  end
end
return lost
