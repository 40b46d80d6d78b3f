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
import functools
import math
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import redis.asyncio as aredis

from dataplane import scripts
from dataplane.coalesce import coalescer_of
from dataplane.keys import body_bytes_key, quota_keys
from dataplane.redis_client import pipeline_execute, script_into

MICROS = Decimal(1_000_000)


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
    """The UTC month of a Unix time, as `YYYYMM` (a request asks several times: by its hour)."""
    return _month_of_hour(math.floor(ts / 3600))


@functools.lru_cache(maxsize=64)
def _month_of_hour(hour: int) -> str:
    # A UTC month starts on an hour's boundary: every second of an hour is in the same month.
    return dt.datetime.fromtimestamp(hour * 3600, tz=dt.UTC).strftime("%Y%m")


def _release_call(
    tenant_id: int, month: str, items: list[tuple[str, Usage]], admission: str = ""
) -> tuple[list[str], list[int | str]]:
    """The keys and arguments of one _RELEASE call for a tenant's requests of one month
    (only what `admission` reserved, when it names one)."""
    _, tpm, inflight, spent, held_prefix = quota_keys(tenant_id, "", month)
    keys = [tpm, inflight, spent, *(held_prefix + rid for rid, _ in items)]
    args: list[int | str] = [int(time.time() * 1000)]
    for rid, used in items:
        args += [rid, used.tokens, used.cost_micros, admission]
    return keys, args


class Quotas:
    """Admission and settlement against one Redis."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._admit = client.register_script(scripts.QUOTA_ADMIT)
        self._release = client.register_script(scripts.QUOTA_RELEASE)
        self._peek = client.register_script(scripts.QUOTA_PEEK)
        self._take_request = client.register_script(scripts.QUOTA_TAKE_REQUEST)
        self._take_bytes = client.register_script(scripts.QUOTA_TAKE_BYTES)
        # A request's own calls (count, admit, settle) share a round trip with the others'
        # made in the same turn of the loop.
        self._turns = coalescer_of(client)

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
        result = await self._turns.script(
            self._take_request,
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

    async def take_body_bytes(
        self, *, tenant_id: int, size: int, per_minute: int, force: bool = False
    ) -> int:
        """Count a large request body's bytes against the tenant's per-minute share.

        Returns 0 when taken, else the milliseconds until they would be; with `force` (a body
        already read) they are always taken, leaving the share short for what follows.
        """
        waited: Any = await self._take_bytes(
            keys=[body_bytes_key(tenant_id)],
            args=[int(time.time() * 1000), per_minute, size, "1" if force else "0"],
        )
        return int(waited)

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
        admission: str = "",
    ) -> Decision | None:
        """Reserve a request's share of the tenant's limits, or say which limit refuses it.

        Returns None when the month's spend is not in Redis yet (a new month, or Redis lost
        its data): call again with `spent_this_month` from the usage records. With
        `request_taken`, `take_request` counted the request already: the requests-per-minute
        bucket is only reported. `admission` marks the reservation, so that a give-back
        naming it undoes this admission and no later one of the same request id.
        """
        now = time.time() if now is None else now
        result = await self._turns.script(
            self._admit,
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
                admission,
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
        self,
        *,
        tenant_id: int,
        request_id: str,
        admitted_at: float,
        used: Usage,
        admission: str = "",
    ) -> bool:
        """Settle a request's reservation to what it used; True the first time only.

        With `admission`, only the reservation that admission made (see `admit`).
        """
        keys, args = _release_call(
            tenant_id, month_of(admitted_at), [(request_id, used)], admission
        )
        return int(await self._turns.script(self._release, keys=keys, args=args)) == 1

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
            results = await pipeline_execute(pipe)
        return sum(int(n) for n in results)
