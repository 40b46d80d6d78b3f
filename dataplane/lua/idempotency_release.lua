-- Free an Idempotency-Key whose request was refused or failed (Idempotency.release), unless
-- another request took it over meanwhile. A record without an owner predates owners.
-- KEYS[1]: the key's record hash. ARGV[1]: the request id that releases it. Returns 1 if freed.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
