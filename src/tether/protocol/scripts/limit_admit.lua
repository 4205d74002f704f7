--[[ limit_admit: admit entries of limited tasks just before they start, or hold them back.
One call per queue for every limited entry about to start on this worker (a fetch batch).

KEYS[1..8]  the queue keys (see limit_lib)
KEYS[9]     this minute's statistics hash   KEYS[10] this hour's (unused when ARGV[8] is 0)
KEYS[11..]  the limit keys named by the task table and the entries
ARGV[1]     group
ARGV[2]     consumer
ARGV[3]     the slot holder: this worker's lease instance, '<consumer> <instance>'
ARGV[4]     the reserved consumer 'abandoned'
ARGV[5]     backstop ms: a parked task is looked at again after this long even if no
            wake-up came (a wake-up lost with a cancelled neighbour, say)
ARGV[6]     slack ms: the meter's tolerance is the burst's, or this if more: workers are
            never exactly on time, and a meter finer than their lateness would refuse every
            other task
ARGV[7]     missed ms: a reserved start time whose task has not come this long after it is
            missed, and goes to a task that is ready (see 2.)
ARGV[8]     statistics ttl ms (0: no statistics)
ARGV[9]     the task table (see limit_lib)
ARGV[10]    the entries, a JSON list of [stream index, entry id, task id, the task's index
            in the table, 1 when the task id came in the payload (it must be indexed to this
            very entry), 1 when the entry was reclaimed (its count of starts must stay with
            it), the limit key ('' none), the key scope's rate bucket, running hash and
            waiting list (indexes in KEYS, 0 when there is no key), the index in ARGV of the
            payload to store if it is held back (it carries the task id; 0 for a plain task
            sent without it: the script asks for it)]
ARGV[11..]  those payloads

Each entry is decided first and changed after:
1. A concurrency limit (the task's, the key's) has no free slot (or a slot held for this
   task by another holder, whose copy may still run; a slot of an earlier incarnation of
   this worker's name is this worker's): the entry is parked (out of the stream into the
   delayed set at now + backstop, and into that limit's waiting list); any slot it held or
   was woken for is given back, and a rate token it had reserved is forfeited (a token
   cannot be saved for later). 'p', 'c' or 'C'. Every concurrency limit is checked before
   any rate token is taken, so a task parked for a slot holds no start time.
2. A rate limit (the task's, the key's) has two GCRA clocks in one key. The schedule hands
   out start times: a task with no token now reserves the next free one and waits in the
   delayed set until then ('d', '<due ms><r|R>'), so waiting tasks never poll and come back
   one at a time. The meter counts the starts admitted, when they are admitted: a task that
   comes back with its reservation starts only if the meter allows it (within the burst, or
   the slack if that is more), so tasks that missed their times while every worker was
   busy or stalled never start in a burst: one the meter refuses takes the next free time
   of the schedule, behind the tasks already waiting. A start time is not lost to a task
   that is late for it (its promoted entry waits behind a backlog still being read, or its
   worker stalled): once it is `missed` ms past, a task of the same name that has no time
   yet starts in its place if the meter is idle (only for a task-wide rate: a key's times
   are not interchangeable), and the late task takes a new time when it comes.
   A task with both rates whose key's rate binds reserves a time of its key's schedule only
   (its reservation is stored negated): the task-wide schedule can hand out only its next
   time, and advancing it to the key's far later time would give the task-wide times in
   between to no one, so a busy key would hold back every other key. When it comes back
   the task-wide rate is asked like for a task with no time: it starts if that rate has a
   token, else it takes that rate's next free time (now counted in both schedules) and
   keeps its key's time. Its key's next task, back on time (within `missed`) for its own
   key's time, may find the key's meter not ready (this one started late): it waits for
   the meter, keeping its key's time, rather than losing it like a late task.
   While it waits for its time, the task keeps (or takes, as '': held for a task no worker
   runs) the slots of the concurrency limits no wider than the rate it waits for: the key's
   always, the task's only when the task-wide rate is what it waits for. No other task could
   use such a slot sooner (every task that could needs a later token of the same rate), and
   a task that waited for its token finds its slot, so it is never parked after it took a
   token. The tasks waiting for tokens therefore count against the concurrency limits: a
   busy key cannot reserve the rate's start times for tasks its own slots would park.
3. Admitted: it takes its slots (holder = this lease instance) and counts in the meter.
   'a', the concurrency scopes held ('c', 'C').
Holding an entry back first checks that this consumer still owns it ('x' if not: nothing
touched) and that a task id it carries is bound to it (a forged or copied entry is admitted
with no limit state: settle dead-letters it). A plain task held back without its payload
gets 'n' and nothing changes: the worker sends it again with the payload. A reclaimed entry
held back stays in its stream instead, handed to 'abandoned' with the start its claimer
counted given back ('h', 'c' | 'C' | 'r' | 'R'): a reclaim pass takes it up again, and for
a slot it joins the waiting list as '<task id>\n@' so that a freed slot is woken for it.

Returns {now ms, then flat: entry id, code, detail}.
]]
local group, consumer, me, abandoned = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local backstop, slack, missed = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local stats_ttl = tonumber(ARGV[8])
local tasks, pos = read_tasks(9)
local now = clock()
local counted = false
local out = {now}

local function count(task, name)
  if stats_ttl > 0 then
    local f = task .. '|' .. name
    redis.call('HINCRBY', KEYS[9], f, 1)
    redis.call('HINCRBY', KEYS[10], f, 1)
    counted = true
  end
end

local function defer(e, score)
  redis.call('XACK', KEYS[e.sidx], group, e.eid)
  redis.call('XDEL', KEYS[e.sidx], e.eid)
  if e.bound then redis.call('HDEL', KEYS[4], e.tid) end
  redis.call('ZADD', KEYS[5], fmt(score), e.tid)
  redis.call('HSET', KEYS[6], e.tid, e.sidx .. ARGV[e.payload])
end

-- A reclaimed entry keeps its place in the pending list: handed to 'abandoned', with the
-- start its claimer counted given back (it did not start).
local function hand_back(e, row)
  local starts = row[4]
  if starts > 0 then starts = starts - 1 end
  redis.call('XCLAIM', KEYS[e.sidx], group, abandoned, 0, e.eid, 'RETRYCOUNT', starts, 'JUSTID')
end

-- Give back the slots this task holds or was woken for, waking the next waiter of each;
-- but keep (or take) those that keep(scope) says, held as '' while no worker runs it.
local function give_back(e, t, scopes, keep)
  local kept, freed = false, false
  for _, s in ipairs(scopes) do
    if keep and keep(s) then
      redis.call('HSET', KEYS[s.run], e.tid, '')
      kept = true
    elseif s.mine then
      redis.call('HDEL', KEYS[s.run], e.tid)
      wake(KEYS[s.run], KEYS[s.wait], s.limit, s.suffix, KEYS[s.wkeys], s.member)
      freed = true
    end
  end
  if kept then
    redis.call('HSET', KEYS[7], e.tid, '\n' .. held_suffix(t.name, e.key))
  elseif freed then
    redis.call('HDEL', KEYS[7], e.tid)
  end
end

-- Which slots a task waiting for a rate token keeps (see 2.): those of limits no wider than
-- the rate it waits for; when it came back early (no binding), those it has.
local function waiting_keeps(binding)
  return function(s)
    if not binding then return s.mine end
    return s.code == 'C' or binding.code == 'r'
  end
end

local function concurrency_scopes(e, t, cfg)
  local scopes = {}
  if cfg.c > 0 then
    scopes[#scopes + 1] = {run = t.run, wait = t.wait, limit = cfg.c, code = 'c',
                           name = 'held_concurrency', suffix = t.suffix, member = ''}
  end
  if e.key ~= '' and cfg.kc > 0 then
    scopes[#scopes + 1] = {run = e.krun, wait = e.kwait, limit = cfg.kc, code = 'C',
                           name = 'held_key_concurrency', suffix = held_suffix(t.name, e.key),
                           member = e.key}
  end
  local blocked = nil
  for _, s in ipairs(scopes) do
    s.wkeys = t.wkeys
    local h = redis.call('HGET', KEYS[s.run], e.tid)
    s.mine = (h == me or h == '' or (h and replaced(h, me)))
    if not s.mine and not blocked then
      if h or redis.call('HLEN', KEYS[s.run]) >= s.limit then blocked = s end
    end
  end
  return scopes, blocked
end

local function rate_scopes(e, t, cfg)
  local rates = {}
  if cfg.ri > 0 then
    rates[#rates + 1] = {key = KEYS[t.bucket], i = cfg.ri, tau = cfg.rt, code = 'r',
                         name = 'held_rate'}
  end
  if e.key ~= '' and cfg.kri > 0 then
    rates[#rates + 1] = {key = KEYS[e.kbucket], i = cfg.kri, tau = cfg.krt, code = 'R',
                         name = 'held_key_rate'}
  end
  return rates
end

-- When may it start? Returns the due time (now: at once), the binding rate limit (nil when
-- it came back before its reserved time: what it holds stays as it is), and the time it had
-- reserved (nil: none). Marks each rate b.held when this task holds a time of its schedule
-- that still stands (counted when it was reserved: not counted again).
local function rate_due(e, t, gen, rates)
  local reserved = redis.call('ZSCORE', KEYS[t.resv], e.tid)
  reserved = reserved and tonumber(reserved)
  -- a negative score: a time of the key's schedule only (see 2.)
  local key_only = reserved and reserved < 0
  if key_only then reserved = -reserved end
  if reserved and reserved > now then return reserved, nil, reserved end
  local due, binding, refused = now, nil, false
  for _, b in ipairs(rates) do
    b.s, b.m = rate_state(b.key, gen)
    b.held = reserved ~= nil and (not key_only or b.code == 'R')
    local earliest = b.m - math.max(b.tau, slack)  -- the meter
    if earliest > due then due, binding = earliest, b end
    if earliest > now and b.held then refused = true end
  end
  if not reserved and #rates == 1 and rates[1].code == 'r' and rates[1].m <= now
      and rates[1].s - rates[1].tau > now then
    -- the schedule has no time before later, and the meter is idle (a missed time is taken
    -- at the rate, never in a burst): take a start time another task missed, if any (a
    -- time of the task-wide schedule: scores above 0)
    local late = redis.call('ZRANGEBYSCORE', KEYS[t.resv], '(0', now - missed, 'WITHSCORES',
                            'LIMIT', 0, 1)
    if #late > 0 then
      redis.call('ZREM', KEYS[t.resv], late[1])
      rates[1].held = true
      return now, nil, tonumber(late[2])
    end
  end
  if refused then
    if key_only and now - reserved <= missed then
      -- on time for its key's time, but the key's previous task started after its own
      -- (it waited for the task-wide rate): it waits for its key's meter, keeping its time
      local b = rates[#rates]
      return b.m - math.max(b.tau, slack), b, reserved
    end
    -- a meter refusing a time its schedule gave: the task is late, and takes the next free
    -- time of every schedule (its time is not made up)
    for _, b in ipairs(rates) do b.held = false end
  end
  for _, b in ipairs(rates) do  -- the schedules that gave it no time
    if not b.held and b.s - b.tau > due then due, binding = b.s - b.tau, b end
  end
  return due, binding, reserved
end

local function admit(e)
  local t = tasks[e.ti]
  local cfg = effective(t)
  local scopes, blocked = concurrency_scopes(e, t, cfg)
  local rates = rate_scopes(e, t, cfg)
  local due, binding, reserved = now, nil, nil
  if not blocked and #rates > 0 then due, binding, reserved = rate_due(e, t, cfg.gen, rates) end
  if blocked or due > now then
    local p = redis.call('XPENDING', KEYS[e.sidx], group, e.eid, e.eid, 1)
    if #p == 0 or p[1][2] ~= consumer then return 'x', '' end
    if e.bound and redis.call('HGET', KEYS[4], e.tid) ~= e.sidx .. e.eid then return 'a', '' end
    if e.payload == 0 and not e.suspect then return 'n', '' end
    if blocked then
      give_back(e, t, scopes, nil)
      redis.call('ZREM', KEYS[t.resv], e.tid)
      if blocked.member ~= '' then redis.call('SADD', KEYS[t.wkeys], blocked.member) end
      count(t.name, blocked.name)
      if e.suspect then
        hand_back(e, p[1])
        redis.call('RPUSH', KEYS[blocked.wait], e.tid .. '\n@')
        return 'h', blocked.code
      end
      local score = now + backstop
      defer(e, score)
      redis.call('RPUSH', KEYS[blocked.wait], e.tid .. '\n' .. fmt(score))
      return 'p', blocked.code
    end
    give_back(e, t, scopes, waiting_keeps(binding))
    local code = (binding or rates[1]).code
    if not (reserved and reserved > now) then
      -- the next free start time of each schedule that gave it none is this task's now;
      -- when its key's rate binds, only the key's: the task-wide rate is asked when it
      -- comes back, and its times meanwhile go to other keys (a negative score says so)
      local key_only = binding.code == 'R' and #rates > 1
      for _, b in ipairs(rates) do
        if not b.held and (b.code == 'R' or not key_only) then
          set_rate_state(b.key, cfg.gen, math.max(b.s, due) + b.i, b.m)
        end
      end
      redis.call('ZADD', KEYS[t.resv], fmt(key_only and -due or due), e.tid)
      count(t.name, binding.name)
    end
    if e.suspect then
      hand_back(e, p[1])
      return 'h', code
    end
    defer(e, due)
    return 'd', fmt(due) .. code
  end
  if #rates > 0 then
    if reserved then redis.call('ZREM', KEYS[t.resv], e.tid) end
    for _, b in ipairs(rates) do
      -- a reserved start was counted in the schedule when it was reserved
      set_rate_state(b.key, cfg.gen, b.held and b.s or b.s + b.i, b.m + b.i)
    end
  end
  local held = ''
  for _, s in ipairs(scopes) do
    redis.call('HSET', KEYS[s.run], e.tid, me)
    held = held .. s.code
  end
  if #scopes > 0 then
    redis.call('HSET', KEYS[7], e.tid, me .. '\n' .. held_suffix(t.name, e.key))
  end
  return 'a', held
end

for _, v in ipairs(cjson.decode(ARGV[pos])) do
  local e = {
    sidx = v[1], eid = v[2], tid = v[3], ti = v[4], bound = v[5] == 1, suspect = v[6] == 1,
    key = v[7], kbucket = v[8], krun = v[9], kwait = v[10], payload = v[11],
  }
  local code, detail = admit(e)
  out[#out + 1] = e.eid
  out[#out + 1] = code
  out[#out + 1] = detail
end
if counted then
  redis.call('PEXPIRE', KEYS[9], stats_ttl)
  redis.call('PEXPIRE', KEYS[10], stats_ttl)
end
return out
