"""Per-tenant limits enforced atomically in Redis, shared by every frontend.

One script per admission checks and takes, all or nothing: a request from the requests-per-
minute bucket, prompt + max_tokens from the tokens-per-minute bucket, a slot among the
tenant's concurrent requests (a lease that lapses if its frontend dies), and the cost of
prompt + max_tokens from the month's budget. An API request takes its request earlier, as
soon as its key is known (`take_request`), so that one refused later for its body still
counts; its admission then takes no second one. When the request ends, `release` settles the
reservation to what was actually used; it runs once per request whoever calls it (the
frontend when it sees the end, the ingester for requests whose frontend went away).

Keys carry the tenant as their hash tag, so one tenant's limits live in one Redis Cluster slot.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass
from decimal import Decimal

import redis.asyncio as aredis

from dataplane.keys import quota_keys
from dataplane.redis_client import script_into

MICROS = Decimal(1_000_000)

# Buckets refill continuously: `limit` units per 60 s, never above `limit`. `now` is ARGV[1].
_LEVEL = """
local now = tonumber(ARGV[1])
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local lvl, ts = tonumber(v[1]), tonumber(v[2])
  if lvl == nil then return cap end
  return math.min(cap, lvl + (now - ts) * cap / 60000)
end
"""

_ADMIT = (
    _LEVEL
    + """
local rpm, tpm, max_conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lease_ms, tokens, cost = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local budget, rid, seed = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local taken = ARGV[11] == '1'  -- the request was counted already (take_request)

local spent = tonumber(redis.call('GET', KEYS[4]))
if spent == nil then
  if seed < 0 then return {5, 0, 0, 0, 0} end
  spent = seed
  redis.call('SET', KEYS[4], seed, 'EX', 40 * 86400)
end

local req_level = level(KEYS[1], rpm)
local tok_level = level(KEYS[2], tpm)
if req_level < 1 and not taken then
  return {1, 0, math.floor(tok_level), math.ceil((1 - req_level) * 60000 / rpm), 0}
end
if tok_level < tokens then
  local wait = -1
  if tokens <= tpm then wait = math.ceil((tokens - tok_level) * 60000 / tpm) end
  return {2, math.floor(req_level), math.floor(tok_level), 0, wait}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= max_conc then
  return {3, math.floor(req_level), math.floor(tok_level), 1000, 0}
end
if spent + cost > budget then
  return {4, math.floor(req_level), math.floor(tok_level), 0, 0}
end

local req_after = req_level
if not taken then
  req_after = req_level - 1
  redis.call('HSET', KEYS[1], 'level', req_after, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
redis.call('HSET', KEYS[2], 'level', tok_level - tokens, 'ts', now, 'cap', tpm)
redis.call('PEXPIRE', KEYS[2], 120000)
redis.call('ZADD', KEYS[3], now + lease_ms, rid)
redis.call('PEXPIRE', KEYS[3], lease_ms + 60000)
redis.call('INCRBY', KEYS[4], cost)
redis.call('HSET', KEYS[5], 'tokens', tokens, 'cost', cost)
redis.call('PEXPIRE', KEYS[5], lease_ms + 86400000)
local reset_requests = math.ceil((rpm - req_after) * 60000 / rpm)
local reset_tokens = math.ceil((tpm - tok_level + tokens) * 60000 / tpm)
return {0, math.floor(math.max(req_after, 0)), math.floor(tok_level - tokens), reset_requests,
        reset_tokens}
"""
)

# Settle reservations to actual use, once each: unused tokens go back to the bucket, the budget
# is charged the actual cost, and the concurrency slot is freed. One call covers one tenant's
# requests admitted in one month: KEYS = tpm, inflight, spent, then one held key per request;
# ARGV = now, then (request id, used tokens, used cost) per request. A reservation already
# settled is skipped; returns how many were settled here.
_RELEASE = """
local now = tonumber(ARGV[1])
local settled = 0
for i = 4, #KEYS do
  local a = 2 + (i - 4) * 3
  local held = redis.call('HMGET', KEYS[i], 'tokens', 'cost')
  if held[1] ~= false then
    local used_tokens, used_cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local refund = tonumber(held[1]) - used_tokens
    if refund > 0 then
      local v = redis.call('HMGET', KEYS[1], 'level', 'ts', 'cap')
      local lvl, ts, cap = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
      if lvl ~= nil then
        lvl = math.min(cap, lvl + (now - ts) * cap / 60000 + refund)
        redis.call('HSET', KEYS[1], 'level', lvl, 'ts', now)
      end
    end
    if redis.call('EXISTS', KEYS[3]) == 1 then
      redis.call('INCRBY', KEYS[3], used_cost - tonumber(held[2]))
    end
    redis.call('ZREM', KEYS[2], ARGV[a])
    redis.call('DEL', KEYS[i])
    settled = settled + 1
  end
end
return settled
"""


# Take one request from the requests-per-minute bucket, or refuse with status 1; report both
# buckets as the admission script does.
_TAKE_REQUEST = (
    _LEVEL
    + """
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local req, tok = level(KEYS[1], rpm), level(KEYS[2], tpm)
local reset_tokens = math.ceil((tpm - tok) * 60000 / tpm)
if req < 1 then
  return {1, 0, math.floor(tok), math.ceil((1 - req) * 60000 / rpm), reset_tokens}
end
redis.call('HSET', KEYS[1], 'level', req - 1, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 120000)
return {0, math.floor(req - 1), math.floor(tok), math.ceil((rpm - req + 1) * 60000 / rpm),
        reset_tokens}
"""
)


# Read the buckets without taking from them: what a response that admitted nothing reports.
_PEEK = (
    _LEVEL
    + """
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local req, tok = level(KEYS[1], rpm), level(KEYS[2], tpm)
return {math.floor(req), math.floor(tok), math.ceil((rpm - req) * 60000 / rpm),
        math.ceil((tpm - tok) * 60000 / tpm)}
"""
)


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrency: int
    monthly_budget: Decimal


@dataclass(frozen=True)
class Usage:
    """What one request reserves at admission, or used when it ends."""

    tokens: int
    cost_micros: int


@dataclass(frozen=True)
class Decision:
    """The outcome of one admission, with what the rate-limit headers report."""

    reason: str | None  # None: admitted
    remaining_requests: int
    remaining_tokens: int
    reset_requests_ms: int
    reset_tokens_ms: int  # -1: the request can never fit in the tokens-per-minute limit

    @property
    def admitted(self) -> bool:
        return self.reason is None


_REASONS = {
    1: "rate_limit_exceeded",
    2: "tokens_per_minute_exceeded",
    3: "concurrency_limit_exceeded",
    4: "budget_exceeded",
}
_NEEDS_SEED = 5


def cost_micros(
    *, price_input_per_1k: Decimal, price_output_per_1k: Decimal, prompt: int, completion: int
) -> int:
    """Return a request's cost in millionths of the currency unit, rounded up."""
    cost = (price_input_per_1k * prompt + price_output_per_1k * completion) * MICROS / 1000
    return math.ceil(cost)


def month_of(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y%m")


def _release_call(
    tenant_id: int, month: str, items: list[tuple[str, Usage]]
) -> tuple[list[str], list[int | str]]:
    """The keys and arguments of one _RELEASE call for a tenant's requests of one month."""
    _, tpm, inflight, spent, held_prefix = quota_keys(tenant_id, "", month)
    keys = [tpm, inflight, spent, *(held_prefix + rid for rid, _ in items)]
    args: list[int | str] = [int(time.time() * 1000)]
    for rid, used in items:
        args += [rid, used.tokens, used.cost_micros]
    return keys, args


class Quotas:
    """Admission and settlement against one Redis."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._admit = client.register_script(_ADMIT)
        self._release = client.register_script(_RELEASE)
        self._peek = client.register_script(_PEEK)
        self._take_request = client.register_script(_TAKE_REQUEST)

    async def peek(self, *, tenant_id: int, limits: Limits) -> Decision:
        """Return where a tenant's per-minute buckets stand, taking nothing."""
        now = time.time()
        keys = list(quota_keys(tenant_id, "", month_of(now))[:2])
        result = await self._peek(
            keys=keys,
            args=[int(now * 1000), limits.requests_per_minute, limits.tokens_per_minute],
        )
        requests, tokens, reset_requests, reset_tokens = (int(v) for v in result)
        return Decision(
            reason=None,
            remaining_requests=max(requests, 0),
            remaining_tokens=max(tokens, 0),
            reset_requests_ms=reset_requests,
            reset_tokens_ms=reset_tokens,
        )

    async def take_request(self, *, tenant_id: int, limits: Limits) -> Decision:
        """Count one request against the tenant's requests per minute, or refuse it."""
        now = time.time()
        result = await self._take_request(
            keys=list(quota_keys(tenant_id, "", month_of(now))[:2]),
            args=[int(now * 1000), limits.requests_per_minute, limits.tokens_per_minute],
        )
        status, remaining_requests, remaining_tokens, reset_requests, reset_tokens = (
            int(v) for v in result
        )
        return Decision(
            reason=_REASONS.get(status),
            remaining_requests=max(remaining_requests, 0),
            remaining_tokens=max(remaining_tokens, 0),
            reset_requests_ms=reset_requests,
            reset_tokens_ms=reset_tokens,
        )

    async def admit(
        self,
        *,
        tenant_id: int,
        request_id: str,
        limits: Limits,
        reserve: Usage,
        lease_seconds: float,
        spent_this_month: int | None = None,
        now: float | None = None,
        request_taken: bool = False,
    ) -> Decision | None:
        """Reserve a request's share of the tenant's limits, or say which limit refuses it.

        Returns None when the month's spend is not in Redis yet (a new month, or Redis lost
        its data): call again with `spent_this_month` from the usage records. With
        `request_taken`, `take_request` counted the request already: the requests-per-minute
        bucket is only reported.
        """
        now = time.time() if now is None else now
        result = await self._admit(
            keys=list(quota_keys(tenant_id, request_id, month_of(now))),
            args=[
                int(now * 1000),
                limits.requests_per_minute,
                limits.tokens_per_minute,
                limits.max_concurrency,
                int(lease_seconds * 1000),
                reserve.tokens,
                reserve.cost_micros,
                int(limits.monthly_budget * MICROS),
                request_id,
                -1 if spent_this_month is None else spent_this_month,
                int(request_taken),
            ],
        )
        status, remaining_requests, remaining_tokens, reset_requests, reset_tokens = (
            int(v) for v in result
        )
        if status == _NEEDS_SEED:
            return None
        return Decision(
            reason=_REASONS.get(status),
            remaining_requests=max(remaining_requests, 0),
            remaining_tokens=max(remaining_tokens, 0),
            reset_requests_ms=reset_requests,
            reset_tokens_ms=reset_tokens,
        )

    async def release(
        self, *, tenant_id: int, request_id: str, admitted_at: float, used: Usage
    ) -> bool:
        """Settle a request's reservation to what it used; True the first time only."""
        keys, args = _release_call(tenant_id, month_of(admitted_at), [(request_id, used)])
        return int(await self._release(keys=keys, args=args)) == 1

    async def release_many(self, settlements: list[tuple[int, str, float, Usage]]) -> int:
        """Settle reservations given as (tenant, request id, admitted at, used); return how many.

        One script call per tenant and month however many requests: the ingester settles
        thousands at a time.
        """
        groups: dict[tuple[int, str], list[tuple[str, Usage]]] = {}
        for tenant_id, request_id, admitted_at, used in settlements:
            groups.setdefault((tenant_id, month_of(admitted_at)), []).append((request_id, used))
        if not groups:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for (tenant_id, month), items in groups.items():
                keys, args = _release_call(tenant_id, month, items)
                script_into(pipe, self._release, keys=keys, args=args)
            results = await pipe.execute()
        return sum(int(n) for n in results)
