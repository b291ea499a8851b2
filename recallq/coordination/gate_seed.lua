-- Seed a run's spend with what the database recorded, unless another worker did first.
-- KEYS: the run's spend hash; ARGV: usd, tokens
redis.call('HSETNX', KEYS[1], 'usd', ARGV[1])
redis.call('HSETNX', KEYS[1], 'tokens', ARGV[2])
redis.call('EXPIRE', KEYS[1], 30 * 86400)
return 1
