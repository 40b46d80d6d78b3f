-- The autoscaling signal's scale-down hysteresis (dataplane.autoscale.Autoscaler).
-- KEYS[1]: the state hash. ARGV: raw, now, window seconds. Up at once; down only after raw has
-- stayed below the current value for the whole window, and then to the highest raw seen in it.
local raw, now, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local desired = tonumber(redis.call('HGET', KEYS[1], 'desired') or '')
if desired == nil or raw >= desired then
  redis.call('HSET', KEYS[1], 'desired', raw, 'below_since', '', 'window_max', raw)
  return raw
end
local since = tonumber(redis.call('HGET', KEYS[1], 'below_since') or '')
local peak = tonumber(redis.call('HGET', KEYS[1], 'window_max') or '') or raw
if since == nil then
  redis.call('HSET', KEYS[1], 'below_since', now, 'window_max', raw)
  return desired
end
peak = math.max(peak, raw)
if now - since >= window then
  redis.call('HSET', KEYS[1], 'desired', peak, 'below_since', now, 'window_max', raw)
  return peak
end
redis.call('HSET', KEYS[1], 'window_max', peak)
return desired
