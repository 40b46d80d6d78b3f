-- An Idempotency-Key's first use (inference.idempotency.Idempotency.begin).
-- KEYS[1]: the key's record hash. ARGV: the request body's digest, the seconds a record
-- lives before its request is bound, the claiming request's id. Returns {'new'} (the key is
-- claimed for this request), {'mismatch'} (used with another body) or {'seen', the record's
-- fields}.
local body = redis.call('HGET', KEYS[1], 'body')
if not body then
  redis.call('HSET', KEYS[1], 'body', ARGV[1], 'owner', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return {'new'}
end
if body ~= ARGV[1] then return {'mismatch'} end
return {'seen', redis.call('HGETALL', KEYS[1])}
