--[[ limit_lib: functions shared by the limit_* scripts, prepended to each of them when they
are loaded (scripts/_limits.py). Not a script of its own.

Every limit script takes the same queue keys first:

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash (task id -> '<stream index><entry id>' while queued or running)
KEYS[5]     delayed set
KEYS[6]     scheduled payloads
KEYS[7]     held slots: task id -> '<holder>\n<JSON [task, limit key]>'
KEYS[8]     the runtime overrides of limits: task name -> JSON

and, where a script takes a task table, one argument: a JSON list with, per task, [name,
the declared limits (rate count, rate period ms, rate burst, concurrency, then the same per
limit key; 0 = no such limit), and the indexes in KEYS of the task's rate bucket, running
hash, waiting list, reservations and waiting-keys set]. A held-slot record ends with the
JSON [task, limit key] (made here, read back by the workers).

A slot's holder is a lease instance, not a worker name: '<consumer> <instance>', the
instance being new at every start of a worker. A worker restarted under the same name holds
the name's lease but is not the process that took its predecessor's slots, and may take them
back (see replaced). '' holds a slot for a task that no worker runs yet: woken from a
waiting list, or waiting in the delayed set for its rate token.

An override (written by limit_set) holds the fields rc, rp, rb, c, krc, krp, krb, kc that
replace the declared ones, and gen, raised by every change: a bucket written under an older
generation counts as empty, so a change starts from a fresh bucket.

A parked task waits in the delayed set with a score far ahead (the backstop) and in the
waiting list of the limit that held it back as '<task id>\n<that score>'. A list entry
whose score no longer matches the delayed set is stale (the task moved on) and is skipped.
A reclaimed entry (its worker died) is never moved out of its stream, which would lose the
count of its starts that quarantines a poison task: it waits in the pending list, handed to
'abandoned', listed as '<task id>\n@'; a wake-up gives it the slot and the next reclaim
pass starts it.
]]
local now_ms = nil
local function clock()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end

local function fmt(x)
  return string.format('%.3f', x)
end

local WAKE_SCAN = 100  -- list entries a wake-up looks at, at most, in one call

local function read_tasks(pos)
  local tasks = {}
  for i, v in ipairs(cjson.decode(ARGV[pos])) do
    tasks[i] = {
      name = v[1], declared = {v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]},
      bucket = v[10], run = v[11], wait = v[12], resv = v[13], wkeys = v[14],
      suffix = cjson.encode({v[1], ''}),
    }
  end
  return tasks, pos + 1
end

-- What a held-slot record says after its holder: the task and the limit key.
local function held_suffix(task, key)
  return cjson.encode({task, key})
end

-- The effective limits of a task: each field of its override wins over the declared one.
local FIELDS = {'rc', 'rp', 'rb', 'c', 'krc', 'krp', 'krb', 'kc'}
local function effective(t)
  if t.cfg then return t.cfg end
  local v = {}
  for j = 1, 8 do v[j] = t.declared[j] end
  local gen = 0
  local raw = redis.call('HGET', KEYS[8], t.name)
  if raw then
    local ok, o = pcall(cjson.decode, raw)
    if ok and type(o) == 'table' then
      for j, f in ipairs(FIELDS) do
        if type(o[f]) == 'number' then v[j] = o[f] end
      end
      if type(o.gen) == 'number' then gen = o.gen end
    end
  end
  local cfg = {gen = gen, c = v[4], kc = v[8], ri = 0, rt = 0, kri = 0, krt = 0}
  if v[1] > 0 and v[2] > 0 then
    cfg.ri = v[2] / v[1]
    cfg.rt = (math.max(v[3], 1) - 1) * cfg.ri
  end
  if v[5] > 0 and v[6] > 0 then
    cfg.kri = v[6] / v[5]
    cfg.krt = (math.max(v[7], 1) - 1) * cfg.kri
  end
  t.cfg = cfg
  return cfg
end

-- A rate limit's theoretical arrival times (GCRA), of its schedule and of its meter, each
-- at least now; a bucket of another generation is a fresh one.
local function rate_state(key, gen)
  local now = clock()
  local v = redis.call('GET', key)
  if v then
    local g, s, m = string.match(v, '^(%S+) (%S+) (%S+)$')
    if g and tonumber(g) == gen then
      return math.max(tonumber(s) or now, now), math.max(tonumber(m) or now, now)
    end
  end
  return now, now
end

local function set_rate_state(key, gen, schedule, meter)
  local ttl = math.ceil(math.max(schedule, meter) - clock()) + 1000
  redis.call('SET', key, gen .. ' ' .. fmt(schedule) .. ' ' .. fmt(meter), 'PX', ttl)
end

-- Move a parked task back into its stream, if it is still parked with this score.
local function unpark(tid, score)
  local s = redis.call('ZSCORE', KEYS[5], tid)
  if not s or tonumber(s) ~= score then return false end
  local v = redis.call('HGET', KEYS[6], tid)
  local sidx = v and tonumber(string.sub(v, 1, 1))
  if not (sidx == 1 or sidx == 2 or sidx == 3) then return false end
  local eid = redis.call('XADD', KEYS[sidx], '*', 'm', string.sub(v, 2))
  redis.call('HSET', KEYS[4], tid, sidx .. eid)
  redis.call('ZREM', KEYS[5], tid)
  redis.call('HDEL', KEYS[6], tid)
  return true
end

-- Whether a slot holder is an earlier incarnation of the worker name in me ('<consumer>
-- <instance>'): the same name, another instance (or a record from before instances: the
-- name alone). Only a worker holding the name's lease asks, so that incarnation is gone.
local function replaced(holder, me)
  if holder == me or holder == '' then return false end
  local name = string.match(me, '^(%S+)')
  return holder == name or string.sub(holder, 1, #name + 1) == name .. ' '
end

-- Whether a task is still queued or running: indexed, or a plain task whose stream entry
-- (named by its id, '<queue>:<stream index>-<entry id>') still exists; with delayed, also
-- when it is in the delayed set (a task waiting for its rate token keeps its slots there).
local function alive(tid, delayed)
  if redis.call('HEXISTS', KEYS[4], tid) == 1 then return true end
  if delayed and redis.call('ZSCORE', KEYS[5], tid) then return true end
  local sidx, eid = string.match(tid, ':([123])%-(%d+%-%d+)$')
  if not sidx then return false end
  return #redis.call('XRANGE', KEYS[tonumber(sidx)], eid, eid) > 0
end

local function split_entry(item)
  local nl = string.find(item, '\n', 1, true)
  if not nl then return nil, nil end
  local where = string.sub(item, nl + 1)
  if where == '@' then return string.sub(item, 1, nl - 1), where end
  return string.sub(item, 1, nl - 1), tonumber(where)
end

-- Wake parked tasks of one scope while it has free slots (limit 0: no limit any more, wake
-- up to WAKE_SCAN). A woken task gets the slot ahead of tasks not yet parked: it holds it
-- as '' (woken, not started) until a worker starts it or maintenance finds it gone.
-- Returns how many were woken.
local function wake(run_k, wait_k, limit, suffix, wkeys_k, member)
  local woken, seen = 0, 0
  while seen < WAKE_SCAN do
    local item = redis.call('LPOP', wait_k)
    if not item then
      -- the list just became empty: its key leaves the index (an empty one left it before)
      if seen > 0 and member ~= '' and wkeys_k then redis.call('SREM', wkeys_k, member) end
      break
    end
    if limit > 0 and redis.call('HLEN', run_k) >= limit then
      redis.call('LPUSH', wait_k, item)
      break
    end
    seen = seen + 1
    local tid, score = split_entry(item)
    local ok = false
    if score == '@' then
      -- a reclaimed entry waiting in the pending list: the next reclaim pass starts it
      ok = limit > 0 and not redis.call('HGET', run_k, tid) and alive(tid)
    elseif tid then
      ok = unpark(tid, score)
    end
    if ok then
      woken = woken + 1
      if limit > 0 then
        redis.call('HSET', run_k, tid, '')
        redis.call('HSET', KEYS[7], tid, '\n' .. suffix)
      end
    end
  end
  return woken
end
