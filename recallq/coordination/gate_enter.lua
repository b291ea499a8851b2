-- A judge call enters unless its run is cancelled, registering as in flight.
-- KEYS: the run's cancel flag, its in-flight zset; ARGV: token, expiry (unix seconds)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
return 1
