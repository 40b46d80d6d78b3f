"""Every data-plane script and multi-key read against a real Valkey Cluster.

A script or a read whose keys hash to two slots fails on a cluster with CROSSSLOT; a single
server never says so. Each script runs here through the code that runs it in production, with a
deployment and a tenant whose keys live on different primaries, and the test then checks that
every script of dataplane.scripts was run on the cluster.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any, cast

import msgspec
import pytest
import redis
import redis.asyncio as aredis

from dataplane import scripts
from dataplane.autoscale import Autoscaler, ScalingPolicy
from dataplane.frontdoor import Refusal, Refused
from dataplane.keys import quota_keys, tag, usage_key
from dataplane.quotas import Limits, Quotas, Usage, month_of
from dataplane.reaper import Reaper
from dataplane.snapshots import QueueSnapshot
from dataplane.types import Failed, Finished, Started, Status, usage_for
from embedded.valkey_cluster import Cluster, primary_of
from inference.pipeline import idempotency
from inference.pipeline.idempotency import Idempotency, Original, record_key
from tests.dataplane.roles import roles
from tests.jobs import job_new


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[aredis.Redis]:
    connected = aredis.RedisCluster.from_url(cluster.url)
    yield cast(aredis.Redis, connected)
    await connected.aclose()


def _apart(cluster: Cluster) -> tuple[str, str, int]:
    """Two deployments and a tenant whose keys live on three different primaries."""
    found: dict[str, str] = {}
    tenant = 0
    while len(found) < 2:
        name = f"c-{uuid.uuid4().hex[:8]}"
        owner = primary_of(cluster, f"{tag(name)}:jobs").name
        if owner not in found.values():
            found[name] = owner
    first, second = found
    for candidate in range(1, 10_000):
        if primary_of(cluster, quota_keys(candidate, "", "").rpm).name not in found.values():
            tenant = candidate
            break
    return first, second, tenant


def _scripts() -> dict[str, str]:
    """Every script the platform runs, by its name in dataplane.scripts."""
    return {
        name: text
        for name, text in vars(scripts).items()
        if name.isupper() and not name.startswith("_") and isinstance(text, str)
    }


def _loaded(cluster: Cluster) -> set[str]:
    """The digests of the scripts some primary of the cluster has run."""
    digests = {
        name: hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
        for name, text in _scripts().items()
    }
    found: set[str] = set()
    for node in cluster.nodes:
        if node.primary or cluster.pid(node.name) is None:
            continue
        single = redis.Redis(host=node.host, port=node.port)
        try:
            exists = single.script_exists(*digests.values())
        finally:
            single.close()
        found |= {name for (name, _), yes in zip(digests.items(), exists, strict=True) if yes}
    return found


async def test_every_script_and_read_stays_within_one_slot(
    cluster: Cluster, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, tenant = _apart(cluster)
    r = roles(client, reply_ttl=60)
    for deployment in (first, second):
        await r.usage.ensure_groups(deployment)
        await r.leases.heartbeat(deployment=deployment, worker="w", ttl=60)

    # ENQUEUE, then UNQUEUE (a cancel of a queued job).
    cancelled = job_new(first, tenant=tenant)
    assert await r.front.enqueue(cancelled) is None
    assert await r.front.cancel(job=cancelled)

    # CLAIM, then REQUEUE: the lease lapses before the job started.
    requeued = job_new(first, tenant=tenant)
    assert await r.front.enqueue(requeued) is None
    await r.leases.claim(deployment=first, count=1, lease_seconds=0.05)
    time.sleep(0.1)
    reaper = Reaper(client, reply_ttl=60)
    assert await reaper.reclaim_expired(deployment=first) == 1

    # CLAIM again and FINALIZE; the other deployment's job ends through the reaper (FINALIZE).
    claimed = await r.leases.claim(deployment=first, count=1, lease_seconds=5, worker="w")
    assert [j.request_id for j in claimed.run] == [requeued.request_id]
    await r.finisher.publish(job=requeued, events=[Started(at=time.time())])
    done = Finished(finish_reason="length", prompt_tokens=3, completion_tokens=8)
    usage = usage_for(requeued, status=Status.OK, finished_at=time.time(), completion_tokens=8)
    assert await r.finisher.finalize(job=requeued, terminal=done, usage=usage)
    lost = job_new(second, tenant=tenant)
    assert await r.front.enqueue(lost) is None
    await r.leases.claim(deployment=second, count=1, lease_seconds=0.05)
    await r.finisher.publish(job=lost, events=[Started(at=time.time())])
    time.sleep(0.1)
    assert await reaper.reclaim_expired(deployment=second) == 1
    events = await r.front.read_events(
        deployment=second, request_id=lost.request_id, after="0-0", block_ms=100
    )
    assert isinstance(events[-1][1], Failed)

    # The ingester's one read of every deployment's usage stream (two slots here).
    read = await r.usage.read_usage(
        deployments=[first, second], consumer="c", count=100, block_ms=100
    )
    assert {(entry[0], entry[2].request_id) for entry in read} >= {
        (first, requeued.request_id),
        (second, lost.request_id),
    }
    await r.usage.ack_usage(entries=[(entry[0], entry[1]) for entry in read])
    for deployment in (first, second):  # acknowledged and deleted on both primaries
        assert await client.xlen(usage_key(deployment)) == 0

    # A tenant's limits: QUOTA_PEEK, QUOTA_TAKE_REQUEST, QUOTA_ADMIT, QUOTA_RELEASE and
    # QUOTA_TAKE_BYTES.
    quotas = Quotas(client)
    assert await quotas.take_body_bytes(tenant_id=tenant, size=2 << 20, per_minute=4 << 20) == 0
    limits = Limits(
        requests_per_minute=100,
        tokens_per_minute=100_000,
        max_concurrency=10,
        monthly_budget=Decimal(100),
    )
    assert (await quotas.peek(tenant_id=tenant, limits=limits)).admitted
    assert (await quotas.take_request(tenant_id=tenant, limits=limits)).admitted
    now = time.time()
    decision = await quotas.admit(
        tenant_id=tenant,
        request_id="q1",
        limits=limits,
        reserve=Usage(tokens=20, cost_micros=5),
        lease_seconds=30,
        spent_this_month=0,
        now=now,
        request_taken=True,
    )
    assert decision is not None and decision.admitted
    assert await quotas.release(
        tenant_id=tenant, request_id="q1", admitted_at=now, used=Usage(tokens=10, cost_micros=2)
    )
    assert await client.exists(quota_keys(tenant, "q1", month_of(now)).held) == 0

    # The Idempotency-Key scripts (BEGIN, BIND, TAKE, RELEASE), and SHUT_OUT in the slot of
    # the deployment. Request i1 is bound to its key, then stalls before it is queued.
    keys = Idempotency(client)
    assert await keys.begin(tenant_id=tenant, key="k", digest="d", request_id="i1") is None
    stalled = msgspec.structs.replace(job_new(second, tenant=tenant), request_id="i1")
    original = Original(
        request_id="i1",
        deployment=second,
        model="m",
        version="1",
        created=int(time.time()),
        deadline=time.time() + 60,
    )
    await keys.bind(tenant_id=tenant, key="k", original=original)
    monkeypatch.setattr(idempotency, "BIND_GRACE_SECONDS", 0.0)

    async def never(_original: Original) -> None:
        raise AssertionError("a request that was never queued is not replayed")

    # A retry fences i1 out and takes the key; i1's enqueue is then refused.
    assert (
        await keys.replayed_or_claimed(
            tenant_id=tenant, key="k", digest="d", replay=never, request_id="i2"
        )
        is None
    )
    assert await r.front.enqueue(stalled) == Refused(Refusal.SHUT_OUT)
    await keys.release(tenant_id=tenant, key="k", request_id="i1")  # not i1's any more
    assert await client.hget(record_key(tenant, "k"), "owner") == b"i2"
    await keys.release(tenant_id=tenant, key="k", request_id="i2")
    assert await keys.begin(tenant_id=tenant, key="k", digest="d", request_id="i3") is None

    # AUTOSCALE_HYSTERESIS over the blocking cluster client.
    blocking = redis.RedisCluster.from_url(cluster.url)
    try:
        snapshot = QueueSnapshot(
            waiting={"interactive": 4},
            oldest_age={"interactive": 1.0},
            backlog_tokens=1000,
            running=1,
            live_workers=1,
            slots_per_worker=4,
            tokens_per_second=100.0,
            ingest_lag_events=0,
            ingest_lag_seconds=0.0,
        )
        policy = ScalingPolicy(target_wait_seconds=1.0, min_replicas=1, max_replicas=8)
        assert (
            Autoscaler(cast(redis.Redis, blocking), scale_down_seconds=60).desired(
                deployment=first, snapshot=snapshot, policy=policy, now=time.time()
            )
            >= 1
        )
    finally:
        blocking.close()

    assert _loaded(cluster) == set(_scripts())
