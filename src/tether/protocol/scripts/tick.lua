--[[ tick: enqueue a schedule's ticks at most once each, whichever scheduler calls it.

Each queue keeps, per schedule, the last tick handled ("<tick ms>|<task id>"). A tick is
enqueued only if it is later than that marker, in this one atomic step, so two schedulers that
both believe they lead (a failover, a partition, a frozen leader that wakes up) can never
enqueue the same tick twice. Every tick handled is recorded in the schedule's tick log, with
how it ended: a skipped tick is never silent.

A schedule whose runs keep failing rests: the settle script of a run's final failure writes
its backoff state ("<failures in a row>|<retry after ms>|<forget at ms>"), and a tick due
before the retry-after time is skipped here ('backoff'), in the step that would enqueue it.

KEYS[1..3]  the queue's streams, highest priority first
KEYS[4]     index hash
KEYS[5]     delayed set
KEYS[6]     the queue's tick markers (hash: schedule name -> "<tick ms>|<task id>")
KEYS[7]     the queue's backoff states (hash: schedule name -> state, see above)
KEYS[8]     the schedule's tick log (stream)
ARGV[1]     schedule name
ARGV[2]     '1' if runs may overlap, '0' to skip a tick while the previous run is queued,
            retrying or running
ARGV[3]     stream index (1..3)
ARGV[4]     '1' when the schedule backs off after failures, '0' when it does not
ARGV[5]     tick log length (its oldest records are trimmed)
ARGV[6]     tick log ttl ms (from its last record)
ARGV[7..]   quadruples, ascending by tick: tick ms, task id, payload, and why a tick without
            a payload is skipped ('paused' or 'missed'; '' for a tick with a payload)

Returns one value per tick: 'enqueued', 'skipped' (advanced), 'overlap' (previous run still
active), 'backoff:<failures>:<retry after ms>' (resting after failures), or 'done' (an earlier
call already handled this tick).
]]
local name, overlap, sidx = ARGV[1], ARGV[2], tonumber(ARGV[3])
local gated, log_len, log_ttl = ARGV[4] == '1', ARGV[5], ARGV[6]
local marker = redis.call('HGET', KEYS[6], name)
local last_tick, last_id = -1, ''
if marker then
  local sep = string.find(marker, '|', 1, true)
  last_tick = tonumber(string.sub(marker, 1, sep - 1))
  last_id = string.sub(marker, sep + 1)
end

-- The backoff state, when it gates this schedule: nil when none, unreadable or forgotten.
local failures, retry_after = nil, nil
if gated then
  local state = redis.call('HGET', KEYS[7], name)
  if state then
    local f, r, forget = string.match(state, '^(%d+)|(%d+)|(%d+)$')
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if f and tonumber(forget) > now then
      failures, retry_after = f, tonumber(r)
    else
      redis.call('HDEL', KEYS[7], name)  -- a day without failures (or no state Tether wrote)
    end
  end
end

local logged = false
local function record(tick, outcome, id, extra)
  local fields = {'tick', string.format('%d', tick), 'outcome', outcome, 'id', id}
  if extra then
    fields[#fields + 1] = 'failures'
    fields[#fields + 1] = failures
    fields[#fields + 1] = 'until'
    fields[#fields + 1] = string.format('%d', retry_after)
  end
  redis.call('XADD', KEYS[8], 'MAXLEN', log_len, '*', unpack(fields))
  logged = true
end

local out = {}
for i = 7, #ARGV, 4 do
  local tick, id, payload, why = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if tick <= last_tick then
    out[#out + 1] = 'done'
  elseif payload == '' then
    last_tick = tick
    out[#out + 1] = 'skipped'
    record(tick, why ~= '' and why or 'skipped', '')
  elseif retry_after and tick < retry_after then
    last_tick = tick
    out[#out + 1] = 'backoff:' .. failures .. ':' .. string.format('%d', retry_after)
    record(tick, 'backoff', '', true)
  elseif overlap == '0' and last_id ~= '' and
      (redis.call('HEXISTS', KEYS[4], last_id) == 1 or redis.call('ZSCORE', KEYS[5], last_id)) then
    last_tick = tick
    out[#out + 1] = 'overlap'
    record(tick, 'overlap', last_id)
  else
    local eid = redis.call('XADD', KEYS[sidx], '*', 'm', payload)
    redis.call('HSET', KEYS[4], id, sidx .. eid)
    last_tick, last_id = tick, id
    out[#out + 1] = 'enqueued'
    record(tick, 'enqueued', id)
  end
end
if logged then redis.call('PEXPIRE', KEYS[8], log_ttl) end
redis.call('HSET', KEYS[6], name, string.format('%d', last_tick) .. '|' .. last_id)
return out
