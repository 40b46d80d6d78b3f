"""The batch runner against real PostgreSQL and Valkey, in this process: a failure stays small.

A line that fails in any way fails alone and gives back what it held; a step that keeps
failing ends its batch instead of retrying for ever; a cancel or the end of the window ends a
batch whatever its steps do. No engine runs here: the failures are injected at a boundary.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from django.conf import settings
from django.utils import timezone

from batches import runner, scheduler, services, tasks
from batches.models import Batch, BatchStatus, File, LineState
from batches.runner import BatchRun, _reservation_release, batch_step
from batches.selectors import file_pieces
from batches.services import batch_cancel, batch_create, file_create, line_request_id
from dataplane.frontdoor import FrontDoor, Refusal, Refused
from dataplane.keys import batch_lease_key, batch_runner_key, ledger_key, whereabouts_key
from dataplane.quotas import month_of
from dataplane.redis_client import redis_client_new, redis_sync_client
from dataplane.snapshots import Depth, depth
from inference.pipeline import submission
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_issue, tenant_create
from tests.conftest import ALIAS
from tests.dataplane.roles import roles


@pytest.fixture
def db(world: Any, django_db_blocker: Any) -> Iterator[None]:
    """Committed rows, as the runner's own database threads read them."""
    with django_db_blocker.unblock():
        yield


def _line(custom_id: str) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": ALIAS,
                "messages": [{"role": "user", "content": f"Hello {custom_id}"}],
                "max_tokens": 4,
            },
        }
    )


def _content(file: File) -> bytes:
    return b"".join(file_pieces(tenant=file.tenant_id, file_id=file.id))


def _batch(world: Any, count: int, *, tenant: Tenant | None = None) -> Batch:
    tenant = tenant or world.acme
    content = "".join(_line(f"l{i}") + "\n" for i in range(count)).encode()
    file = file_create(tenant_id=tenant.pk, filename="f", purpose="batch", content=content)
    return batch_create(
        tenant_id=tenant.pk,
        api_key_id=ApiKey.objects.get(tenant=tenant, name="tests").pk,
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )


def _held(tenant_id: int, request_id: str) -> bool:
    """Whether a request still holds a reservation: its held share or a concurrency slot."""
    redis = redis_sync_client()
    tag = f"sy:{{t{tenant_id}}}"
    return bool(
        redis.exists(f"{tag}:held:{request_id}")
        or redis.zscore(f"{tag}:inflight", request_id) is not None
    )


def _counts_add_up(batch: Batch) -> None:
    assert batch.completed + batch.failed == batch.total
    assert batch.lines.count() == batch.total
    assert not batch.lines.filter(state__in=[LineState.PENDING, LineState.SUBMITTED]).exists()


def test_it_fails_a_line_that_breaks_after_admission_and_gives_its_reservation_back(
    world, db, monkeypatch
):
    admitted: list[str] = []

    async def broken(self: FrontDoor, job: Any, **kwargs: Any) -> None:
        admitted.append(job.request_id)
        raise RuntimeError("the data plane broke mid-enqueue")

    monkeypatch.setattr(FrontDoor, "enqueue", broken)
    batch = _batch(world, 1)
    assert asyncio.run(batch_step(batch.id)) is True
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.completed, batch.failed) == ("completed", 1, 0, 1)
    _counts_add_up(batch)
    rid = line_request_id(batch.id, 0)
    assert admitted == [rid], "the failure was meant to come after admission"
    assert not _held(world.acme.pk, rid), "the failed line's reservation was not given back"
    assert batch.error_file is not None
    (entry,) = [json.loads(x) for x in _content(batch.error_file).splitlines()]
    assert entry["custom_id"] == "l0"
    assert entry["response"]["status_code"] == 500
    assert entry["response"]["body"]["error"]["code"] == "internal_error"


class _Queue:
    """Stands in for Celery's `batches` queue: first in, first out, one turn at a time."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, ...]] = []

    def apply_async(self, args: tuple[Any, ...], **options: Any) -> None:
        self.queued.append(args)

    def run(self, *, most: int) -> list[str]:
        """Run the queued turns (and those they queue) in order; return what each said."""
        said: list[str] = []
        while self.queued and len(said) < most:
            slot, ticket = self.queued.pop(0)
            said.append(scheduler.turn_take(slot=slot, ticket=ticket))
        return said


@pytest.fixture
def queue(db: None, monkeypatch: Any) -> Iterator[_Queue]:
    """The batch runners' turns, queued here; no runner left over before or after a test."""
    fake = _Queue()
    monkeypatch.setattr(tasks, "batches_turn", fake)
    # Batches other tests leave unfinished (cancelled, with no runner to end them) would take
    # turns here too.
    Batch.objects.filter(status__in=scheduler.UNFINISHED).update(status=BatchStatus.CANCELLED)
    redis = redis_sync_client()
    slots = range(settings.ROUNDHOUSE_BATCH_RUNNERS)
    redis.delete(*[batch_runner_key(slot) for slot in slots])
    yield fake
    redis.delete(*[batch_runner_key(slot) for slot in slots])


def _run_chain(batch_id: str, queue: _Queue, *, most: int = 20) -> list[str]:
    """Run a batch's steps as the runners would, one turn after the other; say what each did."""
    scheduler.runners_wake()
    return queue.run(most=most)


@pytest.fixture
def failing_steps(monkeypatch: Any) -> None:
    async def broken(self: BatchRun) -> bool:
        raise RuntimeError("this step always fails")

    monkeypatch.setattr(BatchRun, "step", broken)


def test_a_step_that_keeps_failing_ends_the_batch_failed(world, db, failing_steps, queue):
    batch = _batch(world, 3)
    said = _run_chain(batch.id, queue)
    assert said == ["retrying"] * (scheduler.STEP_ATTEMPTS - 1) + ["ended", "idle"]
    batch.refresh_from_db()
    assert batch.status == BatchStatus.FAILED and batch.failed_at is not None
    assert batch.errors is not None
    assert batch.errors["data"][0]["code"] == "batch_failed"
    # Its steps never got as far as reading its lines.
    assert (batch.total, batch.completed, batch.failed) == (0, 0, 0)


def test_a_batch_whose_steps_fail_after_validation_fails_every_line_left(
    world, db, monkeypatch, queue
):
    batch = _batch(world, 3)
    services.batch_validate(batch=batch)

    async def broken(self: BatchRun) -> bool:
        raise RuntimeError("this step always fails")

    monkeypatch.setattr(BatchRun, "step", broken)
    said = _run_chain(batch.id, queue)
    assert said[-2:] == ["ended", "idle"] and len(said) == scheduler.STEP_ATTEMPTS + 1
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.completed, batch.failed) == ("failed", 3, 0, 3)
    _counts_add_up(batch)
    assert batch.error_file is not None
    errors = [json.loads(x) for x in _content(batch.error_file).splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("l0", "batch_failed"), ("l1", "batch_failed"), ("l2", "batch_failed"),
    ]  # fmt: skip


def test_a_cancel_ends_the_batch_while_its_steps_keep_failing(world, db, failing_steps, queue):
    batch = _batch(world, 2)
    services.batch_validate(batch=batch)
    batch_cancel(batch=batch)
    assert _run_chain(batch.id, queue) == ["ended", "idle"]
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.completed, batch.failed) == ("cancelled", 2, 0, 2)
    _counts_add_up(batch)


def test_the_window_ends_the_batch_while_its_steps_keep_failing(world, db, failing_steps, queue):
    batch = _batch(world, 2)
    services.batch_validate(batch=batch)
    Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert _run_chain(batch.id, queue) == ["ended", "idle"]
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.completed, batch.failed) == ("expired", 2, 0, 2)
    _counts_add_up(batch)


def _failing_file(tenant: Tenant, count: int) -> str:
    """Upload a file of lines that all fail validation (their url is another endpoint)."""
    content = "".join(
        _line(f"l{i}").replace("/v1/chat/completions", "/v1/embeddings") + "\n"
        for i in range(count)
    )
    file = file_create(tenant_id=tenant.pk, filename="f", purpose="batch", content=content.encode())
    return file.id


def _batch_on(tenant: Tenant, file_id: str) -> Batch:
    """Create a batch and start the runners, as the API does."""
    batch = batch_create(
        tenant_id=tenant.pk,
        api_key_id=ApiKey.objects.get(tenant=tenant, name="tests").pk,
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    scheduler.runners_wake()
    return batch


def _tenant(slug: str) -> Tenant:
    tenant = tenant_create(slug=slug)
    api_key_issue(tenant=tenant, name="tests")
    return tenant


def test_another_tenants_batch_gets_the_next_turn_while_one_tenant_runs_ten_large_ones(
    world, db, queue, monkeypatch
):
    """Finding 5 of the hardening review: ten batches over one upload of 50,000 failing lines,
    each validated whole in one step and each with its own chain of steps in one queue, went
    before another tenant's one-line batch (1.0 s became 64.6 s)."""
    heavy, light = _tenant("fair-heavy"), _tenant("fair-light")
    per_step = settings.ROUNDHOUSE_BATCH_VALIDATE_LINES
    upload = _failing_file(heavy, 3 * per_step)
    heavy_ids = [_batch_on(heavy, upload).id for _ in range(10)]
    # A few runners, not a chain of steps per batch.
    assert len(queue.queued) == settings.ROUNDHOUSE_BATCH_RUNNERS
    steps: list[tuple[str, str]] = []  # each step's batch, and its status after the step
    advance = scheduler.batch_advance

    def recorded(*, batch_id: str) -> str:
        said = advance(batch_id=batch_id)
        steps.append((batch_id, Batch.objects.values_list("status", flat=True).get(pk=batch_id)))
        return said

    monkeypatch.setattr(scheduler, "batch_advance", recorded)
    queue.run(most=3)  # the heavy tenant's batches are under way
    light_id = _batch_on(light, _failing_file(light, 1)).id
    queue.run(most=200)
    order = [batch_id for batch_id, _ in steps]
    # The light tenant's batch takes the next turn, ends in it, and is never stepped again.
    assert order[3] == light_id and order.count(light_id) == 1
    assert steps[3][1] == BatchStatus.COMPLETED
    # The heavy tenant's batches take turns too, each file read over several bounded steps.
    assert len(set(order[:3] + order[4:11])) == 10
    assert {order.count(batch_id) for batch_id in heavy_ids} == {3}
    ended = Batch.objects.filter(pk__in=heavy_ids).values_list("status", "total", "failed")
    assert set(ended) == {(BatchStatus.COMPLETED, 3 * per_step, 3 * per_step)}
    assert queue.queued == [], "a runner kept going with nothing to run"


def test_a_step_whose_lines_run_ends_early_for_another_tenants_waiting_batch(world, db, settings):
    """A step keeps its runner while its lines run, until its time is up: with every runner
    in such steps, another tenant's new batch waited for one to end. Past its first second a
    step ends early for a batch of another tenant that no runner holds; its lines go on."""
    settings.ROUNDHOUSE_BATCH_STEP_SECONDS = 120.0
    settings.ROUNDHOUSE_BATCH_STEP_LEAST_SECONDS = 0.2
    heavy = _batch(world, 2)  # no worker serves its lines: none of them ends
    light_tenant = _tenant("yield-light")
    light: list[Batch] = []

    async def both() -> bool | None:
        step = asyncio.create_task(batch_step(heavy.id))
        while not await asyncio.to_thread(
            lambda: heavy.lines.filter(state=LineState.SUBMITTED).count() == 2
        ):
            await asyncio.sleep(0.05)
        light.append(
            await asyncio.to_thread(lambda: _batch_on(light_tenant, _failing_file(light_tenant, 1)))
        )
        # Without yielding the step would hold its runner for its whole 120 s.
        return await asyncio.wait_for(step, timeout=60)

    try:
        assert asyncio.run(both()) is False  # ended early, the batch not finished
        waiting = heavy.lines.filter(state__in=[LineState.SUBMITTED, LineState.PENDING])
        assert waiting.count() == 2  # its lines are left for its next step
    finally:
        for batch in [heavy, *light]:
            batch_cancel(batch=batch)
        for index in range(2):
            asyncio.run(
                _reservation_release(line_request_id(heavy.id, index), tenant_id=world.acme.pk)
            )


def test_resuming_takes_over_a_lost_turn_and_never_doubles_a_runner(world, db, queue):
    tenant = _tenant("resumed-runner")
    _batch_on(tenant, _failing_file(tenant, 2 * settings.ROUNDHOUSE_BATCH_VALIDATE_LINES))
    (lost,) = queue.queued
    queue.queued.clear()  # the Celery worker holding the turn died
    assert scheduler.runners_resume() == 1
    assert scheduler.runners_resume() == 1  # another worker started: still one runner
    assert queue.run(most=20) == ["superseded", "continuing", "ended", "idle"]
    # A copy of the lost turn the broker brings back does nothing.
    slot, ticket = lost
    assert scheduler.turn_take(slot=slot, ticket=ticket) == "superseded"
    assert queue.queued == []


def test_a_batch_cancelled_while_validating_counts_every_line_it_read(world, db, monkeypatch):
    batch = _batch(world, 4)
    check = services._line_check

    def cancelled_meanwhile(raw: str, **kwargs: Any) -> Any:
        if Batch.objects.filter(pk=batch.pk, status=BatchStatus.VALIDATING).exists():
            batch_cancel(batch=batch)
        return check(raw, **kwargs)

    monkeypatch.setattr(services, "_line_check", cancelled_meanwhile)
    assert asyncio.run(batch_step(batch.id)) is True
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.completed, batch.failed) == ("cancelled", 4, 0, 4)
    _counts_add_up(batch)


def _spent(tenant_id: int) -> int:
    """The tenant's reserved and billed spend this month, in micros."""
    month = month_of(time.time())
    return int(redis_sync_client().get(f"sy:{{t{tenant_id}}}:spent:{month}") or 0)


def test_a_step_that_ends_lets_a_submission_under_way_reach_the_queue(world, db, monkeypatch,
                                                                        settings):  # fmt: skip
    """Its time up, a step stops following its lines, but never cuts a submission off half-way:
    admitted and not queued, the request would hold its reservation and never end."""
    settings.ROUNDHOUSE_BATCH_STEP_SECONDS = 0.2
    reached: list[str] = []

    async def slow(self: FrontDoor, job: Any, **kwargs: Any) -> None:
        await asyncio.sleep(3.0)  # past the end of the step
        reached.append(job.request_id)
        return None  # queued, as far as the runner can tell

    monkeypatch.setattr(FrontDoor, "enqueue", slow)
    batch = _batch(world, 1)
    rid = line_request_id(batch.id, 0)
    try:
        assert asyncio.run(batch_step(batch.id)) is False  # time up, the line left running
        assert reached == [rid]
        assert batch.lines.get().state == LineState.SUBMITTED
    finally:
        batch_cancel(batch=batch)
        asyncio.run(_reservation_release(rid, tenant_id=world.acme.pk))


@pytest.mark.parametrize("whereabouts", [True, False], ids=["after-whereabouts", "before"])
def test_a_line_whose_submission_was_cut_off_is_submitted_again_not_followed_for_ever(
    world, db, monkeypatch, settings, whereabouts
):
    """A runner that died between a line's admission and its queueing (after writing the
    request's whereabouts, which on a cluster live on another node, or before) leaves a
    request no worker will ever end, holding a concurrency slot. The next step gives back what
    it reserved and submits the line again: under a limit of one, the line's own old slot
    would otherwise refuse it for ever."""
    settings.ROUNDHOUSE_BATCH_STEP_SECONDS = 0.5
    tenant = tenant_create(slug=f"single-file-{'after' if whereabouts else 'before'}")
    tenant.quota.max_concurrency = 1
    tenant.quota.save()
    api_key_issue(tenant=tenant, name="tests")
    batch = _batch(world, 1, tenant=tenant)
    rid = line_request_id(batch.id, 0)
    spent_before = _spent(tenant.pk)

    async def cut_off(self: FrontDoor, job: Any, **kwargs: Any) -> None:
        if whereabouts:
            async with self.redis.pipeline(transaction=False) as pipe:
                self._whereabouts_into(pipe, job)
                await pipe.execute()
        await asyncio.Event().wait()  # the runner dies here: the job is never queued

    async def dead_runner(job: Any) -> None:
        """A runner that died ends nothing."""

    monkeypatch.setattr(FrontDoor, "enqueue", cut_off)
    monkeypatch.setattr(submission, "request_abandon", dead_runner)
    monkeypatch.setattr("batches.runner._SUBMIT_WAIT_SECONDS", 0.1)
    assert asyncio.run(batch_step(batch.id)) is False
    assert batch.lines.get().state == LineState.SUBMITTED
    assert _held(tenant.pk, rid)

    submitted: list[str] = []

    async def no_worker(self: FrontDoor, job: Any, **kwargs: Any) -> Refused:
        submitted.append(job.request_id)
        return Refused(Refusal.NO_WORKER)

    monkeypatch.setattr(FrontDoor, "enqueue", no_worker)
    try:
        assert asyncio.run(batch_step(batch.id)) is False
        assert submitted == [rid], "the cut-off line was not submitted again"
        # Refused for now (no worker): it waits to be tried again, holding nothing.
        assert batch.lines.get().state == LineState.PENDING
        assert not _held(tenant.pk, rid)
        assert _spent(tenant.pk) == spent_before
    finally:
        batch_cancel(batch=batch)


def test_a_step_whose_lease_is_taken_stops_and_leaves_its_submissions_to_reach_the_queue(
    world, db, monkeypatch, settings
):
    """Another runner took the batch (this one's loop was blocked past its lease): the step
    stops taking lines and ends as at the end of its time, its submission reaching the queue,
    instead of raising and cutting it off (which would abandon the request, and the next
    step would follow a cancelled line)."""
    settings.ROUNDHOUSE_BATCH_STEP_SECONDS = 60.0
    settings.ROUNDHOUSE_BATCH_LEASE_SECONDS = 0.6
    reached: list[str] = []
    abandoned: list[str] = []
    batch = _batch(world, 1)
    rid = line_request_id(batch.id, 0)

    async def taken_over(self: FrontDoor, job: Any, **kwargs: Any) -> None:
        redis_sync_client().set(batch_lease_key(batch.id), "another runner", px=60_000)
        await asyncio.sleep(1.5)  # past the next renewal of the lease
        reached.append(job.request_id)
        return None  # queued, as far as the runner can tell

    async def abandon(job: Any) -> None:
        abandoned.append(job.request_id)

    monkeypatch.setattr(FrontDoor, "enqueue", taken_over)
    monkeypatch.setattr(submission, "request_abandon", abandon)
    try:
        assert asyncio.run(batch_step(batch.id)) is False
        assert reached == [rid] and abandoned == []
        assert batch.lines.get().state == LineState.SUBMITTED
        # The lease stays the other runner's.
        assert redis_sync_client().get(batch_lease_key(batch.id)) == b"another runner"
    finally:
        redis_sync_client().delete(batch_lease_key(batch.id))
        batch_cancel(batch=batch)
        asyncio.run(_reservation_release(rid, tenant_id=world.acme.pk))


def test_a_line_submitted_by_two_steps_runs_once(world, db, monkeypatch, settings):
    """A step whose loop stalled mid-submission past its lease, and the step that took the
    batch over, both submit the line under its one request id: it is queued once.

    The stalled step's lease lapses with the line marked submitted and not queued; the next
    step finds no request to follow and submits the line again; then the stalled submission
    reaches the queue too. The queue refuses the second one, and its step follows the first.
    """
    settings.ROUNDHOUSE_BATCH_STEP_SECONDS = 1.0
    settings.ROUNDHOUSE_BATCH_LEASE_SECONDS = 0.6
    batch = _batch(world, 1)
    rid = line_request_id(batch.id, 0)
    # A deployment of its own, served by a heartbeat alone: what is queued there stays queued.
    deployment = f"t-{uuid.uuid4().hex[:8]}"
    queue_one = FrontDoor.enqueue
    outcomes: list[Refused | None] = []

    async def main() -> tuple[bool | None, bool | None]:
        stalled, queued = asyncio.Event(), asyncio.Event()
        client = redis_client_new()
        await roles(client).leases.heartbeat(deployment=deployment, worker="w", ttl=60)

        async def enqueue(self: FrontDoor, job: Any, **kwargs: Any) -> Refused | None:
            job = msgspec.structs.replace(job, deployment=deployment)
            if not stalled.is_set():
                # The first step's loop stalls here past its lease, and another step takes over.
                redis_sync_client().delete(batch_lease_key(batch.id))
                stalled.set()
                await queued.wait()
                outcomes.append(await queue_one(self, job, **kwargs))
                return outcomes[-1]
            outcomes.append(await queue_one(self, job, **kwargs))
            queued.set()
            return outcomes[-1]

        async def takes_over() -> bool | None:
            await stalled.wait()
            return await batch_step(batch.id)

        monkeypatch.setattr(FrontDoor, "enqueue", enqueue)
        try:
            first, second = await asyncio.gather(batch_step(batch.id), takes_over())
            return first, second
        finally:
            await client.aclose()

    try:
        assert asyncio.run(main()) == (False, False)  # each step's time ran out
        assert outcomes == [None, None]  # both answered queued: one queued, one follows
        depth = asyncio.run(_depth(deployment))
        assert depth.requests == 1, "the line was queued twice"
        ledger: Any = redis_sync_client().hgetall(ledger_key(deployment))
        admitted = [int(n) for field, n in ledger.items() if field.endswith(b":admitted")]
        assert admitted == [1], "the ledger counted the line admitted twice"
        assert batch.lines.get().state == LineState.SUBMITTED
    finally:
        batch_cancel(batch=batch)
        asyncio.run(_reservation_release(rid, tenant_id=world.acme.pk))
        sync = redis_sync_client()
        sync.delete(*sync.keys(f"sy:{{{deployment}}}*"), whereabouts_key(rid))


async def _depth(deployment: str) -> Depth:
    client = redis_client_new()
    try:
        return await depth(client, deployment)
    finally:
        await client.aclose()


def test_a_step_that_raises_lets_its_submissions_reach_the_queue_first(
    world, db, monkeypatch, settings
):
    """An error mid-step (here the database, on the loop's second round) is raised only once
    the submissions under way reached the queue: cut off, each would abandon its request."""
    settings.ROUNDHOUSE_BATCH_STEP_SECONDS = 60.0
    # Other tests' batches left unfinished would end the step early, before its second round.
    settings.ROUNDHOUSE_BATCH_STEP_LEAST_SECONDS = 60.0
    reached: list[str] = []
    abandoned: list[str] = []
    batch = _batch(world, 1)
    rid = line_request_id(batch.id, 0)
    read_status = runner._status
    rounds: list[int] = []

    def status_then_outage(*, batch: Batch) -> str:
        rounds.append(1)
        if len(rounds) > 1:
            raise RuntimeError("the database went away")
        return read_status(batch=batch)

    async def slow(self: FrontDoor, job: Any, **kwargs: Any) -> None:
        await asyncio.sleep(2.0)  # past the loop's next round
        reached.append(job.request_id)
        return None

    async def abandon(job: Any) -> None:
        abandoned.append(job.request_id)

    monkeypatch.setattr(runner, "_status", status_then_outage)
    monkeypatch.setattr(FrontDoor, "enqueue", slow)
    monkeypatch.setattr(submission, "request_abandon", abandon)
    try:
        with pytest.raises(RuntimeError, match="database went away"):
            asyncio.run(batch_step(batch.id))
        assert reached == [rid] and abandoned == []
        assert batch.lines.get().state == LineState.SUBMITTED
    finally:
        batch_cancel(batch=batch)
        asyncio.run(_reservation_release(rid, tenant_id=world.acme.pk))
