--[[ limit_release: give back the concurrency slots of entries this consumer settled or
handed off, and wake the next parked task of each slot freed. Fenced: a slot is released
only if this lease instance still holds it, so a worker that wakes late, after its slot was
reclaimed and given to another task (or taken over by a restart under its name), frees
nothing.

KEYS[1..8]  the queue keys (see limit_lib)
KEYS[9..]   the limit keys named by the task table and the entries
ARGV[1]     the slot holder: this worker's lease instance, '<consumer> <instance>'
ARGV[2]     the task table (see limit_lib)
ARGV[3]     the entries, a JSON list of [task id, the task's index in the table, the limit
            key ('' none), the scopes it was admitted to ('c' the task's, 'C' the key's),
            the key scope's running hash and waiting list (indexes in KEYS, 0: no key)]

Returns the number of slots released.
]]
local me = ARGV[1]
local tasks, pos = read_tasks(2)
local released = 0
for _, v in ipairs(cjson.decode(ARGV[pos])) do
  local tid, ti, key, scopes, krun, kwait = v[1], v[2], v[3], v[4], v[5], v[6]
  local t = tasks[ti]
  local cfg = effective(t)
  local mine = false
  if string.find(scopes, 'c', 1, true) and redis.call('HGET', KEYS[t.run], tid) == me then
    redis.call('HDEL', KEYS[t.run], tid)
    mine = true
    released = released + 1
    wake(KEYS[t.run], KEYS[t.wait], cfg.c, t.suffix, KEYS[t.wkeys], '')
  end
  if string.find(scopes, 'C', 1, true) and krun > 0 and redis.call('HGET', KEYS[krun], tid) == me then
    redis.call('HDEL', KEYS[krun], tid)
    mine = true
    released = released + 1
    wake(KEYS[krun], KEYS[kwait], cfg.kc, held_suffix(t.name, key), KEYS[t.wkeys], key)
  end
  -- it held a slot here, so the held-slot record is this holder's
  if mine then redis.call('HDEL', KEYS[7], tid) end
end
return released
