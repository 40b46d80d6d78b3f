"""A worker's long-lived loops start again when they fail, against a real Valkey server."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from dataplane.background import loops_failing, supervise
from dataplane.keys import cancel_key, reply_key
from dataplane.redis_client import redis_client_new
from dataplane.types import Delta, Failed, Job, Started
from tests.dataplane.roles import Roles, roles
from tests.jobs import job_new
from workers.batcher import CostModel, DynamicBatcher
from workers.runner import Worker


def _failures(loop: str) -> float:
    return REGISTRY.get_sample_value("roundhouse_loop_failures_total", {"loop": loop}) or 0.0


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _read(dispatch: Roles, deployment: str, request_id: str, *, count: int) -> list:
    """A request's reply events from its start, once `count` are there (10 s at most)."""
    seen: list = []
    deadline = time.monotonic() + 10
    while len(seen) < count and time.monotonic() < deadline:
        after = seen[-1][0] if seen else "0-0"
        seen += await dispatch.front.read_events(
            deployment=deployment, request_id=request_id, after=after, block_ms=1000
        )
    return seen


class _Engine:
    async def health(self) -> None:
        return None

    def kv_cache_usage(self) -> float | None:
        return 0.0


class _IdleWorker(Worker):
    """A worker whose queue stays empty: only its own loops run."""

    async def _serve(self, job: Job) -> None:
        raise AssertionError("nothing is queued")


@pytest.fixture
async def dispatch():
    client = redis_client_new()
    yield roles(client, reply_ttl=60)
    await client.aclose()


def _worker(dispatch: Roles, deployment: str) -> _IdleWorker:
    return _IdleWorker(
        deployment=deployment,
        engine=_Engine(),
        client=dispatch.redis,
        reply_ttl=dispatch.reply_ttl,
        worker_id=uuid.uuid4().hex[:8],
        capacity=1,
        lease_seconds=1.0,
    )


async def test_a_heartbeat_that_fails_is_counted_and_beats_again(dispatch, monkeypatch):
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    worker = _worker(dispatch, deployment)
    before = _failures("heartbeat")
    real = worker.leases.heartbeat
    beats = 0

    async def heartbeat(**kwargs: Any) -> bool:
        nonlocal beats
        beats += 1
        if beats == 2:  # the heartbeat loop's first beat (run() beats once itself)
            raise RuntimeError("injected failure")
        return await real(**kwargs)

    monkeypatch.setattr(worker.leases, "heartbeat", heartbeat)
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: beats >= 4)
        assert _failures("heartbeat") == before + 1
        assert not loops_failing("heartbeat")
    finally:
        worker.drain()
        await asyncio.wait_for(running, 20)


async def test_events_redis_refuses_are_written_again_and_do_not_hold_back_others(dispatch):
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    worker = _worker(dispatch, deployment)
    refused, other = job_new(deployment), job_new(deployment)
    # A key of the wrong type: Redis refuses the XADD of the refused job's events (WRONGTYPE).
    await dispatch.redis.set(reply_key(deployment, refused.request_id), "in the way")
    before = _failures("flush")
    running = asyncio.create_task(worker.run())
    try:
        worker._outbox.put(refused, Started(at=1.0), urgent=True)
        worker._outbox.put(other, Started(at=1.0), urgent=True)
        worker._outbox.put(other, Delta(text="hi", tokens=1), urgent=True)
        seen = await _read(dispatch, deployment, other.request_id, count=2)
        await _until(lambda: _failures("flush") > before)
        assert [event for _, event in seen] == [Started(at=1.0), Delta(text="hi", tokens=1)]

        await dispatch.redis.delete(reply_key(deployment, refused.request_id))
        kept = await _read(dispatch, deployment, refused.request_id, count=1)
        assert [event for _, event in kept] == [Started(at=1.0)]
        # Written once each: what went out the first time was not written again.
        assert await dispatch.redis.xlen(reply_key(deployment, other.request_id)) == 2
        await _until(lambda: not loops_failing("flush"))
    finally:
        worker.drain()
        await asyncio.wait_for(running, 20)


class _FailingCost(CostModel):
    """A cost model whose estimate raises while `failing` is set, as a bug in it would."""

    failing = True

    def seconds(self, *, inputs: int, longest: int) -> float:
        if self.failing:
            raise ZeroDivisionError("injected failure")
        return super().seconds(inputs=inputs, longest=longest)


async def test_a_failed_batcher_fails_its_waiting_requests_and_serves_the_next():
    cost = _FailingCost(overhead=0.001, per_token=1e-6)
    batcher = DynamicBatcher(
        lambda batch: [struct.pack("<f", len(ids)) for ids in batch],
        max_batch_size=4,
        max_queue_delay=0.05,
        quiet_seconds=0.05,
        cost=cost,
    )
    before = _failures("batcher")
    running = asyncio.create_task(
        supervise("batcher", batcher.run, on_failure=batcher.fail_waiting)
    )
    try:
        cost.failing = False  # embed's own admission estimate passes
        waiting = asyncio.create_task(batcher.embed([[1, 2]], deadline=time.monotonic() + 60))
        await asyncio.sleep(0)
        cost.failing = True
        with pytest.raises(RuntimeError, match="batcher failed"):
            await asyncio.wait_for(waiting, 10)
        assert _failures("batcher") >= before + 1
        cost.failing = False
        vectors = await asyncio.wait_for(
            batcher.embed([[1, 2, 3]], deadline=time.monotonic() + 60), 10
        )
        assert vectors == [struct.pack("<f", 3)]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


class _HeldWorker(Worker):
    """Runs each job until the test lets it end."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    async def _serve(self, job: Job) -> None:
        self.started.append(job.request_id)
        await self.release.setdefault(job.request_id, asyncio.Event()).wait()


@contextlib.asynccontextmanager
async def _held_worker(
    dispatch: Roles, *, capacity: int, wait_seconds: float | None = None
) -> AsyncIterator[tuple[str, _HeldWorker]]:
    """A `_HeldWorker` serving a deployment of its own, running with its heartbeat in; drained
    at the end."""
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    worker = _HeldWorker(
        deployment=deployment,
        engine=_Engine(),
        client=dispatch.redis,
        reply_ttl=dispatch.reply_ttl,
        worker_id=uuid.uuid4().hex[:8],
        capacity=capacity,
        lease_seconds=30.0,
    )
    if wait_seconds is not None:
        worker.wait_seconds = wait_seconds
    await dispatch.usage.ensure_groups(deployment)
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: worker.active is not None and worker._slots() == (capacity, 0))
        await asyncio.sleep(0.2)  # its heartbeat is in: the deployment is served
        yield deployment, worker
    finally:
        worker.drain()
        await asyncio.wait_for(running, 40)


def _claims_counted(worker: Worker) -> list[float]:
    """When each claim the worker makes on its own (not behind its wait) is sent, from now."""
    claims: list[float] = []
    claim_asked = worker.leases.claim_asked

    async def counted(**kwargs: Any) -> Any:
        claims.append(time.monotonic())
        return await claim_asked(**kwargs)

    worker.leases.claim_asked = counted  # type: ignore[method-assign]
    return claims


async def test_a_job_queued_after_a_busy_wait_is_claimed_once_the_wait_wakes(dispatch):
    """A busy worker waits for work, then claims; the job that woke it is claimed at once even
    when what ran has ended meanwhile (an idle worker's wait is another, and the job's wake
    token is spent: waiting there would hold the job for the whole wait)."""
    # A wait far past the bounds below: only a wake ends a wait in time.
    async with _held_worker(dispatch, capacity=2, wait_seconds=25.0) as (deployment, worker):
        first, second = job_new(deployment), job_new(deployment)
        assert await dispatch.front.enqueue(first) is None
        await _until(lambda: first.request_id in worker.started)
        await asyncio.sleep(0.3)  # its next claim found nothing: it waits, busy
        worker.release.setdefault(first.request_id, asyncio.Event()).set()
        await _until(lambda: not worker.active)
        assert await dispatch.front.enqueue(second) is None
        await _until(lambda: second.request_id in worker.started, timeout=10)
        worker.release.setdefault(second.request_id, asyncio.Event()).set()


async def test_an_idle_worker_that_took_the_last_job_waits_rather_than_claiming_again(
    dispatch,
):
    """An idle worker whose claim took the last queued job waits for the next one rather than
    claiming again at once (which could find only what a wake token announces anyway); a job
    queued while the first runs is claimed as soon as it is queued, and a busy worker that
    took it claims again at once (under load, what was queued meanwhile goes in one claim)."""
    async with _held_worker(dispatch, capacity=4, wait_seconds=25.0) as (deployment, worker):
        claims = _claims_counted(worker)
        first, second = job_new(deployment), job_new(deployment)
        await asyncio.sleep(0.2)  # its claim in flight, if any, is answered: it waits
        before = len(claims)
        assert await dispatch.front.enqueue(first) is None
        await _until(lambda: first.request_id in worker.started)
        await asyncio.sleep(0.3)
        assert len(claims) == before  # no claim of its own after the one that took the job
        assert await dispatch.front.enqueue(second) is None
        await _until(lambda: second.request_id in worker.started, timeout=10)
        await _until(lambda: len(claims) == before + 1)  # busy: it claims again at once
        await asyncio.sleep(0.3)
        assert len(claims) == before + 1  # that claim found nothing: it waits
        for job in (first, second):
            worker.release.setdefault(job.request_id, asyncio.Event()).set()


async def test_a_worker_whose_jobs_ended_while_it_waited_waits_after_taking_the_last_job(
    dispatch,
):
    """A busy worker waits for work too; when its running jobs end during that wait and the
    claim behind it takes the last queued job, it has nothing else running: it waits for the
    next job rather than claiming again at once, as an idle worker does."""
    async with _held_worker(dispatch, capacity=4, wait_seconds=25.0) as (deployment, worker):
        claims = _claims_counted(worker)
        first, second = job_new(deployment), job_new(deployment)
        assert await dispatch.front.enqueue(first) is None
        await _until(lambda: first.request_id in worker.started)
        await asyncio.sleep(0.3)  # it waits, busy with the first
        worker.release.setdefault(first.request_id, asyncio.Event()).set()
        await _until(lambda: not worker.active)
        before = len(claims)
        assert await dispatch.front.enqueue(second) is None
        await _until(lambda: second.request_id in worker.started, timeout=10)
        await asyncio.sleep(0.3)
        assert len(claims) == before  # no claim of its own after the one that took the job
        worker.release.setdefault(second.request_id, asyncio.Event()).set()


async def test_a_cancel_whose_message_was_missed_stops_the_job_once_it_is_claimed(dispatch):
    """A cancel reaches a worker as a message, which its subscription can miss (a dropped
    connection); the flag the cancel also sets is read by the claim that takes the job, so
    such a job is stopped and ends cancelled rather than running to its end."""
    async with _held_worker(dispatch, capacity=2) as (deployment, worker):
        job = job_new(deployment)
        # The flag of a cancel that landed before the claim, its message not seen.
        await dispatch.redis.set(cancel_key(deployment, job.request_id), "1", ex=60)
        assert await dispatch.front.enqueue(job) is None
        [(_, terminal)] = await _read(dispatch, deployment, job.request_id, count=1)
        assert isinstance(terminal, Failed) and terminal.code == "cancelled"
        assert job.request_id not in worker.active


async def test_a_claimed_job_starts_before_the_workers_next_claim_round(dispatch):
    """The jobs a claim took reach their engine first: the worker's next claim round (its
    wait's set-up; under load, its claim) comes after their start, not before it."""
    async with _held_worker(dispatch, capacity=2, wait_seconds=25.0) as (deployment, worker):
        seen: list[str] = []
        claim_round, serve = worker._claim_round, worker._serve

        async def counted_round() -> None:
            seen.append("round")
            await claim_round()

        async def counted_serve(job: Job) -> None:
            seen.append(job.request_id)
            await serve(job)

        # The round in flight (waiting for work) is not counted; the next ones are.
        worker._claim_round = counted_round  # type: ignore[method-assign]
        worker._serve = counted_serve  # type: ignore[method-assign]
        job = job_new(deployment)
        assert await dispatch.front.enqueue(job) is None
        await _until(lambda: len(seen) >= 2)
        assert seen[:2] == [job.request_id, "round"]
        worker.release.setdefault(job.request_id, asyncio.Event()).set()


async def test_a_wake_that_fails_is_logged_and_the_worker_goes_on(dispatch, caplog):
    """A drain wakes the worker's pending claim; a wake that fails other than by Valkey being
    away is logged, and the claim's answer (its pop ends on its own timeout) is still read."""
    async with _held_worker(dispatch, capacity=2, wait_seconds=0.5) as (_, worker):
        woken = asyncio.Event()

        async def wake(**kwargs: Any) -> None:
            woken.set()
            raise RuntimeError("the wake broke")

        worker.leases.wake = wake  # type: ignore[method-assign]
        await asyncio.sleep(0.2)  # its next round waits behind its pop
        worker.drain()
        await asyncio.wait_for(woken.wait(), 5)
    # The worker drained (the context's end waits for it) and said why its wake failed.
    assert "could not wake this worker's pending claim" in caplog.text
