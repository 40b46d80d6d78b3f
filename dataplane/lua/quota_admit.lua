local rpm, tpm, max_conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lease_ms, tokens, cost = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local budget, rid, seed = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local taken = ARGV[11] == '1'  -- the request was counted already (take_request)
local by = ARGV[12]  -- this admission's own token: a give-back naming it undoes it alone

local spent = tonumber(redis.call('GET', KEYS[4]))
if spent == nil then
  if seed < 0 then return {5, 0, 0, 0, 0} end
  spent = seed
  redis.call('SET', KEYS[4], seed, 'EX', 40 * 86400)
end

-- A request id that holds a reservation already (admitted again after its submission was cut
-- off, or this same call run twice by a cluster client retrying after a failover) is admitted
-- in its place: its slot, tokens, cost and request are not counted twice.
local prior = redis.call('HMGET', KEYS[5], 'tokens', 'cost')
local prior_tokens, prior_cost = tonumber(prior[1]) or 0, tonumber(prior[2]) or 0
local again = prior[1] ~= false
if again then
  taken = true
  spent = spent - prior_cost
end

local req_level = level(KEYS[1], rpm)
local tok_level = math.min(tpm, level(KEYS[2], tpm) + prior_tokens)
if req_level < 1 and not taken then
  return {1, 0, math.floor(tok_level), math.ceil((1 - req_level) * 60000 / rpm), 0}
end
if tok_level < tokens then
  local wait = -1
  if tokens <= tpm then wait = math.ceil((tokens - tok_level) * 60000 / tpm) end
  return {2, math.floor(req_level), math.floor(tok_level), 0, wait}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local slots = redis.call('ZCARD', KEYS[3])
if again and redis.call('ZSCORE', KEYS[3], rid) then slots = slots - 1 end
if slots >= max_conc then
  return {3, math.floor(req_level), math.floor(tok_level), 1000, 0}
end
if spent + cost > budget then
  return {4, math.floor(req_level), math.floor(tok_level), 0, 0}
end

local req_after = req_level
if not taken then
  req_after = req_level - 1
  redis.call('HSET', KEYS[1], 'level', req_after, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
redis.call('HSET', KEYS[2], 'level', tok_level - tokens, 'ts', now, 'cap', tpm)
redis.call('PEXPIRE', KEYS[2], 120000)
redis.call('ZADD', KEYS[3], now + lease_ms, rid)
redis.call('PEXPIRE', KEYS[3], lease_ms + 60000)
redis.call('INCRBY', KEYS[4], cost - prior_cost)
redis.call('HSET', KEYS[5], 'tokens', tokens, 'cost', cost, 'by', by)
redis.call('PEXPIRE', KEYS[5], lease_ms + 86400000)
local reset_requests = math.ceil((rpm - req_after) * 60000 / rpm)
local reset_tokens = math.ceil((tpm - tok_level + tokens) * 60000 / tpm)
return {0, math.floor(math.max(req_after, 0)), math.floor(tok_level - tokens), reset_requests,
        reset_tokens}
