--[[ claim: take over pending entries whose owner has no lease. No lock: every check and
the claim happen in this one atomic step, so two claimers can never both win an entry.

KEYS[1]     the stream
KEYS[2..]   lease keys of the owners named below
ARGV[1]     group
ARGV[2]     consumer (the claimer)
ARGV[3..]   triples: entry id, expected owner, index of the owner's lease in KEYS
            (0 for the reserved consumer 'abandoned', which is always claimable)

An entry is claimed only if it is still pending, still owned by the expected owner, and
that owner's lease is missing. The claim keeps the delivery count: for a reclaimed entry
the count means "started", and the claimer raises it (script 'start') only when it really
starts the task, so tasks that were merely buffered beside a poison task are not pushed
toward quarantine. The same script resumes a restarted worker's own entries (expected owner
= itself, lease index 0).

Returns flat: entry id, payload (nil when the entry has no 'm' field), delivery count,
previous owner, for each claimed entry.
]]
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 3 do
  local eid, owner, lk = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local p = redis.call('XPENDING', stream, group, eid, eid, 1)
  if #p == 1 and p[1][2] == owner and (lk == 0 or redis.call('EXISTS', KEYS[lk]) == 0) then
    local r = redis.call('XCLAIM', stream, group, me, 0, eid, 'RETRYCOUNT', p[1][4])
    if #r > 0 and r[1] then
      local payload = false
      local f = r[1][2]
      if f then
        for j = 1, #f, 2 do
          if f[j] == 'm' then payload = f[j + 1]; break end
        end
      end
      out[#out + 1] = eid
      out[#out + 1] = payload
      out[#out + 1] = p[1][4]
      out[#out + 1] = owner
    else
      -- the entry was deleted from the stream but left in the PEL (Redis 6.2): nothing to run
      redis.call('XACK', stream, group, eid)
    end
  end
end
return out
