--[[ limit_reclaim: take back the concurrency slots of workers that died, and the slots held
for tasks no worker runs that are gone (cancelled before a worker started them). No lock:
each slot is re-checked here, atomically, so any number of workers may run this at once.

A slot is held by a lease instance ('<consumer> <instance>', see limit_lib), not by a name:
a worker restarted under the same name finds its lease held (by itself) but the slots of
its earlier incarnations are not its own, and it takes them back like a dead worker's.

KEYS[1..8]  the queue keys (see limit_lib)
KEYS[9..]   the limit keys named by the task table and the candidates, and the holders'
            leases on this queue
ARGV[1]     the caller's slot holder ('<consumer> <instance>'): it holds that name's lease
ARGV[2]     the task table (see limit_lib), then 7 values per candidate:
  task id, its held-slot record as read (it must still be exactly that), the index in KEYS
  of its holder's lease (0 for a slot held for a task no worker runs), the task's index
  in the table, the limit key ('' none), and the key scope's running hash and waiting list
  (indexes in KEYS, 0 when no key)

A slot is taken back only if its record is unchanged and its holder's lease is missing (or
its holder is an earlier incarnation of the caller's name), or, for a slot held for a task
no worker runs (woken, or waiting for its rate token), the task is neither queued, in the
delayed set nor running any more. A dead holder's slot stays with its task while the task's
entry exists (it is reclaimed and run again, and must find its slot, not lose it to a
waiter): it becomes the task's as a woken one. Otherwise the slot is freed and wakes the
next parked task of its limit.

Returns {slots freed, slots kept for their tasks' next run}.
]]
local me = ARGV[1]
local tasks, pos = read_tasks(2)
local freed, kept = 0, 0
while pos <= #ARGV do
  local tid, expected, lk = ARGV[pos], ARGV[pos + 1], tonumber(ARGV[pos + 2])
  local ti, key = tonumber(ARGV[pos + 3]), ARGV[pos + 4]
  local krun, kwait = tonumber(ARGV[pos + 5]), tonumber(ARGV[pos + 6])
  pos = pos + 7
  local nl = string.find(expected, '\n', 1, true)
  if nl and redis.call('HGET', KEYS[7], tid) == expected then
    local holder = string.sub(expected, 1, nl - 1)
    local gone
    if holder == '' then
      gone = not alive(tid, true)
    else
      gone = replaced(holder, me) or (lk > 0 and redis.call('EXISTS', KEYS[lk]) == 0)
    end
    if gone and holder ~= '' and alive(tid) then
      for _, run in ipairs({KEYS[tasks[ti].run], krun > 0 and KEYS[krun] or nil}) do
        if redis.call('HGET', run, tid) == holder then redis.call('HSET', run, tid, '') end
      end
      redis.call('HSET', KEYS[7], tid, string.sub(expected, nl))
      kept = kept + 1
    elseif gone then
      local t = tasks[ti]
      local cfg = effective(t)
      if redis.call('HGET', KEYS[t.run], tid) == holder then
        redis.call('HDEL', KEYS[t.run], tid)
        wake(KEYS[t.run], KEYS[t.wait], cfg.c, t.suffix, KEYS[t.wkeys], '')
      end
      if key ~= '' and krun > 0 and redis.call('HGET', KEYS[krun], tid) == holder then
        redis.call('HDEL', KEYS[krun], tid)
        wake(KEYS[krun], KEYS[kwait], cfg.kc, held_suffix(tasks[ti].name, key), KEYS[t.wkeys],
             key)
      end
      redis.call('HDEL', KEYS[7], tid)
      freed = freed + 1
    end
  end
end
return {freed, kept}
