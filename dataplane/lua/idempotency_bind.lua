-- Bind an Idempotency-Key to the request that claimed it (Idempotency.bind), or mark it
-- queued (Idempotency.queued): only while that request still owns the key.
-- KEYS[1]: the key's record hash. ARGV: the owner's request id, the seconds the record
-- lives, then field, value pairs. Returns 1, or 0 when another request owns the key now.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
