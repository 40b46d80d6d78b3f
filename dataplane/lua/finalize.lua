-- Finish a request exactly once: the first caller writes the terminal event and the usage
-- event; later callers (a worker racing the reaper, a cancel racing a finish) do nothing. The
-- tenant's virtual counter is settled from the reserved tokens to those used (ARGV[6]; -1 when
-- the job was never charged).
local FINAL, REPLY = KEYS[21], KEYS[22]
local rid = ARGV[4]
local won = redis.call('SET', FINAL, '1', 'NX', 'EX', ARGV[3])
if won then
  redis.call('XADD', REPLY, '*', 'e', ARGV[1])
  redis.call('EXPIRE', REPLY, ARGV[5])
  redis.call('XADD', USAGE, '*', 'u', ARGV[2])
  ledger_add(ARGV[7], 'finished', 1)
  ledger_add(ARGV[7], 'tokens', tonumber(ARGV[8]))
end
local m = redis.call('HGET', META, rid)
if m and redis.call('ZSCORE', LEASES, rid) then
  local j = meta_parse(m)
  local used = tonumber(ARGV[6])
  if used >= 0 then charge(j.cls, j.tenant, (used - j.cost) / j.weight) end
  running_add(j.tenant, -1)
  release(rid)
  redis.call('HDEL', JOBS, rid)
  redis.call('HDEL', META, rid)
  redis.call('HDEL', PREFIXES, rid)
  redis.call('ZREM', LEASES, rid)
end
if won then return 1 end
return 0
