"""The Redis data plane against a real Valkey server: exactly-once finish, cancel, reaping."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgspec
import pytest

from dataplane.frontdoor import Refusal, Refused
from dataplane.keys import cancel_key, ledger_field, ledger_key, reply_key, usage_key
from dataplane.leases import ClaimAsk, Claimed
from dataplane.reaper import Reaper
from dataplane.redis_client import redis_client_new
from dataplane.snapshots import Depth
from dataplane.types import (
    Delta,
    Failed,
    Finished,
    Job,
    Started,
    Status,
    usage_decoder,
    usage_for,
)
from tests.dataplane.roles import Roles, roles
from tests.jobs import job_new


@pytest.fixture
async def dispatch():
    client = redis_client_new()
    yield roles(client, reply_ttl=60)
    await client.aclose()


async def _served_deployment(dispatch: Roles) -> str:
    """Return a fresh deployment with one live worker heartbeat."""
    deployment = f"t-{uuid.uuid4().hex[:8]}"
    await dispatch.usage.ensure_groups(deployment)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60)
    return deployment


async def _usage(dispatch: Roles, deployment: str):
    entries: Any = await dispatch.redis.xrange(usage_key(deployment))
    return [usage_decoder.decode(fields[b"u"]) for _, fields in entries]


async def _terminal(dispatch: Roles, job: Job):
    events = await dispatch.front.read_events(
        deployment=job.deployment, request_id=job.request_id, after="0-0", block_ms=100
    )
    return events[-1][1]


async def test_a_request_is_finished_exactly_once(dispatch):
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    assert await dispatch.front.enqueue(job) is None
    claimed = await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)
    assert [j.request_id for j in claimed.run] == [job.request_id]
    usage = usage_for(job, status=Status.OK, finished_at=time.time(), completion_tokens=8)
    done = Finished(finish_reason="length", prompt_tokens=3, completion_tokens=8)
    assert await dispatch.finisher.finalize(job=job, terminal=done, usage=usage)
    assert not await dispatch.finisher.finalize(job=job, terminal=done, usage=usage)
    assert len(await _usage(dispatch, deployment)) == 1
    assert await dispatch.redis.hlen(f"sy:{{{deployment}}}:jobs") == 0
    assert await dispatch.redis.zcard(f"sy:{{{deployment}}}:leases") == 0


async def test_a_request_id_is_queued_once_however_often_it_is_submitted(dispatch):
    """A second submission of a queued, running or ended request queues nothing: it follows.

    A batch step that takes over a line whose first submission stalled past the lease submits
    it again under the same id, and the stalled one may still reach the queue after it.
    """
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    ledger = ledger_key(deployment)
    admitted = ledger_field(job.enqueued_at, "admitted")
    assert await dispatch.front.enqueue(job) is None
    # Queued: the second submission is answered as queued, and nothing is added.
    assert await dispatch.front.enqueue(job) is None
    assert await dispatch.depth(deployment) == Depth(requests=1, tokens=job.reserved_tokens)
    assert int(await dispatch.redis.hget(ledger, admitted)) == 1
    # Running: still one job, claimed once.
    claimed = await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)
    assert [j.request_id for j in claimed.run] == [job.request_id]
    assert await dispatch.front.enqueue(job) is None
    again = await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)
    assert again.run == []
    # Ended: the late submission finds its end instead of running it again.
    usage = usage_for(job, status=Status.OK, finished_at=time.time(), completion_tokens=2)
    done = Finished(finish_reason="length", prompt_tokens=3, completion_tokens=2)
    assert await dispatch.finisher.finalize(job=job, terminal=done, usage=usage)
    assert await dispatch.front.enqueue(job) is None
    assert (await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)).run == []
    assert await dispatch.depth(deployment) == Depth(requests=0, tokens=0)
    assert int(await dispatch.redis.hget(ledger, admitted)) == 1
    assert len(await _usage(dispatch, deployment)) == 1
    # Its whereabouts still name it, so the late submitter follows it to its end.
    where = await dispatch.front.whereabouts(job.request_id)
    assert where is not None and where.deployment == deployment
    assert await _terminal(dispatch, job) == done


async def test_a_request_ended_before_it_was_queued_is_not_queued_late(dispatch):
    """A submission its frontend gave up on is ended by id; a late enqueue of it runs nothing."""
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    assert await dispatch.front.abandon(job)
    assert await dispatch.front.enqueue(job) is None
    assert (await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)).run == []
    assert len(await _usage(dispatch, deployment)) == 1


async def test_cancelling_a_queued_job_finishes_it_without_a_worker(dispatch):
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    assert await dispatch.front.cancel(job=job)
    claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5)
    assert claimed.run == [] and claimed.expired == []
    [usage] = await _usage(dispatch, deployment)
    assert usage.status == Status.CANCELLED and usage.completion_tokens == 0
    assert isinstance(await _terminal(dispatch, job), Failed)
    assert await dispatch.depth(deployment) == Depth(requests=0, tokens=0)


async def test_cancelling_a_claimed_job_leaves_it_to_its_worker(dispatch):
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5)
    assert not await dispatch.front.cancel(job=job)
    # Flagged, and told to the worker as a message: its worker stops it.
    assert await dispatch.redis.exists(cancel_key(deployment, job.request_id))
    assert await _usage(dispatch, deployment) == []


async def test_a_claim_names_the_jobs_it_took_that_were_cancelled_before(dispatch):
    deployment = await _served_deployment(dispatch)
    flagged, other = job_new(deployment), job_new(deployment)
    # A cancel that came before its job was queued leaves a flag for the claim to find.
    await dispatch.redis.set(cancel_key(deployment, flagged.request_id), "1", ex=60)
    for job in (flagged, other):
        await dispatch.front.enqueue(job)
    claimed = await dispatch.leases.claim(deployment=deployment, count=2, lease_seconds=5)
    assert {job.request_id for job in claimed.run} == {flagged.request_id, other.request_id}
    assert claimed.cancelled == {flagged.request_id}
    assert (await dispatch.leases.claim(deployment=deployment, count=2, lease_seconds=5)) == (
        Claimed(run=[], expired=[], drained=True, cancelled=frozenset())
    )


async def test_the_reaper_requeues_a_job_that_never_started(dispatch):
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=0.1)
    await asyncio.sleep(0.2)
    assert await dispatch.reaper.reclaim_expired(deployment=deployment) == 1
    again = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5)
    assert [j.request_id for j in again.run] == [job.request_id]


async def test_the_reaper_ends_a_started_job_and_bills_what_it_produced(dispatch):
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=0.1)
    await dispatch.finisher.publish(
        job=job, events=[Started(at=time.time()), Delta("ab", 2), Delta("c", 1)]
    )
    await asyncio.sleep(0.2)
    await dispatch.reaper.reclaim_expired(deployment=deployment)
    terminal = await _terminal(dispatch, job)
    assert isinstance(terminal, Failed) and terminal.code == "worker_lost"
    [usage] = await _usage(dispatch, deployment)
    assert usage.status == Status.WORKER_LOST and usage.completion_tokens == 3
    assert await dispatch.redis.ttl(reply_key(deployment, job.request_id)) > 0


async def test_a_renewed_lease_is_not_reaped(dispatch):
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=0.25)
    await asyncio.sleep(0.15)
    await dispatch.leases.heartbeat(
        deployment=deployment, worker="w", ttl=5, leased=[job.request_id]
    )
    await asyncio.sleep(0.15)
    assert await dispatch.reaper.reclaim_expired(deployment=deployment) == 0


async def test_a_lease_that_lapsed_before_the_server_was_up_a_lease_is_not_reaped(dispatch):
    """After a Redis restart its workers get a whole lease of the server's uptime to renew."""
    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=0.1)
    await dispatch.finisher.publish(job=job, events=[Started(at=time.time())])
    await asyncio.sleep(0.2)
    info: Any = await dispatch.redis.info("server")
    up = float(info["uptime_in_seconds"])
    # A lease longer than the server has been up: as if it had just restarted.
    fresh = Reaper(dispatch.redis, reply_ttl=60, lease_seconds=up + 3600)
    assert await fresh.reclaim_expired(deployment=deployment) == 0
    settled = Reaper(dispatch.redis, reply_ttl=60, lease_seconds=0.1)
    assert await settled.reclaim_expired(deployment=deployment) == 1
    assert isinstance(await _terminal(dispatch, job), Failed)


async def test_nothing_is_enqueued_for_a_deployment_without_live_workers(dispatch):
    deployment = f"t-{uuid.uuid4().hex[:8]}"
    assert await dispatch.front.enqueue(job_new(deployment)) == Refused(Refusal.NO_WORKER)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60)
    assert await dispatch.front.enqueue(job_new(deployment)) is None
    await dispatch.leases.leave(deployment=deployment, worker="w")
    assert await dispatch.front.enqueue(job_new(deployment)) == Refused(Refusal.NO_WORKER)


async def test_a_full_queue_refuses_at_once_and_claimed_jobs_do_not_count(dispatch):
    deployment = await _served_deployment(dispatch)
    queued = [job_new(deployment) for _ in range(2)]
    for job in queued:
        assert await dispatch.front.enqueue(job, max_queued=2) is None
    refused = job_new(deployment)
    assert await dispatch.front.enqueue(refused, max_queued=2) == Refused(Refusal.QUEUE_FULL)
    # A queued request can be found by id; a refused one left nothing behind.
    assert await dispatch.front.whereabouts(queued[0].request_id) is not None
    assert await dispatch.front.whereabouts(refused.request_id) is None
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5)
    assert await dispatch.front.enqueue(job_new(deployment), max_queued=2) is None


async def test_free_slots_take_jobs_beyond_the_queue_bound(dispatch):
    deployment = await _served_deployment(dispatch)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60, slots=(2, 0))
    # With no waiting allowed, a job is admitted only while a slot is free for it.
    assert await dispatch.front.enqueue(job_new(deployment), max_queued=0) is None
    assert await dispatch.front.enqueue(job_new(deployment), max_queued=0) is None
    assert await dispatch.front.enqueue(job_new(deployment), max_queued=0) == Refused(
        Refusal.QUEUE_FULL
    )
    claimed = await dispatch.leases.claim(deployment=deployment, count=2, lease_seconds=5)
    assert await dispatch.front.enqueue(job_new(deployment), max_queued=0) == Refused(
        Refusal.QUEUE_FULL
    )
    usage = usage_for(claimed.run[0], status=Status.OK, finished_at=time.time())
    done = Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=0)
    await dispatch.finisher.finalize(job=claimed.run[0], terminal=done, usage=usage)
    assert await dispatch.front.enqueue(job_new(deployment), max_queued=0) is None


async def test_reserved_slots_count_as_free_only_for_a_tenant_with_nothing_running(dispatch):
    deployment = await _served_deployment(dispatch)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60, slots=(1, 1))
    assert await dispatch.front.enqueue(job_new(deployment, tenant=1), max_queued=0) is None
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5)
    refused = await dispatch.front.enqueue(job_new(deployment, tenant=1), max_queued=0)
    assert refused == Refused(Refusal.QUEUE_FULL)
    assert await dispatch.front.enqueue(job_new(deployment, tenant=2), max_queued=0) is None


async def test_queued_tokens_are_bounded_too(dispatch):
    deployment = await _served_deployment(dispatch)
    # Each job reserves 3 prompt + 8 completion tokens.
    assert await dispatch.front.enqueue(job_new(deployment), max_queued_tokens=22) is None
    assert await dispatch.front.enqueue(job_new(deployment), max_queued_tokens=22) is None
    refused = await dispatch.front.enqueue(job_new(deployment), max_queued_tokens=22)
    assert refused == Refused(Refusal.QUEUE_FULL)
    assert await dispatch.depth(deployment) == Depth(requests=2, tokens=22)


async def test_a_deadline_the_backlog_cannot_meet_is_refused_with_an_estimate(dispatch):
    deployment = await _served_deployment(dispatch)
    # The worker finishes 11 reserved tokens a second: one queued job is a second of work.
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60, tokens_per_second=11)
    for _ in range(3):
        assert await dispatch.front.enqueue(job_new(deployment)) is None
    hurried = job_new(deployment, timeout=2.0)
    refused = await dispatch.front.enqueue(hurried)
    assert refused is not None and refused.reason is Refusal.DEADLINE_UNATTAINABLE
    assert 2500 <= refused.estimated_wait_ms <= 3500
    assert await dispatch.front.enqueue(job_new(deployment, timeout=10.0)) is None


async def test_a_job_that_would_finish_late_is_refused_only_when_asked(dispatch):
    """A tenant that caps output asks for the finish check; the refusal carries what the cap
    is computed from (inference/pipeline/capping.py)."""
    deployment = await _served_deployment(dispatch)
    # Two slots share 22 reserved tokens a second: one job's token takes 1/11 s.
    await dispatch.leases.heartbeat(
        deployment=deployment, worker="w", ttl=60, slots=(2, 0), tokens_per_second=22
    )
    late = job_new(deployment, max_tokens=30, timeout=2.0)  # 33 tokens: 3 s
    refused = await dispatch.front.enqueue(late, finish_by=True)
    assert refused is not None and refused.reason is Refusal.FINISHES_LATE
    assert refused.estimated_wait_ms == 0
    assert refused.seconds_per_token == pytest.approx(1 / 11, abs=1e-6)
    assert await dispatch.depth(deployment) == Depth(requests=0, tokens=0)
    # Unasked, it is queued as any other tenant's would be.
    assert await dispatch.front.enqueue(late) is None
    # One that finishes in time (11 tokens: 1 s) is queued when asked too.
    in_time = job_new(deployment, tenant=2, timeout=2.0)
    assert await dispatch.front.enqueue(in_time, finish_by=True) is None


async def test_a_wait_past_the_deadline_is_refused_as_unattainable_when_asked_too(dispatch):
    deployment = await _served_deployment(dispatch)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60, tokens_per_second=11)
    for _ in range(3):
        assert await dispatch.front.enqueue(job_new(deployment)) is None
    refused = await dispatch.front.enqueue(job_new(deployment, timeout=2.0), finish_by=True)
    assert refused is not None and refused.reason is Refusal.DEADLINE_UNATTAINABLE


async def test_another_tenants_backlog_delays_only_by_its_fair_share(dispatch):
    deployment = await _served_deployment(dispatch)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60, tokens_per_second=11)
    for _ in range(20):  # twenty seconds of another tenant's work
        assert await dispatch.front.enqueue(job_new(deployment, tenant=2)) is None
    # Alone in its queue, tenant 1 waits for about one of tenant 2's jobs, not twenty.
    assert await dispatch.front.enqueue(job_new(deployment, tenant=1, timeout=3.0)) is None


async def test_a_job_whose_deadline_passed_in_queue_is_never_run(dispatch):
    deployment = await _served_deployment(dispatch)
    late = job_new(deployment, timeout=0.05)
    fresh = job_new(deployment)
    await dispatch.front.enqueue(late)
    await dispatch.front.enqueue(fresh)
    await asyncio.sleep(0.1)
    claimed = await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)
    assert [j.request_id for j in claimed.run] == [fresh.request_id]
    assert [j.request_id for j in claimed.expired] == [late.request_id]


async def test_the_reaper_ends_queued_jobs_past_their_deadline(dispatch):
    deployment = await _served_deployment(dispatch)
    late = job_new(deployment, timeout=0.05)
    await dispatch.front.enqueue(late)
    await asyncio.sleep(0.1)
    assert await dispatch.reaper.expire_queued(deployment=deployment) == 1
    terminal = await _terminal(dispatch, late)
    assert isinstance(terminal, Failed) and terminal.code == "deadline_exceeded"
    [usage] = await _usage(dispatch, deployment)
    assert usage.status == Status.TIMEOUT
    assert await dispatch.depth(deployment) == Depth(requests=0, tokens=0)


async def test_a_running_job_handed_on_is_carried_on_by_another_worker_and_billed_once(dispatch):
    from dataplane.types import Resumed

    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    [claimed] = (
        await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5, worker="w")
    ).run
    await dispatch.finisher.publish(job=claimed, events=[Started(at=1.0), Delta("ab", 2)])
    carried = msgspec.structs.replace(
        claimed, resumed=Resumed(token_ids=[7, 8], started_at=1.0, first_token_at=1.5)
    )
    # Only the worker that runs it may hand it on.
    assert not await dispatch.leases.hand_on(worker="someone-else", job=carried)
    assert await dispatch.leases.hand_on(worker="w", job=carried)
    assert await dispatch.depth(deployment) == Depth(requests=1, tokens=job.reserved_tokens)
    [again] = (
        await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5, worker="w2")
    ).run
    assert again.resumed == carried.resumed and again.resumed_tokens == 2
    done = Finished(finish_reason="length", prompt_tokens=3, completion_tokens=8)
    usage = usage_for(again, status=Status.OK, finished_at=time.time(), completion_tokens=8)
    assert await dispatch.finisher.finalize(job=again, terminal=done, usage=usage)
    [record] = await _usage(dispatch, deployment)
    assert (record.status, record.completion_tokens) == (Status.OK, 8)


async def test_a_handed_on_job_cancelled_while_queued_bills_what_it_had_produced(dispatch):
    from dataplane.types import Resumed

    deployment = await _served_deployment(dispatch)
    job = job_new(deployment)
    await dispatch.front.enqueue(job)
    await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5, worker="w")
    carried = msgspec.structs.replace(
        job, resumed=Resumed(token_ids=[7, 8, 9], started_at=time.time())
    )
    assert await dispatch.leases.hand_on(worker="w", job=carried)
    # The client's copy of the job knows nothing of it; the stored one does.
    assert await dispatch.front.cancel(job=job)
    [record] = await _usage(dispatch, deployment)
    assert (record.status, record.completion_tokens) == (Status.CANCELLED, 3)
    terminal = await _terminal(dispatch, job)
    assert isinstance(terminal, Failed) and terminal.completion_tokens == 3


async def test_an_idle_workers_claim_runs_the_moment_a_job_is_queued(dispatch):
    """The claim goes behind the blocking pop in one round trip: the enqueue's wake runs it."""
    deployment = await _served_deployment(dispatch)
    waiting = asyncio.create_task(
        dispatch.leases.wait_then_claim(
            deployment=deployment, timeout=20, ask=ClaimAsk(count=4, lease_seconds=5, worker="w")
        )
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()  # nothing queued: it waits
    job = job_new(deployment)
    assert await dispatch.front.enqueue(job) is None
    claimed = await asyncio.wait_for(waiting, timeout=10)  # long before the pop's timeout
    assert [j.request_id for j in claimed.run] == [job.request_id]
    leases = f"sy:{{{deployment}}}:leases"
    assert await dispatch.redis.zscore(leases, job.request_id) is not None  # leased to it
    assert (await dispatch.depth(deployment)).requests == 0


async def test_a_claim_says_whether_it_left_the_queue_empty(dispatch):
    """What a worker decides its next claim by: wait for work, or claim again at once."""
    deployment = await _served_deployment(dispatch)
    first, second = job_new(deployment), job_new(deployment)
    for job in (first, second):
        assert await dispatch.front.enqueue(job) is None
    claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=5)
    assert [j.request_id for j in claimed.run] == [first.request_id]
    assert not claimed.drained  # the second waits still
    waited = await dispatch.leases.wait_then_claim(
        deployment=deployment, timeout=5, ask=ClaimAsk(count=4, lease_seconds=5, worker="w")
    )
    assert [j.request_id for j in waited.run] == [second.request_id]
    assert waited.drained
    empty = await dispatch.leases.claim(deployment=deployment, count=4, lease_seconds=5)
    assert (empty.run, empty.drained) == ([], True)


async def test_a_woken_idle_worker_runs_its_claim_and_reads_its_answer(dispatch):
    """A drain, a job handed here or a freed slot wakes the pending pop rather than cutting it
    off: its claim runs, and what it leased reaches the worker."""
    deployment = await _served_deployment(dispatch)
    waiting = asyncio.create_task(
        dispatch.leases.wait_then_claim(
            deployment=deployment, timeout=20, ask=ClaimAsk(count=4, lease_seconds=5, worker="w")
        )
    )
    await asyncio.sleep(0.2)
    await dispatch.leases.wake(deployment=deployment, worker="w")
    claimed = await asyncio.wait_for(waiting, timeout=10)
    assert claimed.run == [] and claimed.expired == []
    # One token wakes it once: the next wait waits for work again.
    again = asyncio.create_task(
        dispatch.leases.wait_then_claim(
            deployment=deployment, timeout=20, ask=ClaimAsk(count=4, lease_seconds=5, worker="w")
        )
    )
    await asyncio.sleep(0.2)
    assert not again.done()
    job = job_new(deployment)
    assert await dispatch.front.enqueue(job) is None
    assert [j.request_id for j in (await asyncio.wait_for(again, timeout=10)).run] == [
        job.request_id
    ]
