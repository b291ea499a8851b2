-- One submission of an API key, if its rate allows (GCRA: `interval` seconds apart on
-- average, up to `burst` at once). KEYS[1]: the key's theoretical arrival time.
-- ARGV: interval (s), burst. Returns 0 when allowed, else the seconds to wait (as a string).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local next_tat = tat + interval
local wait = next_tat - now - interval * burst
if wait > 0 then return tostring(wait) end
redis.call('SET', KEYS[1], tostring(next_tat), 'PX', math.ceil((next_tat - now) * 1000) + 1000)
return 0
