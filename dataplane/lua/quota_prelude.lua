-- Buckets refill continuously: `limit` units per 60 s, never above `limit`. `now` is ARGV[1].
local now = tonumber(ARGV[1])
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local lvl, ts = tonumber(v[1]), tonumber(v[2])
  if lvl == nil then return cap end
  return math.min(cap, lvl + (now - ts) * cap / 60000)
end
