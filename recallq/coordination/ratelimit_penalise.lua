-- A provider 429: hold every caller for Retry-After and halve the rate.
-- KEYS[1] the model's state; ARGV: hold_seconds, min_factor
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local s = redis.call('HMGET', KEYS[1], 'hold', 'factor')
local hold = math.max(tonumber(s[1]) or 0, now + tonumber(ARGV[1]))
local factor = math.max(tonumber(ARGV[2]), (tonumber(s[2]) or 1) * 0.5)
redis.call('HSET', KEYS[1], 'hold', hold, 'factor', factor, 'fts', now)
redis.call('EXPIRE', KEYS[1], 3600)
return 1
