"""Exactly-once usage: duplicated deliveries and ingesters that die before acknowledging.

Real Redis streams and consumer groups, the real ingester's record/finish steps and real
PostgreSQL. The ingester is "killed" by failing its acknowledgement step at a random batch;
a fresh ingester (another consumer) then claims what the dead one left pending.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from decimal import ROUND_HALF_UP, Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ingester import Ingester
from billing.invoices import cents_allocate
from billing.models import UsageRecord
from billing.services import IngestResult, usage_ingest
from dataplane.keys import INGEST_GROUP, usage_key
from dataplane.redis_client import redis_client_new
from dataplane.types import Status, UsageEvent, encode
from tests.dataplane.roles import roles

pytestmark = pytest.mark.django_db


class Killed(Exception):
    pass


class _Ingester(Ingester):
    """The real ingester, writing on the test's own connection (so its transaction holds)."""

    def __init__(self, *, die_at_batch: int | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.batches = 0
        self.die_at_batch = die_at_batch

    async def _record(self, entries: list) -> IngestResult:
        # On this thread's connection, inside the test's transaction: the real ingester hands
        # the same call to a worker thread (sync_to_async), which would commit past the test.
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        try:
            return usage_ingest(events=[event for _, _, event in entries])
        finally:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]

    async def _finish(self, entries: list, result: IngestResult) -> None:
        self.batches += 1
        if self.batches == self.die_at_batch:
            raise Killed  # rows committed, nothing acknowledged: the worst moment to die
        await super()._finish(entries, result)


async def _run(deployment: str, events: list[UsageEvent], die_at: int | None) -> None:
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    try:
        await dispatch.usage.ensure_groups(deployment)
        async with client.pipeline(transaction=False) as pipe:
            for event in events:
                for _ in range(2):  # every message delivered twice
                    pipe.xadd(usage_key(deployment), {"u": encode(event)})
            await pipe.execute()
        first = _Ingester(
            client=dispatch.redis,
            reply_ttl=dispatch.reply_ttl,
            consumer="first",
            die_at_batch=die_at,
        )
        try:
            while entries := await dispatch.usage.read_usage(
                deployments=[deployment], consumer="first", count=7, block_ms=10
            ):
                await first._ingest(entries)
        except Killed:
            pass
        # A second ingester takes over what the first read but never acknowledged, then the rest.
        second = _Ingester(client=dispatch.redis, reply_ttl=dispatch.reply_ttl, consumer="second")
        stale = await dispatch.usage.reclaim_usage(
            deployment=deployment, consumer="second", min_idle_ms=0
        )
        if stale:
            await second._ingest(stale)
        while entries := await dispatch.usage.read_usage(
            deployments=[deployment], consumer="second", count=7, block_ms=10
        ):
            await second._ingest(entries)
        info = await client.xinfo_groups(usage_key(deployment))
        assert [g["pending"] for g in info if g["name"].decode() == INGEST_GROUP] == [0]
        assert await client.xlen(usage_key(deployment)) == 0
    finally:
        await client.delete(usage_key(deployment))
        await client.aclose()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tokens=st.lists(
        st.tuples(
            st.integers(0, 5000), st.integers(0, 5000), st.sampled_from(["interactive", "batch"])
        ),
        min_size=1,
        max_size=40,
    ),
    die_at=st.one_of(st.none(), st.integers(1, 8)),
)
def test_every_request_is_recorded_once_whatever_is_duplicated_or_killed(world, tokens, die_at):
    deployment = f"once-{uuid.uuid4().hex[:8]}"
    events = [
        UsageEvent(
            request_id=uuid.uuid4().hex, tenant_id=world.acme.pk, api_key_id=0,
            deployment=deployment, model_version=world.version.digest, endpoint="completions",
            status=Status.OK, prompt_tokens=prompt, completion_tokens=completion,
            enqueued_at=1_790_000_000.0, finished_at=1_790_000_001.0, priority=priority,
        )
        for prompt, completion, priority in tokens
    ]  # fmt: skip
    asyncio.run(_run(deployment, events, die_at))
    records = UsageRecord.objects.filter(deployment=deployment)
    assert records.count() == len(events)
    assert set(records.values_list("request_id", flat=True)) == {e.request_id for e in events}
    # The invoice arithmetic: lines add up to the sum of the stored costs, to the cent.
    costs = [r.cost for r in records]
    expected = (sum(costs, Decimal(0))).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    assert sum(cents_allocate(costs), Decimal(0)) == expected


def test_a_database_outage_while_listing_deployments_keeps_the_last_list(monkeypatch):
    """PostgreSQL restarting when the ingester asks for its deployments does not stop it."""
    from django.db import OperationalError

    import billing.ingester as ingester_module

    async def listed(*_args: object, **_kwargs: object) -> list[str]:
        return ["tiny"]

    async def refused(*_args: object, **_kwargs: object) -> list[str]:
        raise OperationalError("the database system is shutting down")

    async def scenario() -> list[list[str]]:
        client = redis_client_new()
        ingester = Ingester(client=client, consumer="outage")
        seen = []
        monkeypatch.setattr(ingester_module, "db_call", listed)
        seen.append(await ingester._refresh_deployments())
        ingester._deployments_at = 0.0  # due to ask again
        monkeypatch.setattr(ingester_module, "db_call", refused)
        seen.append(await ingester._refresh_deployments())
        await client.aclose()
        return seen

    assert asyncio.run(scenario()) == [["tiny"], ["tiny"]]


def test_a_batch_recorded_but_not_settled_is_taken_up_when_the_loop_starts_again(
    world, monkeypatch
):
    """The settle of a recorded batch raised (its rows are committed, its reservations held,
    its events unacknowledged): the loop starts again and takes the batch up at once, not once
    it is stale enough for another ingester's re-claim (an hour here)."""
    import billing.ingester as ingester_module

    monkeypatch.setattr(ingester_module, "STALE_PENDING_MS", 3_600_000)
    deployment = f"own-{uuid.uuid4().hex[:8]}"
    events = [
        UsageEvent(
            request_id=uuid.uuid4().hex, tenant_id=world.acme.pk, api_key_id=0,
            deployment=deployment, model_version=world.version.digest, endpoint="completions",
            status=Status.OK, prompt_tokens=3, completion_tokens=5,
            enqueued_at=1_790_000_000.0, finished_at=1_790_000_001.0, priority="interactive",
        )
        for _ in range(5)
    ]  # fmt: skip

    async def scenario() -> tuple[int, int]:
        client = redis_client_new()
        dispatch = roles(client, reply_ttl=60)
        ingester = _Ingester(
            client=dispatch.redis, reply_ttl=dispatch.reply_ttl, consumer="own", die_at_batch=1
        )

        async def listed() -> list[str]:
            return [deployment]

        ingester._refresh_deployments = listed  # type: ignore[method-assign]
        try:
            await dispatch.usage.ensure_groups(deployment)
            for event in events:
                await client.xadd(usage_key(deployment), {"u": encode(event)})
            running = asyncio.create_task(ingester.run())
            pending = -1
            for _ in range(600):
                await asyncio.sleep(0.1)
                info = await client.xinfo_groups(usage_key(deployment))
                pending = next(g["pending"] for g in info if g["name"].decode() == INGEST_GROUP)
                if ingester.batches >= 2 and pending == 0:
                    break
            ingester.stop()
            await running
            return pending, await client.xlen(usage_key(deployment))
        finally:
            await client.delete(usage_key(deployment))
            await client.aclose()

    assert asyncio.run(scenario()) == (0, 0)
    records = UsageRecord.objects.filter(deployment=deployment)
    assert sorted(records.values_list("request_id", flat=True)) == sorted(
        e.request_id for e in events
    )
