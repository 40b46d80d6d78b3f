"""The autoscaling signal over a real Redis queue: it rises with backlog, falls with hysteresis."""

from __future__ import annotations

import time
import uuid

import pytest

from dataplane.autoscale import Autoscaler, ScalingPolicy, replicas_needed
from dataplane.redis_client import pipeline_execute, redis_client_new, redis_sync_client
from dataplane.snapshots import QueueSnapshot, queue_snapshot_sync
from dataplane.types import Finished, Job, Status, usage_for
from tests.dataplane.roles import Roles, roles
from tests.jobs import job_new

POLICY = ScalingPolicy(target_wait_seconds=2.0, min_replicas=1, max_replicas=10)


def _snapshot(**fields: object) -> QueueSnapshot:
    base: dict[str, object] = {
        "waiting": {"interactive": 0, "batch": 0},
        "oldest_age": {"interactive": 0.0, "batch": 0.0},
        "backlog_tokens": 0,
        "running": 0,
        "live_workers": 1,
        "slots_per_worker": 8.0,
        "tokens_per_second": 1000.0,
        "ingest_lag_events": 0,
        "ingest_lag_seconds": 0.0,
    }
    return QueueSnapshot(**{**base, **fields})  # type: ignore[arg-type]


def test_the_raw_signal_counts_running_work_and_the_backlog_to_drain():
    # 16 running on 8-slot workers = 2 busy; 6,000 tokens at 1,000/s within 2 s = 3 more.
    assert replicas_needed(_snapshot(running=16, backlog_tokens=6000), POLICY) == 5
    assert replicas_needed(_snapshot(running=0, backlog_tokens=0), POLICY) == 1  # warm pool
    assert replicas_needed(_snapshot(running=80, backlog_tokens=10**9), POLICY) == 10  # ceiling


def test_a_retired_deployment_wants_no_workers():
    assert replicas_needed(_snapshot(running=16, backlog_tokens=6000, retiring=True), POLICY) == 0


def test_without_a_measured_rate_it_holds_at_the_live_workers():
    snap = _snapshot(live_workers=3, tokens_per_second=None, backlog_tokens=10**6)
    assert replicas_needed(snap, POLICY) == 3


def test_queued_work_with_no_worker_asks_for_one_even_with_an_empty_warm_pool():
    snap = _snapshot(live_workers=0, tokens_per_second=None, waiting={"interactive": 2, "batch": 0})
    policy = ScalingPolicy(target_wait_seconds=2.0, min_replicas=0, max_replicas=4)
    assert replicas_needed(snap, policy) == 1
    assert replicas_needed(_snapshot(live_workers=0, tokens_per_second=None), policy) == 0


def _job(deployment: str, *, tokens: int, priority: str = "interactive") -> Job:
    """A job reserving `tokens` (100 of them for its completion), queued three seconds ago."""
    return job_new(
        deployment,
        prompt=[1] * (tokens - 100),
        max_tokens=100,
        priority=priority,
        timeout=600,
        queued_for=3.0,
    )


@pytest.fixture
def sync_client():
    return redis_sync_client()


async def test_the_signal_rises_with_backlog_and_falls_only_after_the_window(sync_client):
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = f"scale-{uuid.uuid4().hex[:8]}"
    await dispatch.usage.ensure_groups(deployment)
    # One worker with 8 shared slots that measured 1,000 reserved tokens/s while full.
    await dispatch.leases.heartbeat(
        deployment=deployment, worker="w1", ttl=60, slots=(8, 0), tokens_per_second=1000.0
    )
    scaler = Autoscaler(sync_client, scale_down_seconds=300)
    now = time.time()

    def desired(at: float) -> int:
        snap = queue_snapshot_sync(sync_client, deployment)
        return scaler.desired(deployment=deployment, snapshot=snap, policy=POLICY, now=at)

    assert desired(now) == 1
    # 12 queued jobs of 500 reserved tokens: 6,000 tokens to clear within 2 s at 1,000/s.
    jobs = [_job(deployment, tokens=500) for _ in range(12)]
    for job in jobs:
        assert await dispatch.front.enqueue(job) is None
    snap = queue_snapshot_sync(sync_client, deployment)
    assert snap.waiting == {"interactive": 12, "batch": 0}
    assert snap.backlog_tokens == 6000
    assert snap.oldest_age["interactive"] >= 2.9
    assert snap.live_workers == 1 and snap.slots_per_worker == 8
    assert desired(now + 1) == 3

    # Workers take the jobs: 12 running on 8-slot workers still need 2.
    claimed = await dispatch.leases.claim(deployment=deployment, count=12, lease_seconds=60)
    assert len(claimed.run) == 12
    assert queue_snapshot_sync(sync_client, deployment).running == 12
    assert desired(now + 1.5) == 3  # lower raw (2), but the signal holds

    # They finish: the raw value drops to the warm pool; the signal holds for the window.
    await _finish(dispatch, claimed.run)
    snap = queue_snapshot_sync(sync_client, deployment)
    assert snap.backlog_tokens == 0 and snap.running == 0
    assert desired(now + 2) == 3
    assert desired(now + 200) == 3
    # A burst inside the window (4,000 tokens: raw 2) raises the floor it falls to.
    burst = [_job(deployment, tokens=500) for _ in range(8)]
    for job in burst:
        assert await dispatch.front.enqueue(job) is None
    assert desired(now + 250) == 3
    await _finish(
        dispatch,
        (await dispatch.leases.claim(deployment=deployment, count=8, lease_seconds=60)).run,
    )
    assert desired(now + 260) == 3
    # The window that began when raw first fell (now + 1.5) is over: down to its highest raw.
    assert desired(now + 302) == 2
    assert desired(now + 400) == 2
    assert desired(now + 603) == 1  # a second quiet window: down to the warm pool
    await client.aclose()


async def _finish(dispatch: Roles, jobs: list[Job]) -> None:
    async with dispatch.redis.pipeline(transaction=False) as pipe:
        for job in jobs:
            terminal = Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1)
            usage = usage_for(job, status=Status.OK, finished_at=time.time())
            await dispatch.finisher.finalize_into(pipe, job=job, terminal=terminal, usage=usage)
        # As the worker runs it: a script this server has not seen yet runs by its text.
        await pipeline_execute(pipe)
