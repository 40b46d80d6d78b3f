-- Take up to ARGV[2] jobs in fair order: interactive before batch; within a class the waiting
-- tenant with the lowest virtual counter, first in first out within a tenant. With ARGV[9] > 0,
-- batch work is not starved: after ARGV[9] - 1 interactive jobs in a row taken while batch work
-- waited, the next job is a batch one (the run's length is kept in the VTC hash, so it spans
-- claims and workers). Jobs whose
-- deadline passed while queued are leased too but returned apart, uncharged, for the worker
-- to end without running them. Returns {jobs to run, expired jobs, 1 if nothing is left
-- queued else 0, the ids of the jobs to run whose cancel flag is set}: a request cancelled
-- before its job was claimed (ARGV[12] is the prefix of the deployment's cancel flags).
--
-- A claim naming its worker (ARGV[5]) first takes the jobs handed to that worker, and holds what
-- it claims in the worker's name; with affinity (ARGV[6]) it hands keyed jobs to their owners
-- (see prefix affinity in dataplane/leases.py; ARGV[7] is the load bound, ARGV[8] the prefix of
-- the workers' handoff channels).
--
-- ARGV[10] (",<tenant>:<jobs>,...") caps how many jobs each tenant listed may take in this
-- claim, ARGV[11] that of any other tenant (-1: no cap): a worker's per-tenant caps
-- (workers/fairness.py). A tenant with no room left is passed over like a skipped one. Jobs
-- handed to the worker count against their tenant's room but are always taken: they are held
-- in its name already.
local now, count, lease_until = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local skip = ARGV[4]  -- ",<tenant>,<tenant>,": tenants not to take jobs from this time
local room, room_default = {}, tonumber(ARGV[11] or '-1')
for t, n in string.gmatch(ARGV[10] or '', '(%d+):(%d+)') do room[t] = tonumber(n) end
local function room_of(t)
  local r = room[t]
  if r == nil then r = room_default end
  return r
end
local function room_take(t)
  local r = room_of(t)
  if r > 0 then room[t] = r - 1 end
end
local worker, affinity, bound = ARGV[5] or '', ARGV[6] == '1', tonumber(ARGV[7] or '0')
local batch_every = tonumber(ARGV[9] or '0')
local streak = 0
if batch_every > 0 then streak = tonumber(redis.call('HGET', VTC, 'streak') or '0') end
local streak_was = streak
local scan = 0
if skip ~= ',' or next(room) ~= nil or room_default >= 0 then scan = 31 end
local ok, expired, cancelled = {}, {}, {}
-- A job to run; its id goes with the cancelled ones too when a cancel flagged it while queued.
-- The flag's key is built here (the claim cannot name the jobs it will take beforehand); it
-- carries the deployment's hash tag, so it lives in the slot of the keys the claim names.
local function run(rid, payload)
  table.insert(ok, payload)
  if redis.call('EXISTS', ARGV[12] .. rid) == 1 then table.insert(cancelled, rid) end
end

-- Jobs handed to this worker were dispatched in fair order already: they go first, oldest first.
if worker ~= '' then
  local mine = {}
  local handed = redis.call('HGETALL', HANDOFFS)
  for i = 1, #handed, 2 do
    local seq, to = string.match(handed[i + 1], '^(%d+) (%S+)$')
    if to == worker then table.insert(mine, {rid = handed[i], seq = tonumber(seq)}) end
  end
  table.sort(mine, function(a, b) return a.seq < b.seq end)
  for _, h in ipairs(mine) do
    if #ok >= count then break end
    redis.call('HDEL', HANDOFFS, h.rid)
    local m = redis.call('HGET', META, h.rid)
    local holder = redis.call('HGET', HOLDERS, h.rid)
    if m and holder == worker and redis.call('ZSCORE', LEASES, h.rid) then
      local j = meta_parse(m)
      local payload = redis.call('HGET', JOBS, h.rid)
      redis.call('ZADD', LEASES, lease_until, h.rid)
      room_take(j.tenant)
      if j.deadline <= now then
        -- Its deadline passed on the way: returned uncharged, like one that expired queued.
        charge(j.cls, j.tenant, -j.cost / j.weight)
        table.insert(expired, payload)
      else
        run(h.rid, payload)
      end
    end
  end
end

-- The workers a keyed job may go to: live, with shared slots, holding jobs in their name.
local replicas = nil
local function replicas_load()
  local found = {list = {}, total = 0}
  local values = redis.call('HGETALL', SLOTS)
  for i = 1, #values, 2 do
    local alive = redis.call('ZSCORE', WORKERS, values[i])
    local shared = tonumber(string.match(values[i + 1], '^(%d+)'))
    local held = redis.call('HGET', HELD, values[i])
    if alive and tonumber(alive) >= now and shared > 0 and held then
      held = math.max(tonumber(held), 0)
      table.insert(found.list, {name = values[i], shared = shared, held = held})
      found.total = found.total + held
    end
  end
  return found
end

local function held_add(name)
  if replicas == nil then return end
  replicas.total = replicas.total + 1
  for _, r in ipairs(replicas.list) do
    if r.name == name then r.held = r.held + 1 end
  end
end

-- The worker that runs a job with this prefix key: its owner by rendezvous hashing when the
-- owner has a free shared slot and stays within the load bound, else the claimer.
local function placed(key)
  if replicas == nil then replicas = replicas_load() end
  local owner, best = nil, -1
  for _, r in ipairs(replicas.list) do
    local score = tonumber(string.sub(redis.sha1hex(key .. ' ' .. r.name), 1, 12), 16)
    if score > best then owner, best = r, score end
  end
  if owner == nil or owner.name == worker then return worker end
  local limit = math.ceil(bound * (replicas.total + 1) / #replicas.list)
  if owner.held < owner.shared and owner.held + 1 <= limit then return owner.name end
  return worker
end

local steps = 0
while #ok < count and steps < count * 4 + 16 do
  steps = steps + 1
  local cls, tenant, counter = nil, nil, nil
  local order = {'interactive', 'batch'}
  if batch_every > 0 and streak >= batch_every - 1 then order = {'batch', 'interactive'} end
  for _, c in ipairs(order) do
    local heads = redis.call('ZRANGE', READY[c], 0, scan, 'WITHSCORES')
    for i = 1, #heads, 2 do
      if not string.find(skip, ',' .. heads[i] .. ',', 1, true) and room_of(heads[i]) ~= 0 then
        cls, tenant, counter = c, heads[i], tonumber(heads[i + 1])
        break
      end
    end
    if cls then break end
  end
  if cls == nil then break end
  local lo, hi = tenant_range(tenant)
  local first = redis.call('ZRANGEBYLEX', QUEUE[cls], lo, hi, 'LIMIT', 0, 1)
  if #first == 0 then
    redis.call('ZREM', READY[cls], tenant)
  else
    local member = first[1]
    local rid = string.sub(member, 29)
    local m = redis.call('HGET', META, rid)
    if not m then
      redis.call('ZREM', QUEUE[cls], member)
      unbacklog_if_empty(cls, tenant)
    else
      local j = meta_parse(m)
      local payload = redis.call('HGET', JOBS, rid)
      local holder = worker
      redis.call('ZADD', LEASES, lease_until, rid)
      running_add(tenant, 1)
      if j.deadline <= now then
        table.insert(expired, payload)
      else
        if batch_every > 0 then
          if cls == 'batch' then
            streak = 0
          elseif redis.call('ZCARD', READY.batch) > 0 then
            streak = streak + 1
          end
        end
        room_take(tenant)
        local key = affinity and redis.call('HGET', PREFIXES, rid)
        if key then holder = placed(key) end
        if holder == worker then
          run(rid, payload)
        else
          local seq = redis.call('HINCRBY', VTC, 'handoff', 1)
          redis.call('HSET', HANDOFFS, rid, seq .. ' ' .. holder)
          redis.call('SPUBLISH', ARGV[8] .. holder, rid)
        end
        local clock = tonumber(redis.call('HGET', VTC, 'v:' .. cls) or '0')
        if counter > clock then redis.call('HSET', VTC, 'v:' .. cls, counter) end
        charge(cls, tenant, j.cost / j.weight)
      end
      if worker ~= '' then
        hold(rid, holder)
        held_add(holder)
      end
      unqueue(rid, j)
    end
  end
end
if streak ~= streak_was then redis.call('HSET', VTC, 'streak', streak) end
-- Nothing left queued: the wake list goes, and the worker is told its claim drained the queue
-- (a job queued from here on leaves a wake token, so it may wait rather than claim again).
local drained = depth_of('n') <= 0
if drained then redis.call('DEL', WAKE) end
return {ok, expired, drained and 1 or 0, cancelled}
