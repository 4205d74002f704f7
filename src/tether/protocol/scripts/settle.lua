--[[ settle: record the outcome of entries this consumer ran, fenced by ownership.

For each entry: if it is still pending and owned by this consumer, acknowledge and delete
it, drop it from the index and apply its outcome, all in this one atomic step. If another
consumer owns it now (this worker lost its lease), nothing is touched; if it is no longer
pending at all (an earlier attempt of this very call whose reply was lost, or a server that
lost its data), nothing is touched either. A late worker can never release a task that
another worker is running.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     scheduled payloads
KEYS[7]     dead-letter stream
KEYS[8]     this minute's statistics hash
KEYS[9]     this hour's statistics hash
KEYS[10..]  result, done and dedup keys named by the entries
ARGV[1]     group
ARGV[2]     consumer
ARGV[3]     dead-letter stream cap (approximate MAXLEN)
ARGV[4]     ttl ms of the minute hash     ARGV[5]  ttl ms of the hour hash (0: it has one)
ARGV[6]     s, the number of statistics signatures; then each: n, then n fields (a
            signature is the set of fields one finished attempt adds one to: its task and
            outcome, the buckets of its run and wait times). Each entry names its
            signature, and only the entries this call settles are counted: an outcome the
            fenced ack discards (a lost lease) or one settled by an earlier send of this
            very call (a lost reply) never is.
then the entries. A bare success (nothing to record, no index entry) takes 4 values:
  'o', stream index, entry id, signature (1-based, 0 none). Every other entry takes 18:
  1 op: 'ok' | 'retry' | 'fail' | 'dead' | 'cancel'
  2 stream index   3 entry id   4 task id ('' when the payload could not be decoded)
  5 '1' when the task id came in the payload: it must be indexed to this very entry,
    or the entry is a forgery or a stale copy and may not write that task's records
  6 result key index (0 none)   7 done key index (0 none)   8 dedup key index (0 none)
  9 outcome record ('' none)    10 record ttl ms
  11 retry: delay ms; fail/dead: the reason
  12 retry: the next attempt's payload; fail/dead: the error (type, message, traceback)
  13 dedup hold ms after the outcome (0 = release the key now)
  14 signature (1-based, 0 none)
  15 the schedule's backoff states key index (0: not a run of a schedule that backs off)
  16 the schedule's tick log key index (0: not a run of a schedule)
  17 the schedule's run: '<tick ms or empty>|<log length>|<log ttl ms>|<initial ms>|<factor>|
     <cap ms>|<forget ms>|<schedule name>' (the four backoff values empty when it has none)
  18 attempts key index (0 none): a retry appends its record there (the last 25 are kept),
     so the errors of the attempts before the last outlive the result key, which each
     attempt's record replaces; it expires with the result

A run of a schedule records its outcome in the schedule's tick log, and its backoff state
changes here, with the outcome it follows from (no later step a crash could skip): a success
ends the backoff; a final failure ('fail', 'dead') counts one more failure in a row and sets
the time before which the schedule's ticks are skipped (scripts/tick.lua), the delay growing
from initial by factor up to cap; the state is forgotten forget ms after the last failure.

Returns {taken, gone, settled, forged}: taken is flat (entry, its owner now) for entries
another consumer owns, gone lists entries no longer pending, settled counts the entries
settled, forged lists the entries whose task id the index binds to another entry (they went
to the dead letters instead of their outcome). An entry is named as the index names it: its
stream index then its id ('2' .. '1700000000000-0'), since the same id can exist in two of
the queue's streams.
]]
local group, me, dead_cap = ARGV[1], ARGV[2], ARGV[3]
local taken, gone, settled, forged = {}, {}, 0, {}
local now = nil
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local outcome_words = {ok = 'succeeded', fail = 'failed', dead = 'dead'}
-- A run of a schedule ended: record it in the tick log; end or extend the backoff.
local function schedule_run(op, tid, backoff_k, log_k, run)
  local tick, log_len, log_ttl, initial, factor, cap, forget, name = string.match(
    run, '^(%d*)|(%d+)|(%d+)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.+)$')
  if not name then return end
  local fields = {'tick', tick, 'outcome', outcome_words[op], 'id', tid}
  if backoff_k > 0 and op == 'ok' then
    redis.call('HDEL', KEYS[backoff_k], name)
  elseif backoff_k > 0 then
    initial, factor, cap, forget = tonumber(initial), tonumber(factor), tonumber(cap),
                                   tonumber(forget)
    if initial and factor and cap and forget then
      local failures = 0
      local state = redis.call('HGET', KEYS[backoff_k], name)
      if state then
        local f, forget_at = string.match(state, '^(%d+)|%d+|(%d+)$')
        if f and tonumber(forget_at) > clock() then failures = tonumber(f) end
      end
      failures = failures + 1
      local delay = math.min(cap, initial * factor ^ math.min(failures - 1, 64))
      local until_ms = clock() + math.floor(delay)
      redis.call('HSET', KEYS[backoff_k], name,
                 string.format('%d|%d|%d', failures, until_ms, clock() + forget))
      if redis.call('PTTL', KEYS[backoff_k]) < forget then
        redis.call('PEXPIRE', KEYS[backoff_k], forget)
      end
      fields[#fields + 1] = 'failures'
      fields[#fields + 1] = string.format('%d', failures)
      fields[#fields + 1] = 'until'
      fields[#fields + 1] = string.format('%d', until_ms)
    end
  end
  redis.call('XADD', KEYS[log_k], 'MAXLEN', log_len, '*', unpack(fields))
  redis.call('PEXPIRE', KEYS[log_k], log_ttl)
end
local sigs, counts, counted = {}, {}, false
local b = 7
for s = 1, tonumber(ARGV[6]) do
  local n = tonumber(ARGV[b])
  local fields = {}
  for j = 1, n do fields[j] = ARGV[b + j] end
  sigs[s] = fields
  b = b + n + 1
end
while b <= #ARGV do
  local op, sidx, eid = ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 2]
  local tid, bound, result_k, done_k, dedup_k, record, ttl, hold = '', '0', 0, 0, 0, '', 0, 0
  local detail, extra, sig = '', '', 0
  local backoff_k, log_k, run, attempts_k = 0, 0, '', 0
  if op == 'o' then
    sig = tonumber(ARGV[b + 3])
    b = b + 4
  else
    tid, bound = ARGV[b + 3], ARGV[b + 4]
    result_k, done_k, dedup_k = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
    record, ttl = ARGV[b + 8], ARGV[b + 9]
    detail, extra, hold = ARGV[b + 10], ARGV[b + 11], tonumber(ARGV[b + 12])
    sig = tonumber(ARGV[b + 13])
    backoff_k, log_k, run = tonumber(ARGV[b + 14]), tonumber(ARGV[b + 15]), ARGV[b + 16]
    attempts_k = tonumber(ARGV[b + 17])
    b = b + 18
  end
  local stream = KEYS[sidx]
  local p = redis.call('XPENDING', stream, group, eid, eid, 1)
  if #p == 0 then
    gone[#gone + 1] = sidx .. eid
  elseif p[1][2] ~= me then
    taken[#taken + 1] = sidx .. eid
    taken[#taken + 1] = p[1][2]
  else
    settled = settled + 1
    if sig > 0 then
      for _, field in ipairs(sigs[sig]) do counts[field] = (counts[field] or 0) + 1 end
      counted = true
    end
    if bound == '1' and redis.call('HGET', KEYS[4], tid) ~= sidx .. eid then
      local why = 'its task id ' .. tid .. ' belongs to another entry (a forged or copied ' ..
                  'entry), so it may not write that task\'s records'
      if op == 'fail' or op == 'dead' then
        detail = detail .. '; ' .. why
      else
        detail, extra = 'it ran, but ' .. why, ''
      end
      forged[#forged + 1] = sidx .. eid
      op, tid, result_k, done_k, dedup_k = 'dead', '', 0, 0, 0
      backoff_k, log_k, attempts_k = 0, 0, 0
    end
    local payload = ''
    if op == 'fail' or op == 'dead' then
      local e = redis.call('XRANGE', stream, eid, eid)
      if #e > 0 then
        local f = e[1][2]
        for j = 1, #f, 2 do
          if f[j] == 'm' then payload = f[j + 1] end
        end
      end
    end
    -- The ack comes first: a server at its memory limit refuses a script whose first write
    -- needs memory, and accepts the rest of a script that has started writing, so a full
    -- server still lets workers settle what they hold.
    redis.call('XACK', stream, group, eid)
    redis.call('XDEL', stream, eid)
    if op == 'fail' or op == 'dead' then
      -- detail is the reason, extra the error
      local status = 'dead'
      if op == 'fail' then status = 'failed' end
      redis.call('XADD', KEYS[7], 'MAXLEN', '~', dead_cap, '*', 'm', payload, 'id', tid,
                 'status', status, 'reason', detail, 'error', extra, 'queue_stream', stream,
                 'entry', eid, 'deliveries', p[1][4], 'at', clock())
    end
    if tid ~= '' then
      redis.call('HDEL', KEYS[4], tid)
      if op == 'retry' then
        -- detail is the delay in ms, extra the next attempt's payload
        redis.call('ZADD', KEYS[5], clock() + tonumber(detail), tid)
        redis.call('HSET', KEYS[6], tid, sidx .. extra)
      end
    end
    if result_k > 0 and record ~= '' then redis.call('SET', KEYS[result_k], record, 'PX', ttl) end
    if attempts_k > 0 and op == 'retry' and record ~= '' then
      redis.call('RPUSH', KEYS[attempts_k], record)
      redis.call('LTRIM', KEYS[attempts_k], -25, -1)
      redis.call('PEXPIRE', KEYS[attempts_k], ttl)
    elseif attempts_k > 0 then
      redis.call('PEXPIRE', KEYS[attempts_k], ttl)  -- as long as the final record
    end
    if op ~= 'retry' then
      if done_k > 0 then
        redis.call('RPUSH', KEYS[done_k], 1)
        redis.call('PEXPIRE', KEYS[done_k], ttl)
      end
      if dedup_k > 0 and redis.call('GET', KEYS[dedup_k]) == tid then
        if hold > 0 then
          redis.call('PEXPIRE', KEYS[dedup_k], hold)
        else
          redis.call('DEL', KEYS[dedup_k])
        end
      end
      if log_k > 0 and op ~= 'cancel' then schedule_run(op, tid, backoff_k, log_k, run) end
    end
  end
end
if counted then
  for field, n in pairs(counts) do
    redis.call('HINCRBY', KEYS[8], field, n)
    redis.call('HINCRBY', KEYS[9], field, n)
  end
  if ARGV[4] ~= '0' then redis.call('PEXPIRE', KEYS[8], ARGV[4]) end
  if ARGV[5] ~= '0' then redis.call('PEXPIRE', KEYS[9], ARGV[5]) end
end
return {taken, gone, settled, forged}
