"""Tenant limits against a real Valkey server: exact under concurrency, settled on finish."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from decimal import Decimal

import pytest

from dataplane.quotas import Limits, Quotas, Usage, cost_micros, month_of
from dataplane.redis_client import redis_client_new

_tenants = itertools.count(10_000)


@pytest.fixture
async def quotas():
    client = redis_client_new()
    yield Quotas(client)
    await client.aclose()


def _limits(**overrides) -> Limits:
    fields = {
        "requests_per_minute": 1000,
        "tokens_per_minute": 1_000_000,
        "max_concurrency": 100,
        "monthly_budget": Decimal("1000"),
        **overrides,
    }
    return Limits(**fields)


async def _admit(quotas, tenant, limits, tokens=10, cost=1, rid=None, admission=""):
    decision = await quotas.admit(
        tenant_id=tenant,
        request_id=rid or uuid.uuid4().hex,
        limits=limits,
        reserve=Usage(tokens=tokens, cost_micros=cost),
        lease_seconds=60,
        spent_this_month=0,
        admission=admission,
    )
    assert decision is not None
    return decision


async def test_it_refuses_the_request_over_the_per_minute_limit(quotas):
    tenant, limits = next(_tenants), _limits(requests_per_minute=3)
    for expected_left in (2, 1, 0):
        decision = await _admit(quotas, tenant, limits)
        assert decision.admitted and decision.remaining_requests == expected_left
    refused = await _admit(quotas, tenant, limits)
    assert refused.reason == "rate_limit_exceeded"
    assert 0 < refused.reset_requests_ms <= 20_000


async def test_tokens_are_reserved_then_settled_to_actual_use(quotas):
    tenant, limits = next(_tenants), _limits(tokens_per_minute=1000)
    first = uuid.uuid4().hex
    assert (await _admit(quotas, tenant, limits, tokens=600, rid=first)).admitted
    assert (await _admit(quotas, tenant, limits, tokens=600)).reason == (
        "tokens_per_minute_exceeded"
    )
    released = await quotas.release(
        tenant_id=tenant, request_id=first, admitted_at=time.time(),
        used=Usage(tokens=100, cost_micros=1),
    )  # fmt: skip
    assert released
    assert (await _admit(quotas, tenant, limits, tokens=600)).admitted


async def test_a_request_larger_than_the_token_limit_is_told_it_never_fits(quotas):
    refused = await _admit(quotas, next(_tenants), _limits(tokens_per_minute=100), tokens=101)
    assert refused.reason == "tokens_per_minute_exceeded" and refused.reset_tokens_ms == -1


async def test_concurrency_slots_are_freed_when_a_request_ends(quotas):

    tenant, limits = next(_tenants), _limits(max_concurrency=2)
    ids = [uuid.uuid4().hex for _ in range(2)]
    for rid in ids:
        assert (await _admit(quotas, tenant, limits, rid=rid)).admitted
    assert (await _admit(quotas, tenant, limits)).reason == "concurrency_limit_exceeded"
    await quotas.release(
        tenant_id=tenant, request_id=ids[0], admitted_at=time.time(), used=Usage(0, 0)
    )
    assert (await _admit(quotas, tenant, limits)).admitted


async def test_releasing_twice_settles_once(quotas):

    tenant, rid = next(_tenants), uuid.uuid4().hex
    await _admit(quotas, tenant, _limits(), rid=rid)
    used = Usage(tokens=1, cost_micros=1)
    assert await quotas.release(
        tenant_id=tenant, request_id=rid, admitted_at=time.time(), used=used
    )
    assert not await quotas.release(
        tenant_id=tenant, request_id=rid, admitted_at=time.time(), used=used
    )


async def test_a_give_back_naming_its_admission_undoes_that_admission_alone(quotas):
    # An attempt whose admission's answer was lost gives back what it may hold; meanwhile the
    # same request id was admitted again (a fallback, a batch's next step): that stays held.
    tenant, rid, nothing = next(_tenants), uuid.uuid4().hex, Usage(0, 0)
    assert (await _admit(quotas, tenant, _limits(), rid=rid, admission="again")).admitted
    assert not await quotas.release(
        tenant_id=tenant, request_id=rid, admitted_at=time.time(), used=nothing, admission="lost"
    )
    assert await quotas.release(
        tenant_id=tenant, request_id=rid, admitted_at=time.time(), used=nothing, admission="again"
    )
    # A settlement that names none (the request's end) settles whichever admission holds.
    assert (await _admit(quotas, tenant, _limits(), rid=rid, admission="third")).admitted
    assert await quotas.release(
        tenant_id=tenant, request_id=rid, admitted_at=time.time(), used=nothing
    )


async def test_a_request_id_admitted_again_takes_its_own_place_not_a_second_one(quotas):
    """Admitted twice with no settlement between (its submission cut off and made again, or
    one admission run twice by a cluster client retrying after a failover), a request holds
    one slot, one share of tokens, one request and one cost; one settlement gives all back."""
    tenant, rid = next(_tenants), uuid.uuid4().hex
    limits = _limits(
        max_concurrency=1,
        tokens_per_minute=1000,
        requests_per_minute=2,
        monthly_budget=Decimal("0.000010"),  # 10 micros
    )
    first = await _admit(quotas, tenant, limits, tokens=600, cost=6, rid=rid)
    assert first.admitted
    again = await _admit(quotas, tenant, limits, tokens=600, cost=6, rid=rid)
    assert again.admitted, "its own slot, tokens or cost refused it"
    assert again.remaining_requests == first.remaining_requests == 1
    assert again.remaining_tokens == first.remaining_tokens == 400
    assert (await _admit(quotas, tenant, limits, tokens=1, cost=1)).reason == (
        "concurrency_limit_exceeded"
    )
    assert await quotas.release(
        tenant_id=tenant, request_id=rid, admitted_at=time.time(), used=Usage(0, 0)
    )
    # Everything it held is back: a request that needs all of it fits.
    assert (await _admit(quotas, tenant, limits, tokens=1000, cost=10)).admitted


async def test_200_concurrent_requests_never_spend_past_the_budget(quotas):
    tenant = next(_tenants)
    budget = Decimal("0.000500")  # 500 micros; each request reserves 7
    limits = _limits(monthly_budget=budget)
    decisions = await asyncio.gather(*(_admit(quotas, tenant, limits, cost=7) for _ in range(200)))
    admitted = sum(d.admitted for d in decisions)
    assert admitted == 500 // 7
    assert all(d.reason == "budget_exceeded" for d in decisions if not d.admitted)


async def test_the_month_spend_is_seeded_once_from_the_records(quotas):
    tenant, limits = next(_tenants), _limits(monthly_budget=Decimal("0.000010"))
    reserve = Usage(tokens=1, cost_micros=4)
    args = {"tenant_id": tenant, "limits": limits, "reserve": reserve, "lease_seconds": 60}
    assert await quotas.admit(request_id=uuid.uuid4().hex, **args) is None
    seeded = await quotas.admit(request_id=uuid.uuid4().hex, spent_this_month=8, **args)
    assert seeded is not None and seeded.reason == "budget_exceeded"


def test_cost_is_counted_in_micros_rounded_up():
    assert (
        cost_micros(
            price_input_per_1k=Decimal("0.0005"),
            price_output_per_1k=Decimal("0.0015"),
            prompt=1000,
            completion=1,
        )
        == 502
    )


async def test_large_body_bytes_are_a_bucket_a_minute_that_a_read_body_may_overdraw(quotas):
    tenant, mib = next(_tenants), 1024 * 1024
    take = quotas.take_body_bytes
    assert await take(tenant_id=tenant, size=3 * mib, per_minute=4 * mib) == 0
    wait = await take(tenant_id=tenant, size=2 * mib, per_minute=4 * mib)
    assert 14_000 <= wait <= 15_100  # 1 MiB short, at 4 MiB a minute: about 15 s
    # A body already read is taken whatever is left: the next ones wait for the overdraft.
    assert await take(tenant_id=tenant, size=2 * mib, per_minute=4 * mib, force=True) == 0
    assert await take(tenant_id=tenant, size=mib, per_minute=4 * mib) >= 29_000
    # A body larger than a minute's bytes passes when the bucket is full, and only then.
    other = next(_tenants)
    assert await take(tenant_id=other, size=8 * mib, per_minute=4 * mib) == 0
    assert await take(tenant_id=other, size=8 * mib, per_minute=4 * mib) > 60_000


def test_a_month_turns_at_its_first_utc_second():
    new_year = 1798761600  # 2027-01-01T00:00:00Z
    assert [month_of(t) for t in (new_year - 0.001, new_year, new_year + 3599.9)] == [
        "202612",
        "202701",
        "202701",
    ]
    assert month_of(0) == "197001" and month_of(-1) == "196912"
