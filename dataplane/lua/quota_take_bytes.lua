-- Take ARGV[3] bytes from a tenant's large-body bucket (ARGV[2] bytes a minute), or refuse: a
-- body bigger than a whole minute's bytes passes only when the bucket is full. With ARGV[4] =
-- '1' they are taken whatever the level (a body already read), which may leave it below zero.
-- Returns 0 (taken), or the milliseconds until the bucket holds enough.
local cap, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local lvl = level(KEYS[1], cap)
local need = math.min(n, cap)
if ARGV[4] ~= '1' and lvl < need then return math.ceil((need - lvl) * 60000 / cap) end
redis.call('HSET', KEYS[1], 'level', lvl - n, 'ts', now)
-- Kept until it would be full again (a missing bucket is a full one).
redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil((cap - lvl + n) * 60000 / cap)))
return 0
