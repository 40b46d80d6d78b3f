-- Make sure a request that has not reached its deployment's queue never will (a retry with
-- its Idempotency-Key runs in its place): FrontDoor.shut_out. The enqueue script refuses a
-- request whose fence is set.
-- KEYS: the deployment's jobs hash, the request's final marker, the request's fence.
-- ARGV: the request id, the fence's lifetime in seconds.
-- Returns 1 when the request is queued, running or ended (no fence set), else 0 (fenced).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
redis.call('SET', KEYS[3], '1', 'EX', ARGV[2])
return 0
