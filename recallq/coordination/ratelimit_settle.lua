-- Correct the token reservation with what the call really used.
-- KEYS[1] the model's state; ARGV: tpm, token_delta (actual - estimated)
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'ttat', 'factor')
if not s[1] or tpm <= 0 then return 0 end
local factor = tonumber(s[2]) or 1
redis.call('HSET', KEYS[1], 'ttat', tonumber(s[1]) + delta * 60 / (tpm * factor))
return 1
