-- End a request that is still queued: remove it and finish it here, so it never runs and still
-- gets its one usage record. With ARGV[2] = '1' the request is also flagged cancelled and its
-- workers told, so one already running is aborted. With ARGV[10] = '1' a request that is not
-- queued, running or ended (its frontend failed before or while queueing it) is finished here
-- too, and counted admitted in the ledger as the enqueue would have.
local FINAL, REPLY, FLAG = KEYS[21], KEYS[22], KEYS[23]
local rid = ARGV[1]
if ARGV[2] == '1' then
  redis.call('SET', FLAG, '1', 'EX', ARGV[3])
  redis.call('SPUBLISH', ARGV[7], rid)
end
local m = redis.call('HGET', META, rid)
if m and redis.call('ZSCORE', LEASES, rid) then return 0 end
if m then
  unqueue(rid, meta_parse(m))
  redis.call('HDEL', JOBS, rid)
  redis.call('HDEL', META, rid)
  redis.call('HDEL', PREFIXES, rid)
elseif ARGV[10] ~= '1' then
  return 0
end
if redis.call('SET', FINAL, '1', 'NX', 'EX', ARGV[3]) then
  if not m then ledger_add(ARGV[8], 'admitted', 1) end
  redis.call('XADD', REPLY, '*', 'e', ARGV[4])
  redis.call('EXPIRE', REPLY, ARGV[6])
  redis.call('XADD', USAGE, '*', 'u', ARGV[5])
  ledger_add(ARGV[8], 'finished', 1)
  ledger_add(ARGV[8], 'tokens', tonumber(ARGV[9]))
  return 1
end
return 0
