"""The Redis data plane against a real Valkey server: exactly-once finish, cancel, reaping."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aredis
from django.conf import settings

from inference.dispatch import Dispatch, Refusal, reply_key, usage_for, usage_key
from inference.types import Delta, Failed, Finished, Job, Sampling, Started, Status, usage_decoder


@pytest.fixture
async def dispatch():
    client = aredis.Redis.from_url(settings.REDIS_URL)
    yield Dispatch(client, reply_ttl=60)
    await client.aclose()


def _job(deployment: str) -> Job:
    now = time.time()
    return Job(
        request_id=uuid.uuid4().hex,
        tenant_id=1,
        api_key_id=1,
        deployment=deployment,
        model_version="v",
        endpoint="completions",
        prompt_token_ids=[1, 2, 3],
        sampling=Sampling(max_tokens=8),
        enqueued_at=now,
        deadline=now + 60,
    )


async def _served_deployment(dispatch: Dispatch) -> str:
    """Return a fresh deployment with one live worker heartbeat."""
    deployment = f"t-{uuid.uuid4().hex[:8]}"
    await dispatch.ensure_groups(deployment)
    await dispatch.heartbeat(deployment=deployment, worker="w", ttl=60)
    return deployment


async def _usage(dispatch: Dispatch, deployment: str):
    entries: Any = await dispatch.redis.xrange(usage_key(deployment))
    return [usage_decoder.decode(fields[b"u"]) for _, fields in entries]


async def _terminal(dispatch: Dispatch, job: Job):
    events = await dispatch.read_events(
        deployment=job.deployment, request_id=job.request_id, after="0-0", block_ms=100
    )
    return events[-1][1]


async def test_a_request_is_finished_exactly_once(dispatch):
    deployment = await _served_deployment(dispatch)
    job = _job(deployment)
    await dispatch.enqueue(job)
    [claimed] = await dispatch.claim(deployment=deployment, worker="w1", count=4, block_ms=100)
    usage = usage_for(job, status=Status.OK, finished_at=time.time(), completion_tokens=8)
    done = Finished(finish_reason="length", prompt_tokens=3, completion_tokens=8)
    assert await dispatch.finalize(job=job, entry_id=claimed.entry_id, terminal=done, usage=usage)
    assert not await dispatch.finalize(
        job=job, entry_id=claimed.entry_id, terminal=done, usage=usage
    )
    assert len(await _usage(dispatch, deployment)) == 1
    assert await dispatch.redis.xlen(f"sy:{{{deployment}}}:jobs") == 0


async def test_cancelling_a_queued_job_finishes_it_without_a_worker(dispatch):
    deployment = await _served_deployment(dispatch)
    job = _job(deployment)
    entry = await dispatch.enqueue(job)
    assert await dispatch.cancel(job=job, entry_id=entry)
    assert await dispatch.claim(deployment=deployment, worker="w", count=1, block_ms=50) == []
    [usage] = await _usage(dispatch, deployment)
    assert usage.status == Status.CANCELLED and usage.completion_tokens == 0
    assert isinstance(await _terminal(dispatch, job), Failed)


async def test_cancelling_a_claimed_job_leaves_it_to_its_worker(dispatch):
    deployment = await _served_deployment(dispatch)
    job = _job(deployment)
    entry = await dispatch.enqueue(job)
    await dispatch.claim(deployment=deployment, worker="w", count=1, block_ms=50)
    assert not await dispatch.cancel(job=job, entry_id=entry)
    assert await dispatch.cancelled(deployment=deployment, request_ids=[job.request_id]) == {
        job.request_id
    }
    assert await _usage(dispatch, deployment) == []


async def test_the_reaper_requeues_a_job_that_never_started(dispatch):
    deployment = await _served_deployment(dispatch)
    job = _job(deployment)
    await dispatch.enqueue(job)
    await dispatch.claim(deployment=deployment, worker="dead", count=1, block_ms=50)
    await asyncio.sleep(0.2)
    assert await dispatch.reclaim_expired(deployment=deployment, lease_seconds=0.1) == 1
    [again] = await dispatch.claim(deployment=deployment, worker="alive", count=1, block_ms=50)
    assert again.job.request_id == job.request_id


async def test_the_reaper_ends_a_started_job_and_bills_what_it_produced(dispatch):
    deployment = await _served_deployment(dispatch)
    job = _job(deployment)
    await dispatch.enqueue(job)
    await dispatch.claim(deployment=deployment, worker="dead", count=1, block_ms=50)
    await dispatch.publish(job=job, events=[Started(at=time.time()), Delta("ab", 2), Delta("c", 1)])
    await asyncio.sleep(0.2)
    await dispatch.reclaim_expired(deployment=deployment, lease_seconds=0.1)
    terminal = await _terminal(dispatch, job)
    assert isinstance(terminal, Failed) and terminal.code == "worker_lost"
    [usage] = await _usage(dispatch, deployment)
    assert usage.status == Status.WORKER_LOST and usage.completion_tokens == 3
    assert await dispatch.redis.ttl(reply_key(deployment, job.request_id)) > 0


async def test_a_renewed_lease_is_not_reaped(dispatch):
    deployment = await _served_deployment(dispatch)
    await dispatch.enqueue(_job(deployment))
    [claimed] = await dispatch.claim(deployment=deployment, worker="w", count=1, block_ms=50)
    await asyncio.sleep(0.3)
    await dispatch.renew(deployment=deployment, worker="w", entry_ids=[claimed.entry_id])
    assert await dispatch.reclaim_expired(deployment=deployment, lease_seconds=0.25) == 0


async def test_nothing_is_enqueued_for_a_deployment_without_live_workers(dispatch):
    deployment = f"t-{uuid.uuid4().hex[:8]}"
    assert await dispatch.enqueue(_job(deployment)) is Refusal.NO_WORKER
    await dispatch.heartbeat(deployment=deployment, worker="w", ttl=60)
    assert isinstance(await dispatch.enqueue(_job(deployment)), str)
    await dispatch.leave(deployment=deployment, worker="w")
    assert await dispatch.enqueue(_job(deployment)) is Refusal.NO_WORKER


async def test_a_full_queue_refuses_at_once_and_claimed_jobs_do_not_count(dispatch):
    deployment = await _served_deployment(dispatch)
    for _ in range(2):
        assert isinstance(await dispatch.enqueue(_job(deployment), max_queued=2), str)
    assert await dispatch.enqueue(_job(deployment), max_queued=2) is Refusal.QUEUE_FULL
    await dispatch.claim(deployment=deployment, worker="w", count=1, block_ms=50)
    assert isinstance(await dispatch.enqueue(_job(deployment), max_queued=2), str)
