-- Reserve the earliest moment a request and its estimated tokens fit (GCRA).
-- KEYS[1] the model's state; ARGV: rpm, tpm, tokens, max_wait, recovery_seconds
-- Returns the wait in seconds, negative when it would exceed max_wait (nothing reserved).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, max_wait, recovery = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local s = redis.call('HMGET', KEYS[1], 'rtat', 'ttat', 'factor', 'fts', 'hold')
local rtat, ttat = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local factor = tonumber(s[3]) or 1
local fts, hold = tonumber(s[4]) or now, tonumber(s[5]) or 0
factor = math.min(1, factor + (now - fts) / recovery)
local at = math.max(now, hold, rtat, ttat)
if at - now > max_wait then return tostring(-(at - now)) end
if rpm > 0 then rtat = at + 60 / (rpm * factor) end
if tpm > 0 then ttat = at + tokens * 60 / (tpm * factor) end
redis.call('HSET', KEYS[1], 'rtat', rtat, 'ttat', ttat, 'factor', factor, 'fts', now)
redis.call('EXPIRE', KEYS[1], 3600)
return tostring(at - now)
