--[[ limit_set: change a task's limits at runtime, and let the tasks waiting for them be
admitted again under the new limits, in their order.

KEYS[1..8]  the queue keys (see limit_lib)
KEYS[9]     the task's reservations (task id -> its time; negated for a time of its key's
            schedule only, see limit_admit)
KEYS[10]    the task's waiting list
KEYS[11]    the task's waiting-keys set
KEYS[12..]  waiting lists of limit keys of the task (as listed in that set)
ARGV[1]     task name
ARGV[2]     'merge': the fields of ARGV[3] replace those of the override; 'replace': ARGV[3]
            becomes the override; '': leave it (a call that carries on releasing)
ARGV[3]     override fields as JSON (rc, rp, rb, c, krc, krp, krb, kc; a field the override
            lacks takes the declared value)
ARGV[4]     the most waiting tasks to release in this call
ARGV[5..]   the limit keys of KEYS[12..], in the same order

A changed override is written with gen one above the previous one, so every bucket of the
task starts afresh. Tasks waiting for a reserved rate token, and tasks parked for a slot, are
moved to the head of the delayed set (due now, in their order): the next promotion puts
them back in their streams and they are admitted again. Slots of running tasks stay.

Returns {released, 1 if waiting tasks (or waiting keys not passed here) are left for another
call else 0, the new gen}.
]]
local gen, current = 0, {}
local old = redis.call('HGET', KEYS[8], ARGV[1])
if old then
  local ok, o = pcall(cjson.decode, old)
  if ok and type(o) == 'table' then
    current = o
    if type(o.gen) == 'number' then gen = o.gen end
  end
end
if ARGV[2] ~= '' then
  local fields = cjson.decode(ARGV[3])
  if ARGV[2] == 'replace' then current = {} end
  for k, v in pairs(fields) do current[k] = v end
  gen = gen + 1
  current.gen = gen
  redis.call('HSET', KEYS[8], ARGV[1], cjson.encode(current))
end
local now = clock()
local budget = tonumber(ARGV[4])
local released, seq = 0, 0
local function release(tid, score)
  local s = redis.call('ZSCORE', KEYS[5], tid)
  if s and tonumber(s) == score then
    redis.call('ZADD', KEYS[5], 'XX', fmt(now + seq * 0.001), tid)
    seq = seq + 1
    released = released + 1
  end
end
-- The reservations in the order of their times: those of every schedule (scores above 0)
-- and those of the key's schedule only (the time negated), merged.
local all = redis.call('ZRANGEBYSCORE', KEYS[9], '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, budget)
-- ZRANGE ... BYSCORE REV rather than ZREVRANGEBYSCORE: the documented ACL rule allows zrange.
local keyed = redis.call('ZRANGE', KEYS[9], '(0', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, budget,
                         'WITHSCORES')
local i, j, taken = 1, 1, 0
while taken < budget and (i < #all or j < #keyed) do
  local tid, at
  if j >= #keyed or (i < #all and tonumber(all[i + 1]) <= -tonumber(keyed[j + 1])) then
    tid, at, i = all[i], tonumber(all[i + 1]), i + 2
  else
    tid, at, j = keyed[j], -tonumber(keyed[j + 1]), j + 2
  end
  release(tid, at)
  redis.call('ZREM', KEYS[9], tid)
  taken = taken + 1
end
budget = budget - taken
local function drain(list, member)
  while budget > 0 do
    local items = redis.call('LPOP', list, math.min(budget, 500))
    if not items then
      if member then redis.call('SREM', KEYS[11], member) end
      return
    end
    budget = budget - #items
    for _, item in ipairs(items) do
      local tid, score = split_entry(item)
      if tid then release(tid, score) end
    end
  end
end
drain(KEYS[10], nil)
for i = 12, #KEYS do drain(KEYS[i], ARGV[i - 7]) end
local left = 0
if redis.call('ZCARD', KEYS[9]) > 0 or redis.call('LLEN', KEYS[10]) > 0
    or redis.call('SCARD', KEYS[11]) > 0 then
  left = 1
end
return {released, left, gen}
