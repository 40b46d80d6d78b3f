"""An alias that cannot take an interactive request hands it to its fallback.

In process, against the real Valkey and database: two aliases of the demo model, each on a
deployment of its own. No worker runs: a worker's heartbeat with no free slot makes a
deployment live, so whatever it admits waits in its queue. The tests run in this order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from prometheus_client import REGISTRY

from billing.services import price_current
from config.db import db_call
from dataplane.breakers import breaker_message_read, breaker_share, breakers_held
from dataplane.finish import Finisher
from dataplane.keys import BREAKERS_CHANNEL, quota_keys
from dataplane.leases import Leases
from dataplane.quotas import month_of
from dataplane.redis_client import control_client_new
from dataplane.types import Failed, Status, usage_for
from inference.base.errors import ApiError
from inference.body.fields import CHAT
from inference.body.parser import generation_parse
from inference.pipeline import auth, relay, submission
from inference.pipeline import breaker as breakers
from inference.pipeline.admission import request_abandon, route_cost
from inference.pipeline.breaker import breakers_elsewhere_replace, breakers_reset
from inference.pipeline.clients import dispatch_get
from inference.pipeline.submission import generation_submit
from models_registry.models import Deployment
from models_registry.selectors import routing_resolve
from models_registry.services import alias_fallback_set, alias_set
from tenants.keys import token_parse
from tests.conftest import own_deployment, roomy_key

pytestmark = pytest.mark.django_db

BIG, SMALL = "fb-big", "fb-small"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def aliases(world: Any, demo_model_dir: Any, django_db_blocker: Any) -> str:
    """`fb-big` falls back to `fb-small`; returns a key of a tenant of its own.

    Committed, outside any test's transaction: the frontend's code reads the database from
    threads of its own.
    """
    made = {}
    with django_db_blocker.unblock():
        for name, price in ((BIG, Decimal("0.71")), (SMALL, Decimal("0.73"))):
            version = own_deployment(f"{name}-d", name, price, demo_model_dir)
            made[name] = alias_set(name=name, version=version)
            Deployment.objects.filter(name=f"{name}-d").update(max_queued=1)
        alias_fallback_set(alias=made[BIG], fallback=made[SMALL])
        return roomy_key("fb-tenant")


@pytest.fixture(scope="module")
def one_a_minute(aliases: str, django_db_blocker: Any) -> list[str]:
    """Keys of two tenants, each allowed one request a minute."""
    with django_db_blocker.unblock():
        return [roomy_key(f"fb-one-a-minute-{i}", requests_per_minute=1) for i in range(2)]


@pytest.fixture(scope="module")
def other_tenants(aliases: str, django_db_blocker: Any) -> list[str]:
    """Keys of two more tenants of the aliases."""
    with django_db_blocker.unblock():
        return [roomy_key(f"fb-breaker-other-{i}") for i in range(2)]


@pytest.fixture(autouse=True)
def no_recent_refusals() -> Any:
    """Each test starts without the last one's queue_full refusals on this frontend."""
    submission._full_until.clear()
    yield
    submission._full_until.clear()


async def _principal(key: str) -> Any:
    return await db_call(auth.principal_of_key, token_parse(key).public_id)  # type: ignore[union-attr]


async def _live(deployment: str) -> None:
    await Leases(dispatch_get().redis).heartbeat(
        deployment=deployment, worker="w", ttl=60, slots=(0, 0)
    )


def _fallbacks(reason: str) -> float:
    labels = {"model": BIG, "fallback": SMALL, "reason": reason}
    return REGISTRY.get_sample_value("roundhouse_fallbacks_total", labels) or 0.0


async def _submit(principal: Any, model: str, **kwargs: Any) -> Any:
    request = generation_parse({"model": model, "messages": HELLO, "max_tokens": 16}, endpoint=CHAT)
    return await generation_submit(
        principal=principal, request=request, request_id=uuid.uuid4().hex, **kwargs
    )


async def _held(tenant_id: int, request_id: str) -> dict[Any, Any]:
    keys = quota_keys(tenant_id, request_id, month_of(time.time()))
    return dict(await dispatch_get().redis.hgetall(keys.held))


async def _deployment(model: str) -> str:
    routing = await db_call(routing_resolve, name=model, price_of=price_current)
    assert routing is not None
    return routing.primary.deployment


async def test_an_alias_no_worker_serves_hands_the_request_to_its_fallback(aliases):
    principal = await _principal(aliases)
    small = await _deployment(SMALL)
    await _live(small)  # fb-big has no worker at all
    before = _fallbacks("model_unavailable")
    submitted = await _submit(principal, BIG)
    try:
        assert submitted.route.deployment == small
        assert submitted.route.served_name.startswith(f"{SMALL}@")
        headers = submitted.headers()
        assert headers["x-roundhouse-fallback-from"] == BIG
        assert headers["x-roundhouse-fallback-reason"] == "model_unavailable"
        # Its usage record will say so: the worker copies the job's field into its usage.
        assert submitted.job.fallback_from == BIG
        assert _fallbacks("model_unavailable") == before + 1
        # Reserved once, at the fallback's prices: what fb-big held was given back first.
        held = await _held(principal.tenant_id, submitted.job.request_id)
        cost = route_cost(
            submitted.route,
            prompt=len(submitted.job.prompt_token_ids),
            completion=submitted.job.sampling.max_tokens,
        )
        assert int(held[b"tokens"]) == submitted.job.reserved_tokens
        assert int(held[b"cost"]) == cost
    finally:
        await request_abandon(submitted.job)


async def test_a_request_refused_before_admission_counts_once_where_it_lands(one_a_minute):
    principal = await _principal(one_a_minute[0])
    await _live(await _deployment(SMALL))
    # fb-big's queue refused a request a moment ago: this one is refused before the
    # admission that would have counted it against its tenant's rate.
    full = (await _deployment(BIG), "interactive")
    submission._full_until[full] = time.monotonic() + 60
    submitted = await _submit(principal, BIG)
    assert (submitted.fallback_from, submitted.fallback_reason) == (BIG, "queue_full")
    await request_abandon(submitted.job)
    with pytest.raises(ApiError) as refused:
        await _submit(principal, BIG)  # the first was counted: this is one too many
    assert (refused.value.status, refused.value.code) == (429, "rate_limit_exceeded")


async def test_a_request_refused_after_admission_is_not_counted_twice(aliases, one_a_minute):
    principal = await _principal(one_a_minute[1])
    big, small = await _deployment(BIG), await _deployment(SMALL)
    await _live(big)
    await _live(small)
    filler = await _submit(await _principal(aliases), BIG)  # fb-big queues one at most
    try:
        assert filler.route.deployment == big
        submission._full_until.clear()  # refused by the queue's own script, after admission
        submitted = await _submit(principal, BIG)  # counted twice, it would be a 429
        assert (submitted.fallback_from, submitted.fallback_reason) == (BIG, "queue_full")
        await request_abandon(submitted.job)
    finally:
        await request_abandon(filler.job)


async def test_a_full_queue_sends_interactive_requests_on_and_batch_work_waits(aliases):
    principal = await _principal(aliases)
    big, small = await _deployment(BIG), await _deployment(SMALL)
    await _live(big)
    await _live(small)
    first = await _submit(principal, BIG)  # fb-big queues one request at most: this one
    ended = [first.job]
    try:
        assert first.route.deployment == big and "x-roundhouse-fallback-from" not in first.headers()
        before = _fallbacks("queue_full")
        second = await _submit(principal, BIG)
        ended.append(second.job)
        assert second.route.deployment == small
        assert second.headers()["x-roundhouse-fallback-reason"] == "queue_full"
        assert _fallbacks("queue_full") == before + 1
        # Batch work has hours: it waits for its own model rather than take another.
        with pytest.raises(ApiError) as refused:
            await _submit(principal, BIG, priority="batch")
        assert refused.value.code == "queue_full"
        # The fallback's queue is full too now: the refusal is the fallback's own.
        with pytest.raises(ApiError) as refused:
            await _submit(principal, BIG)
        assert refused.value.code == "queue_full"
        assert "fb-small" in refused.value.message
    finally:
        for job in ended:
            await request_abandon(job)


async def test_a_refusal_that_is_the_requests_own_is_not_sent_on(aliases):
    principal = await _principal(aliases)
    before = sum(_fallbacks(r) for r in ("model_unavailable", "queue_full"))
    request = generation_parse(
        {"model": BIG, "messages": HELLO, "max_tokens": 100_000}, endpoint=CHAT
    )
    with pytest.raises(ApiError) as refused:
        await generation_submit(principal=principal, request=request, request_id="too-long")
    assert (refused.value.status, refused.value.param) == (400, "max_tokens")
    assert sum(_fallbacks(r) for r in ("model_unavailable", "queue_full")) == before


@pytest.fixture
def quick_breakers(settings: Any) -> Any:
    """Breakers that open after two relayed ends, both failed."""
    settings.ROUNDHOUSE_BREAKER_MIN_REQUESTS = 2
    settings.ROUNDHOUSE_BREAKER_FAILURE_SHARE = 1.0
    breakers_reset()
    yield
    breakers_reset()


async def _fail_in_the_engine(submitted: Any) -> list[Any]:
    """Be the worker whose engine raises on the request, then relay it as the frontend does."""
    redis = dispatch_get().redis
    claimed = await Leases(redis).claim(
        deployment=submitted.job.deployment, count=1, lease_seconds=60, worker="w"
    )
    (job,) = claimed.run
    assert job.request_id == submitted.job.request_id
    failed = Failed(code="engine_error", message="boom", prompt_tokens=1, completion_tokens=0)
    usage = usage_for(job, status=Status.ERROR, finished_at=time.time(), error_code="engine_error")
    assert await Finisher(redis).finalize(job=job, terminal=failed, usage=usage)
    return [event async for event in relay.events(dispatch_get(), submitted)]


async def test_an_alias_whose_engine_keeps_failing_sends_its_requests_on(
    aliases, other_tenants, quick_breakers
):
    principal = await _principal(aliases)
    second, third = [await _principal(key) for key in other_tenants]
    big, small = await _deployment(BIG), await _deployment(SMALL)
    await Leases(dispatch_get().redis).heartbeat(deployment=big, worker="w", ttl=60, slots=(1, 1))
    await _live(small)
    for _ in range(2):
        submitted = await _submit(principal, BIG)
        assert submitted.route.deployment == big
        seen = await _fail_in_the_engine(submitted)
        assert [type(e) for e in seen] == [Failed]
    opened = REGISTRY.get_sample_value(
        "roundhouse_breaker_transitions_total", {"model": BIG, "state": "open"}
    )
    assert opened is not None and opened >= 1
    before = _fallbacks("circuit_open")
    held = await _submit(principal, BIG)
    try:
        assert held.route.deployment == small
        assert held.headers()["x-roundhouse-fallback-reason"] == "circuit_open"
        assert held.headers()["x-roundhouse-fallback-from"] == BIG
        assert held.job.fallback_from == BIG
        assert _fallbacks("circuit_open") == before + 1
        # Reserved on the fallback, which took it.
        assert await _held(principal.tenant_id, held.job.request_id)
    finally:
        await request_abandon(held.job)
    # One tenant's failures hold back its own requests only: the next tenant's still go to
    # the alias, and fail there too.
    for _ in range(2):
        submitted = await _submit(second, BIG)
        assert submitted.route.deployment == big
        await _fail_in_the_engine(submitted)
    # Two tenants' breakers hold: a tenant whose requests never failed is sent on too.
    held = await _submit(third, BIG)
    try:
        assert held.route.deployment == small
        assert held.headers()["x-roundhouse-fallback-reason"] == "circuit_open"
    finally:
        await request_abandon(held.job)
    all_held = REGISTRY.get_sample_value(
        "roundhouse_breaker_transitions_total", {"model": BIG, "state": "open_all"}
    )
    assert all_held is not None and all_held >= 1


async def test_a_breaker_that_opens_holds_its_tenant_on_every_frontend(aliases, quick_breakers):
    principal = await _principal(aliases)
    tenant = principal.tenant_id
    big, small = await _deployment(BIG), await _deployment(SMALL)
    await Leases(dispatch_get().redis).heartbeat(deployment=big, worker="w", ttl=60, slots=(1, 1))
    await _live(small)
    control = control_client_new()
    pubsub = control.pubsub(ignore_subscribe_messages=True)
    try:
        # What an earlier test's breaker for this tenant left shared goes first.
        await breaker_share(control, alias=BIG, tenant_id=tenant, until=0)
        await pubsub.subscribe(BREAKERS_CHANNEL)
        opened_after = time.time()
        for _ in range(2):
            await _fail_in_the_engine(await _submit(principal, BIG))
        # The frontend whose breaker opened writes until when it holds, and says so.
        deadline = time.monotonic() + 10
        held = await breakers_held(control)
        while held.get((BIG, tenant), 0) <= opened_after:
            assert time.monotonic() < deadline, "the open breaker was never shared"
            await asyncio.sleep(0.05)
            held = await breakers_held(control)
        until = held[(BIG, tenant)]
        assert until <= time.time() + settings.ROUNDHOUSE_BREAKER_OPEN_SECONDS
        told: list[tuple[str, int, float] | None] = []
        while (BIG, tenant, until) not in told:
            assert time.monotonic() < deadline, f"no message said so: {told}"
            message = await pubsub.get_message(timeout=0.5)
            if message is not None:
                told.append(breaker_message_read(message["data"].decode()))
        # Another frontend (this one, its own breakers forgotten) that reads what holds
        # sends the tenant's requests on, with no failure of its own.
        breakers_reset()
        assert breakers.breaker_admits(BIG, tenant, "any")
        breakers_elsewhere_replace(held)
        sent_on = await _submit(principal, BIG)
        try:
            assert sent_on.route.deployment == small
            assert sent_on.headers()["x-roundhouse-fallback-reason"] == "circuit_open"
        finally:
            await request_abandon(sent_on.job)
        # Told it closed (its probe succeeded where it opened): the tenant goes to the alias.
        breakers.breaker_elsewhere(BIG, tenant, 0)
        assert breakers.breaker_admits(BIG, tenant, "any")
    finally:
        await breaker_share(control, alias=BIG, tenant_id=tenant, until=0)
        await pubsub.aclose()
        await control.aclose()


async def test_an_open_breaker_holds_nothing_back_from_an_alias_without_a_fallback(
    aliases, quick_breakers
):
    principal = await _principal(aliases)
    small = await _deployment(SMALL)
    await _live(small)
    await Leases(dispatch_get().redis).heartbeat(deployment=small, worker="w", ttl=60, slots=(1, 1))
    for _ in range(2):
        await _fail_in_the_engine(await _submit(principal, SMALL))
    submitted = await _submit(principal, SMALL)  # fb-small has no fallback: it is asked
    try:
        assert submitted.route.deployment == small
        assert "x-roundhouse-fallback-from" not in submitted.headers()
        assert not submitted.breaker_alias  # nothing to hold its requests back for
        assert SMALL not in breakers._breakers
    finally:
        await request_abandon(submitted.job)
