-- A judge call enters unless its run is cancelled or has spent its budget, registering as in
-- flight. A run found over budget is closed here, atomically, for every worker.
-- KEYS: the run's cancel flag, its in-flight zset, its spend hash
-- ARGV: token, expiry (unix seconds), budget in USD ('' for none), budget in tokens ('' for none)
-- Returns 'ok', the cancel flag's value ('1': a user cancelled; 'budget'), or 'unseeded' when
-- the run has a budget but Redis holds no spend for it yet (the caller seeds it, then asks again).
-- A resumed run's raised budget is in its spend hash and wins over the caller's (read once).
local flag = redis.call('GET', KEYS[1])
if flag then return flag end
local raised = redis.call('HMGET', KEYS[3], 'budget_usd', 'budget_tokens')
if raised[1] then ARGV[3] = raised[1] end
if raised[2] then ARGV[4] = raised[2] end
if ARGV[3] ~= '' or ARGV[4] ~= '' then
  if redis.call('EXISTS', KEYS[3]) == 0 then return 'unseeded' end
  local spent = redis.call('HMGET', KEYS[3], 'usd', 'tokens')
  local over_usd = ARGV[3] ~= '' and tonumber(spent[1] or '0') >= tonumber(ARGV[3])
  local over_tokens = ARGV[4] ~= '' and tonumber(spent[2] or '0') >= tonumber(ARGV[4])
  if over_usd or over_tokens then
    redis.call('SET', KEYS[1], 'budget', 'EX', 30 * 86400)
    return 'budget'
  end
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
return 'ok'
