-- Per-model circuit breaker: every state change of recallq.coordination.breaker, atomically.
--
-- KEYS[1]  recallq:breaker:{model}, a hash. Fields:
--   closed:      e<i>/n<i>/f<i>  bucket i of the sliding window: its epoch (bucket number since
--                               1970), calls and failures counted in it
--                consec         transient failures in a row
--                last_failure   when the latest failure was recorded
--                reason         the latest failure's reason
--   open/half-open (status present; the window is gone):
--                status         'open' | 'half_open' (a probe is out)
--                since          when it opened
--                next_probe_at  open: when a probe may go; half_open: the probe's deadline,
--                               after which its holder counts as dead and another may go
--                cool_down      the current cool-down, doubled by each failed probe
--                failures       failures in the window when it opened, +1 per failed probe
--                reason         the latest failure's reason
--                probe          the token of the probe that is out
-- KEYS[2]  recallq:breaker-wakes, a sorted set of breaker keys scored by when workers should
--          look at them (recallq.execution.breaker_wakes): when the next probe may go (an item
--          is sent to be it), when a probe's deadline passes, and now when it closes (the
--          items that waited are sent at once, not when their leases run out)
--
-- ARGV[1]  command: 'before' | 'record' | 'release'
-- ARGV[2]  now, unix seconds from the caller's clock (so tests can fake it; hosts' clocks must
--          agree to well within the window, as NTP gives)
-- ARGV[3..11] settings: window_s, buckets, min_calls, failure_ratio, consecutive_failures,
--          base_cool_down, max_cool_down, probe_timeout, linger
-- before:  ARGV[12] a fresh token, used if this caller becomes the probe
--          returns {'closed'} | {'probe', token} | {'open', until, reason, since}
-- record:  ARGV[12] 'ok' | 'fail', ARGV[13] reason, ARGV[14] cool-down asked for by the
--          provider (Retry-After, already capped) or '', ARGV[15] the caller's probe token or '',
--          ARGV[16] successes the caller saw before this outcome and held, counted first,
--          ARGV[17] when the last of them was seen ('' for none): they end the failures in a
--          row only if no failure was recorded since (field last_failure)
--          returns what happened: 'counted' | 'opened' | 'closed' | 'reopened' | 'ignored'
-- release: ARGV[12] the token of a probe whose call was never sent: open again, probe now

local key = KEYS[1]
local command = ARGV[1]
local now = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local buckets = tonumber(ARGV[4])
local min_calls = tonumber(ARGV[5])
local failure_ratio = tonumber(ARGV[6])
local consecutive = tonumber(ARGV[7])
local base_cool_down = tonumber(ARGV[8])
local max_cool_down = tonumber(ARGV[9])
local probe_timeout = tonumber(ARGV[10])
local linger = tonumber(ARGV[11])
local wakes = KEYS[2]

-- The key outlives the last moment its content matters by `linger`, then idle models vanish.
local function expire(horizon)
  redis.call('PEXPIRE', key, math.ceil((math.max(horizon - now, 0) + linger) * 1000))
end

if command == 'before' then
  local s = redis.call('HMGET', key, 'status', 'next_probe_at', 'reason', 'since')
  if not s[1] then
    return {'closed'}
  end
  local next_probe_at = tonumber(s[2]) or 0
  if now < next_probe_at then
    -- read only: while open, asking costs one round trip and no write. While a probe is out
    -- its answer may come any moment: ask again after the base cool-down, not its deadline.
    local ask_at = next_probe_at
    if s[1] == 'half_open' then ask_at = math.min(ask_at, now + base_cool_down) end
    return {'open', tostring(ask_at), s[3] or '', s[4] or ARGV[2]}
  end
  -- the cool-down has passed (or the last probe's holder went silent): this caller probes
  local deadline = now + probe_timeout
  redis.call('HSET', key, 'status', 'half_open', 'probe', ARGV[12], 'next_probe_at', deadline)
  redis.call('ZADD', wakes, deadline, key)
  expire(deadline)
  return {'probe', ARGV[12]}
end

if command == 'release' then
  local s = redis.call('HMGET', key, 'status', 'probe')
  if s[1] == 'half_open' and s[2] == ARGV[12] then
    redis.call('HSET', key, 'status', 'open', 'next_probe_at', now)
    redis.call('HDEL', key, 'probe')
    redis.call('ZADD', wakes, now, key)
    return 'released'
  end
  return 'ignored'
end

if command ~= 'record' then
  return redis.error_reply('unknown breaker command ' .. tostring(command))
end

local failed = ARGV[12] == 'fail'
local reason = ARGV[13]
local asked_cool_down = tonumber(ARGV[14])
local token = ARGV[15]
local held = tonumber(ARGV[16]) or 0
local held_last = tonumber(ARGV[17])

local s = redis.call('HMGET', key, 'status', 'probe', 'cool_down')
if s[1] then
  -- Open or half-open: only the current probe's report counts. Calls that started before the
  -- breaker opened (and probes that timed out) report into the void.
  if token == '' or token ~= s[2] then
    return 'ignored'
  end
  if not failed then
    redis.call('DEL', key)  -- closed: window, consecutive count and cool-down all start afresh
    redis.call('ZADD', wakes, now, key)
    return 'closed'
  end
  local cool_down = asked_cool_down
  if not cool_down then
    cool_down = math.min((tonumber(s[3]) or base_cool_down) * 2, max_cool_down)
  end
  local next_probe_at = now + cool_down
  redis.call('HSET', key, 'status', 'open', 'next_probe_at', next_probe_at,
    'cool_down', cool_down, 'reason', reason)
  redis.call('HDEL', key, 'probe')
  redis.call('HINCRBY', key, 'failures', 1)
  redis.call('ZADD', wakes, next_probe_at, key)
  expire(next_probe_at)
  return 'reopened'
end

-- Closed: count the outcome in its bucket of the sliding window.
local epoch = math.floor(now / (window / buckets))
local slot = epoch % buckets
local e, n, f = 'e' .. slot, 'n' .. slot, 'f' .. slot
if tonumber(redis.call('HGET', key, e)) ~= epoch then
  redis.call('HSET', key, e, epoch, n, 0, f, 0)
end
redis.call('HINCRBY', key, n, 1 + held)
-- a success ends the failures in a row: this one, or a held one seen after the last failure
-- (held ones seen before it, with other workers' failures since, do not)
local ended_run = not failed
if failed and held > 0 and held_last then
  ended_run = held_last >= (tonumber(redis.call('HGET', key, 'last_failure')) or 0)
end
if ended_run then
  redis.call('HSET', key, 'consec', 0)
end
if not failed then
  expire(now)
  return 'counted'
end
redis.call('HINCRBY', key, f, 1)
redis.call('HSET', key, 'reason', reason, 'last_failure', now)
local in_a_row = redis.call('HINCRBY', key, 'consec', 1)

local fields = {}
for i = 0, buckets - 1 do
  fields[#fields + 1] = 'e' .. i
  fields[#fields + 1] = 'n' .. i
  fields[#fields + 1] = 'f' .. i
end
local w = redis.call('HMGET', key, unpack(fields))
local calls, failures = 0, 0
for i = 0, buckets - 1 do
  local bucket_epoch = tonumber(w[3 * i + 1])
  if bucket_epoch and bucket_epoch > epoch - buckets then
    calls = calls + (tonumber(w[3 * i + 2]) or 0)
    failures = failures + (tonumber(w[3 * i + 3]) or 0)
  end
end

if in_a_row >= consecutive or (calls >= min_calls and failures >= failure_ratio * calls) then
  local cool_down = asked_cool_down or base_cool_down
  local next_probe_at = now + cool_down
  redis.call('DEL', key)
  redis.call('HSET', key, 'status', 'open', 'since', now, 'next_probe_at', next_probe_at,
    'cool_down', cool_down, 'failures', math.max(failures, in_a_row), 'reason', reason)
  redis.call('ZADD', wakes, next_probe_at, key)
  expire(next_probe_at)
  return 'opened'
end
expire(now)
return 'counted'
