-- What every queue script starts with: KEYS[1..20] named as dataplane.keys.DeploymentKeys
-- orders them, and the helpers the scripts share.
local JOBS, META, QI, QB, RI, RB, VTC, DEADLINES, DEPTH, LEASES, WORKERS, WAKE, RATE, SLOTS,
  USAGE, LEDGER, PREFIXES, HOLDERS, HELD, HANDOFFS = unpack(KEYS, 1, 20)

-- Per admission hour, what the data plane admitted and finished: reconciliation compares it
-- with the usage records and the admission reservations.
local function ledger_add(hour, field, n)
  redis.call('HINCRBY', LEDGER, hour .. ':' .. field, n)
end
local QUEUE = {interactive = QI, batch = QB}
local READY = {interactive = RI, batch = RB}

local function meta_parse(m)
  local t, c, cost, w, d, member = string.match(m, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  return {tenant = t, cls = c, cost = tonumber(cost), weight = tonumber(w),
          deadline = tonumber(d), member = member}
end

-- A tenant's jobs are one lexicographic range of its class's queue.
local function tenant_range(tenant)
  local t = tonumber(tenant)
  return '[' .. string.format('%010d:', t), '(' .. string.format('%010d;', t)
end

local function counter_key(cls, tenant) return 'c:' .. cls .. ':' .. tenant end

-- A tenant starts waiting: lifted to the class's virtual clock, so idle time earns no credit.
local function backlog(cls, tenant)
  if redis.call('ZSCORE', READY[cls], tenant) then return end
  local counter = tonumber(redis.call('HGET', VTC, counter_key(cls, tenant)) or '0')
  local clock = tonumber(redis.call('HGET', VTC, 'v:' .. cls) or '0')
  if clock > counter then
    counter = clock
    redis.call('HSET', VTC, counter_key(cls, tenant), counter)
  end
  redis.call('ZADD', READY[cls], counter, tenant)
end

-- One of a tenant's jobs left the queue: it stays among the waiting only if it has more.
local function unbacklog_if_empty(cls, tenant)
  local lo, hi = tenant_range(tenant)
  if #redis.call('ZRANGEBYLEX', QUEUE[cls], lo, hi, 'LIMIT', 0, 1) == 0 then
    redis.call('ZREM', READY[cls], tenant)
  end
end

local function charge(cls, tenant, delta)
  redis.call('HINCRBYFLOAT', VTC, counter_key(cls, tenant), delta)
  if redis.call('ZSCORE', READY[cls], tenant) then
    redis.call('ZINCRBY', READY[cls], delta, tenant)
  end
end

local function depth_add(cls, tenant, n, tokens)
  redis.call('HINCRBY', DEPTH, 'n', n)
  redis.call('HINCRBY', DEPTH, 'tok', tokens)
  redis.call('HINCRBY', DEPTH, 'tok:' .. cls, tokens)
  redis.call('HINCRBY', DEPTH, 't:' .. cls .. ':' .. tenant, tokens)
end

local function depth_of(field) return tonumber(redis.call('HGET', DEPTH, field) or '0') end

-- Remove a queued job from its queue (not from JOBS/META).
local function unqueue(rid, j)
  redis.call('ZREM', QUEUE[j.cls], j.member)
  redis.call('ZREM', DEADLINES, rid)
  depth_add(j.cls, j.tenant, -1, -j.cost)
  unbacklog_if_empty(j.cls, j.tenant)
end

-- Sum a per-worker hash over the workers whose heartbeat has not lapsed.
local function live_sum(hash, now)
  local total = 0
  local values = redis.call('HGETALL', hash)
  for i = 1, #values, 2 do
    local alive = redis.call('ZSCORE', WORKERS, values[i])
    if alive and tonumber(alive) >= now then total = total + tonumber(values[i + 1]) end
  end
  return total
end

-- The live workers' slots: shared by all tenants, and reserved for tenants with none running.
local function live_slots(now)
  local shared, reserved = 0, 0
  local values = redis.call('HGETALL', SLOTS)
  for i = 1, #values, 2 do
    local alive = redis.call('ZSCORE', WORKERS, values[i])
    if alive and tonumber(alive) >= now then
      local s, r = string.match(values[i + 1], '^(%d+) (%d+)$')
      shared, reserved = shared + tonumber(s), reserved + tonumber(r)
    end
  end
  return shared, reserved
end

-- A tenant's claimed jobs, counted while they hold a lease.
local function running_add(tenant, n) redis.call('HINCRBY', DEPTH, 'r:' .. tenant, n) end

local function wake(cap)
  redis.call('LPUSH', WAKE, '1')
  redis.call('LTRIM', WAKE, 0, cap - 1)
end

-- Who runs a claimed job, and how many jobs each worker holds: the load prefix affinity bounds.
local function hold(rid, worker)
  redis.call('HSET', HOLDERS, rid, worker)
  redis.call('HINCRBY', HELD, worker, 1)
end

local function release(rid)
  redis.call('HDEL', HANDOFFS, rid)
  local w = redis.call('HGET', HOLDERS, rid)
  if not w then return end
  redis.call('HDEL', HOLDERS, rid)
  -- A worker that left is forgotten (its last jobs may end after it left).
  if redis.call('HEXISTS', HELD, w) == 1 then redis.call('HINCRBY', HELD, w, -1) end
end
