-- Put a job whose lease lapsed before it started back at the head of its tenant's queue. With a
-- worker (ARGV[4]), put back instead a job handed to that worker that it has not taken, whatever
-- its lease. With ARGV[5] 'resume', the worker that runs the job hands it on: the job (ARGV[6],
-- now carrying what it produced) goes back to the queue for another worker to carry on.
local rid, now, from, mode = ARGV[1], tonumber(ARGV[2]), ARGV[4] or '', ARGV[5] or ''
local lease = redis.call('ZSCORE', LEASES, rid)
if not lease then return 0 end
if mode == 'resume' then
  local holder = redis.call('HGET', HOLDERS, rid)
  if holder and holder ~= from then return 0 end
  redis.call('HSET', JOBS, rid, ARGV[6])
elseif from ~= '' then
  local handed = redis.call('HGET', HANDOFFS, rid)
  if not handed or string.match(handed, '^%d+ (%S+)$') ~= from then return 0 end
elseif tonumber(lease) >= now then
  return 0
end
local m = redis.call('HGET', META, rid)
redis.call('ZREM', LEASES, rid)
release(rid)
if not m then return 0 end
local j = meta_parse(m)
running_add(j.tenant, -1)
charge(j.cls, j.tenant, -j.cost / j.weight)
redis.call('ZADD', QUEUE[j.cls], 0, j.member)
redis.call('ZADD', DEADLINES, j.deadline, rid)
depth_add(j.cls, j.tenant, 1, j.cost)
backlog(j.cls, j.tenant)
wake(tonumber(ARGV[3]))
return 1
