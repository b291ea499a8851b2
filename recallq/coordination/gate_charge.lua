-- Add an answered call's cost and tokens to its run's spend (only once the spend is seeded:
-- a spend lost with Redis's data is seeded again from the database by the next call).
-- KEYS: the run's spend hash; ARGV: usd, tokens
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBYFLOAT', KEYS[1], 'usd', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
redis.call('EXPIRE', KEYS[1], 30 * 86400)
return 1
