-- A retry takes over an Idempotency-Key whose request will never answer (it failed, or a
-- fence keeps it from ever being queued; Idempotency.replayed_or_claimed).
-- KEYS[1]: the key's record hash. ARGV: the request id and deployment the record was seen
-- bound to, the retry's request id, the seconds the record lives before its new request
-- is bound. Returns 1, or 0 when the record changed since it was read.
if redis.call('HGET', KEYS[1], 'rid') ~= ARGV[1]
  or redis.call('HGET', KEYS[1], 'deployment') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], 'rid', 'deployment', 'model', 'version', 'created', 'deadline',
  'bound', 'queued')
redis.call('HSET', KEYS[1], 'owner', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
