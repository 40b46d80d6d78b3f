-- Settle reservations to actual use, once each: unused tokens go back to the bucket, the budget
-- is charged the actual cost, and the concurrency slot is freed. One call covers one tenant's
-- requests admitted in one month: KEYS = tpm, inflight, spent, then one held key per request;
-- ARGV = now, then (request id, used tokens, used cost, admission) per request. A reservation
-- already settled is skipped, and so is one another admission of the request id holds when
-- `admission` names one (a give-back whose admission's answer was lost: the id may have been
-- admitted again since); returns how many were settled here.
local now = tonumber(ARGV[1])
local settled = 0
for i = 4, #KEYS do
  local a = 2 + (i - 4) * 4
  local held = redis.call('HMGET', KEYS[i], 'tokens', 'cost', 'by')
  if held[1] ~= false and (ARGV[a + 3] == '' or ARGV[a + 3] == held[3]) then
    local used_tokens, used_cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local refund = tonumber(held[1]) - used_tokens
    if refund > 0 then
      local v = redis.call('HMGET', KEYS[1], 'level', 'ts', 'cap')
      local lvl, ts, cap = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
      if lvl ~= nil then
        lvl = math.min(cap, lvl + (now - ts) * cap / 60000 + refund)
        redis.call('HSET', KEYS[1], 'level', lvl, 'ts', now)
      end
    end
    if redis.call('EXISTS', KEYS[3]) == 1 then
      redis.call('INCRBY', KEYS[3], used_cost - tonumber(held[2]))
    end
    redis.call('ZREM', KEYS[2], ARGV[a])
    redis.call('DEL', KEYS[i])
    settled = settled + 1
  end
end
return settled
