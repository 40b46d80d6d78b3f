-- Admit a job to its tenant's queue, unless no worker serves the deployment, the queue is full,
-- or the backlog the job would wait behind cannot drain before its deadline. A request id
-- already queued, running or ended is not queued again (-5). Asked to (ARGV[14]), it also
-- refuses a job that would start in time but finish late (-6), for the frontend to cap.
local payload, now = ARGV[1], tonumber(ARGV[2])
local max_n, max_tok = tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, tenant, cls, cost = ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
local weight, deadline = tonumber(ARGV[9]), tonumber(ARGV[10])

-- KEYS[21], the request's fence: a retry with its Idempotency-Key took its place (shut_out.lua).
if KEYS[21] and redis.call('EXISTS', KEYS[21]) == 1 then return {-4, 0} end
-- A request id is queued once: one queued, running or ended already (KEYS[22], its final
-- marker) is not queued again. Its second submitter (a batch step that took over a line whose
-- first submission stalled, a cluster client's retry of this script) follows the first.
if redis.call('HEXISTS', JOBS, rid) == 1 or (KEYS[22] and redis.call('EXISTS', KEYS[22]) == 1)
then
  return {-5, 0}
end

if redis.call('ZCOUNT', WORKERS, now, '+inf') == 0 then return {-1, 0} end
-- max_n counts the jobs that wait for a slot: those the free slots take at once do not wait.
-- Reserved slots are free only to a tenant with nothing running (as workers hand them out).
local shared, reserved = live_slots(now)
local free = math.max(0, shared - redis.call('ZCARD', LEASES))
if depth_of('r:' .. tenant) <= 0 then free = free + reserved end
if depth_of('n') >= max_n + free or depth_of('tok') + cost > max_tok then return {-2, 0} end

-- Under weighted fair queuing the job waits for its tenant's own backlog and, from each other
-- waiting tenant, at most that tenant's fair share of the same time (batch also waits for all
-- interactive work). The deployment drains reserved tokens at the rate its workers measured.
local rate = live_sum(RATE, now)
if rate > 0 then
  local own = depth_of('t:' .. cls .. ':' .. tenant)
  local ahead = own
  for _, other in ipairs(redis.call('ZRANGE', READY[cls], 0, -1)) do
    if other ~= tenant then
      local w = tonumber(redis.call('HGET', VTC, 'w:' .. other) or '1')
      ahead = ahead + math.min(depth_of('t:' .. cls .. ':' .. other), own * w / weight)
    end
  end
  if cls ~= 'interactive' then ahead = ahead + depth_of('tok:interactive') end
  local wait = ahead / rate
  if now + wait > deadline then return {-3, math.ceil(wait * 1000)} end
  -- ARGV[14] '1' (a tenant that caps output): also its own tokens must be served before the
  -- deadline, at one slot's share of the rate. If not, nothing is queued (-6): the frontend
  -- caps max_tokens from the wait and the seconds a token takes (in microseconds) and asks again.
  if ARGV[14] == '1' then
    local shared_slots, reserved_slots = live_slots(now)
    local per_token = math.max(shared_slots + reserved_slots, 1) / rate
    if now + wait + cost * per_token > deadline then
      return {-6, math.ceil(wait * 1000), math.ceil(per_token * 1000000)}
    end
  end
end

local seq = redis.call('HINCRBY', VTC, 'seq', 1)
local member = string.format('%010d:%016d:', tonumber(tenant), seq) .. rid
redis.call('HSET', JOBS, rid, payload)
redis.call('HSET', META, rid,
  table.concat({tenant, cls, cost, weight, ARGV[10], member}, ' '))
redis.call('HSET', VTC, 'w:' .. tenant, weight)
redis.call('ZADD', QUEUE[cls], 0, member)
redis.call('ZADD', DEADLINES, deadline, rid)
if ARGV[13] and ARGV[13] ~= '' then redis.call('HSET', PREFIXES, rid, ARGV[13]) end
depth_add(cls, tenant, 1, cost)
backlog(cls, tenant)
wake(tonumber(ARGV[11]))
ledger_add(ARGV[12], 'admitted', 1)
return {0, 0}
