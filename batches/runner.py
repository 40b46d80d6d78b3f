"""Run a batch's lines through the platform at batch priority, one time-boxed step at a time.

Which batch a step is for is the scheduler's choice (batches.scheduler). A step of a validating
batch reads the next part of its file into lines (batches.services.batch_validate), and goes
on to run them once the file has been read to its end.

A step holds the batch's lease (a Redis lock), so one runner at a time drives a batch. It keeps
up to ROUNDHOUSE_BATCH_IN_FLIGHT lines admitted: each through the same admission as an API call
(quotas, fair dispatch, usage), queued in the `batch` class so interactive work always goes
first. When its time is up it leaves its admitted lines running and the next step follows them.

Every line has one request id, derived from the batch and the line, and is marked submitted
before it is queued. A step that starts after a crash follows each submitted line's request if
it exists and queues it only if it never was: no line is lost or run twice. A step that only
stalled past its lease may still queue a line the next step submitted again; the queue takes a
request id once, and the later submission follows the earlier one's request.

A line that fails in any way fails alone: it becomes an error entry and what it held (its
queued request, or its reservation) is given back. A step that fails anyway is tried again a
few times; meanwhile a cancel or the end of the window still ends the batch, and after the
last try the batch ends failed (see `batch_step_failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, LockNotOwnedError, RedisError

from batches.models import UNFINISHED, Batch, BatchLine, BatchStatus, LineState
from batches.services import (
    ENDPOINTS,
    batch_fail,
    batch_finalize,
    batch_validate,
    counts_refresh,
)
from config.db import db_call
from dataplane.background import event_wait, settle
from dataplane.frontdoor import FrontDoor
from dataplane.keys import batch_lease_key
from dataplane.quotas import Usage
from dataplane.types import Event
from inference.base.errors import ApiError
from inference.body.parser import generation_parse
from inference.body.tools import compiled_for
from inference.chat.format import answer_shape, formatter_for, shape_of
from inference.embeddings.format import embeddings_collect
from inference.embeddings.protocol import embeddings_parse
from inference.pipeline import relay
from inference.pipeline.admission import Submitted, request_ended
from inference.pipeline.auth import Principal, principal_of_key
from inference.pipeline.clients import dispatch_get, quotas_get
from inference.pipeline.collect import completion_collect
from inference.pipeline.safety import policy_get
from inference.pipeline.submission import embedding_submit, generation_submit
from inference.responses.protocol import RESPONSES, batch_line_parse
from inference.responses.views import responses_collect

log = logging.getLogger(__name__)
# Refusals that mean "not now" (limits, a full or absent deployment): the line waits and retries.
_RETRY_LATER = {
    "rate_limit_exceeded",
    "tokens_per_minute_exceeded",
    "concurrency_limit_exceeded",
    "queue_full",
    "model_unavailable",
    "deadline_unattainable",
}
# How long the end of a step waits for submissions under way and the work they spawned.
_SUBMIT_WAIT_SECONDS = 10.0
# How long a step's lease keeper gets to finish a renewal under way once the step ends.
_KEEPER_STOP_SECONDS = 5.0
_WAITING_LOOKED_AT = 8  # of the batches that may wait, the least recently stepped


@dataclass(frozen=True)
class Outcome:
    state: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class BatchRun:
    """One step of one batch: validate if needed, then keep lines in flight until time is up."""

    def __init__(self, batch: Batch, lock: Lock, *, until: float) -> None:
        self.batch = batch
        self.key_public_id = batch.api_key.public_id  # loaded with the batch
        self.lock = lock
        self.until = until
        self.kind = ENDPOINTS[batch.endpoint]
        self.dispatch = dispatch_get()
        self.in_flight: dict[int, asyncio.Task[Outcome]] = {}
        self.submitting: set[asyncio.Future[Submitted]] = set()
        self.retry_at = 0.0  # monotonic: no new lines before this (after a "not now")
        self.lease_lost = False
        self.stepped = asyncio.Event()  # set when the step ends: its lease keeper stops
        self.began = timezone.now()
        self.yield_after = time.monotonic() + settings.ROUNDHOUSE_BATCH_STEP_LEAST_SECONDS

    async def step(self) -> bool:
        """Advance the batch; return True once it has ended.

        Whatever stops the step early stops it as the end of its time does: an error lets the
        submissions under way reach the queue and leaves the admitted lines running before it
        is raised (cut off by the step's end, a submission would abandon its request, and the
        next step would follow a cancelled line), and a lost lease ends the step for the next
        one to go on.
        """
        keeper = asyncio.create_task(self._lease_keep(), name=f"lease of {self.batch.id}")
        try:
            return await self._advance()
        except Exception:
            try:
                await self._abandon()
            except Exception:
                log.warning("batch %s: could not stop its step cleanly", self.batch.id,
                            exc_info=True)  # fmt: skip
            raise
        finally:
            # Told to stop rather than cancelled: a cancel landing inside a Redis command
            # came out as a connection error, and the keeper renewed the lease for ever.
            self.stepped.set()
            await asyncio.wait([keeper], timeout=_KEEPER_STOP_SECONDS)
            if not keeper.done():
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper

    async def _advance(self) -> bool:
        if self.batch.status == BatchStatus.VALIDATING:
            if timezone.now() >= self.batch.expires_at:
                return await self._stop(BatchStatus.EXPIRED)
            # A bounded part of its file per step: a large file is read over several steps,
            # and other batches get theirs in between.
            self.batch = await db_call(batch_validate, batch=self.batch, until=self.until)
            if self.batch.status == BatchStatus.VALIDATING:
                return False
        if self.batch.ended:
            return True
        try:
            principal = await db_call(principal_of_key, self.key_public_id)
        except ApiError as exc:
            await db_call(_pending_fail, batch=self.batch, error=exc)
            return await self._finish(BatchStatus.COMPLETED)
        for line in await db_call(_lines, batch=self.batch, state=LineState.SUBMITTED, limit=None):
            self._start(line, principal, resumed=True)
        while time.monotonic() < self.until and not self.lease_lost:
            status = await db_call(_status, batch=self.batch)
            if status == BatchStatus.CANCELLING:
                return await self._stop(BatchStatus.CANCELLED)
            if timezone.now() >= self.batch.expires_at:
                return await self._stop(BatchStatus.EXPIRED)
            await self._top_up(principal)
            idle = not self.in_flight
            if idle and not await db_call(_lines, batch=self.batch, state="pending", limit=1):
                return await self._finish(BatchStatus.COMPLETED)
            await self._record(await self._wait_some(timeout=1.0))
            if await self._others_waiting():
                # Its lines keep running; the next step follows them, after the other's turn.
                break
        if self.lease_lost:
            log.warning("batch %s: its lease lapsed mid-step; the next step goes on",
                        self.batch.id)  # fmt: skip
        # Time is up: the admitted lines keep running; the next step follows them.
        await self._abandon()
        return False

    async def _others_waiting(self) -> bool:
        """Whether another tenant's batch waits for a turn this step holds up.

        A step keeps its runner until its time is up while its lines run: with every runner
        in such steps, another tenant's new batch waited for one to end (20 s). Past its
        first ROUNDHOUSE_BATCH_STEP_LEAST_SECONDS a step ends early for a batch of another
        tenant that no runner holds and that has not had a step since this one began.
        """
        if time.monotonic() < self.yield_after:
            return False
        waiting = await db_call(_waiting_elsewhere, batch=self.batch, since=self.began)
        if not waiting:
            return False
        # One round trip for the leases, as the scheduler reads them.
        async with self.lock.redis.pipeline(transaction=False) as pipe:
            for batch_id in waiting:
                pipe.exists(batch_lease_key(batch_id))
            leased = await pipe.execute()
        return not all(leased)

    async def _lease_keep(self) -> None:
        """Renew the batch's lease while the step runs, a third of its length apart.

        Renewed apart from the step's loop, so a slow round of it (many lines submitted at
        once on a busy host) does not let the lease lapse. If it lapsed anyway (the loop was
        blocked longer than the lease), another runner may hold the batch now: the step
        stops taking lines and ends as if its time were up.
        """
        assert self.lock.timeout is not None, "a batch's lease has a length"
        while not await event_wait(self.stepped, self.lock.timeout / 3):
            try:
                await self.lock.reacquire()
            except LockNotOwnedError:
                self.lease_lost = True
                return
            except RedisError:
                if self.stepped.is_set():
                    return  # the step ended meanwhile: nothing left to renew
                # Redis unreachable for a moment: the lease may still hold; try again.
                log.warning("batch %s: could not renew its lease", self.batch.id, exc_info=True)

    async def _top_up(self, principal: Principal) -> None:
        room = settings.ROUNDHOUSE_BATCH_IN_FLIGHT - len(self.in_flight)
        if room <= 0 or time.monotonic() < self.retry_at:
            return
        lines = await db_call(_claim, batch=self.batch, limit=room)
        for line in lines:
            self._start(line, principal, resumed=False)

    def _start(self, line: BatchLine, principal: Principal, *, resumed: bool) -> None:
        self.in_flight[line.index] = asyncio.create_task(
            self._run_line(line, principal, resumed=resumed), name=line.request_id
        )

    async def _run_line(self, line: BatchLine, principal: Principal, *, resumed: bool) -> Outcome:
        """Run (or, resumed, follow) one line to its end; pending again if it must wait.

        It never raises: whatever goes wrong fails this line alone.
        """
        rid = line.request_id
        deadline = self.batch.expires_at.timestamp()
        try:
            assert line.body is not None, "a runnable line has a body"
            if resumed:
                where = await self.dispatch.whereabouts(rid)
                if where is None or not await self.dispatch.reached_queue(
                    deployment=where.deployment, request_id=rid
                ):
                    # Its submission was cut off before the queue took it: it would never
                    # end. What it reserved (if it got that far) goes back, and it is
                    # submitted again; a concurrency slot it kept would refuse it for ever
                    # under a tenant's limit.
                    await _reservation_release(rid, tenant_id=principal.tenant_id)
                    where = None
                if where is not None:
                    events = relay.attach(
                        self.dispatch,
                        deployment=where.deployment,
                        request_id=rid,
                        deadline=deadline,
                        policy=await policy_get(
                            tenant_id=principal.tenant_id, version=where.version_digest
                        ),
                        tenant_id=principal.tenant_id,
                    )
                    return _succeeded(await self._collect(line.body, rid, events))
            # A submission runs to its end even when the step stops following the line: cut
            # off between the admission and the queue, it would leave a request that never
            # ends (see _abandon).
            submission = asyncio.ensure_future(self._submit(line.body, principal, rid, deadline))
            self.submitting.add(submission)
            submission.add_done_callback(self.submitting.discard)
            submitted = await asyncio.shield(submission)
            events = relay.attach(
                self.dispatch,
                deployment=submitted.job.deployment,
                request_id=rid,
                deadline=submitted.job.deadline,
                policy=submitted.policy,
                tenant_id=principal.tenant_id,
            )
            return _succeeded(await self._collect(line.body, rid, events, submitted=submitted))
        except ApiError as exc:
            if exc.code in _RETRY_LATER:
                wait = exc.retry_after or 1.0
                self.retry_at = max(self.retry_at, time.monotonic() + min(wait, 30.0))
                return Outcome(state=LineState.PENDING)
            return Outcome(
                state=LineState.FAILED,
                result={"status_code": exc.status, "body": exc.body()},
            )
        except Exception:
            log.exception("batch %s: line %d failed", self.batch.id, line.index + 1)
            await self._give_back(rid, tenant_id=principal.tenant_id)
            error = ApiError(500, "internal_error", "The platform failed to run this request.")
            return Outcome(LineState.FAILED, result={"status_code": 500, "body": error.body()})

    async def _give_back(self, rid: str, *, tenant_id: int) -> None:
        """End what a failed line may hold: its request if it was queued, else its reservation.

        A queued request is aborted; its worker ends it and the ingester settles it, once. One
        refused or never queued holds at most a reservation, settled here to nothing used.
        """
        try:
            where = await self.dispatch.whereabouts(rid)
            if where is not None:
                await self.dispatch.cancel_by_id(where=where, request_id=rid)
                return
            await _reservation_release(rid, tenant_id=tenant_id)
        except Exception:
            log.warning("batch %s: could not give back %s; its lease will", self.batch.id, rid,
                        exc_info=True)  # fmt: skip

    async def _submit(
        self, body: dict[str, Any], principal: Principal, rid: str, deadline: float
    ) -> Submitted:
        timeout = max(deadline - time.time(), 0.001)
        # Replies are kept while the batch may still be resumed and read them.
        reply_ttl = int(timeout) + 3600
        if self.kind == "embeddings":
            return await embedding_submit(
                principal=principal,
                request=embeddings_parse(body),
                request_id=rid,
                timeout=timeout,
                priority="batch",
                reply_ttl=reply_ttl,
            )
        with compiled_for(self.batch.tenant_id):
            if self.kind == RESPONSES:
                request = batch_line_parse(body, response_id=f"resp_{rid}").chat
            else:
                request = generation_parse(body, endpoint=self.kind)
        return await generation_submit(
            principal=principal,
            request=request,
            request_id=rid,
            timeout=timeout,
            priority="batch",
            reply_ttl=reply_ttl,
            endpoint=RESPONSES if self.kind == RESPONSES else None,
        )

    async def _collect(
        self,
        body: dict[str, Any],
        rid: str,
        events: AsyncIterator[Event],
        *,
        submitted: Submitted | None = None,
    ) -> bytes:
        """The line's response body; a resumed line (no `submitted`) names the model as asked."""
        on_end = functools.partial(request_ended, submitted) if submitted else None
        served = submitted.route.served_name if submitted else str(body.get("model", ""))
        if self.kind == "embeddings":
            answer = await embeddings_collect(
                events, embeddings_parse(body), model=served, on_end=on_end, request_id=rid
            )
            return answer.body  # JSON: a line asking for vLLM's bytes answer is refused
        if self.kind == RESPONSES:
            return await responses_collect(
                events,
                batch_line_parse(body, response_id=f"resp_{rid}"),
                model=served,
                submitted=submitted,
                tenant_id=self.batch.tenant_id,
            )
        parsed = generation_parse(body, endpoint=self.kind, tenant_id=self.batch.tenant_id)
        formatter = formatter_for(
            endpoint=self.kind,
            request_id=rid,
            model=served,
            version=submitted.route.version if submitted else None,
            created=int(time.time()),
            shape=answer_shape(
                parsed, submitted.route, submitted.job, rendered=submitted.rendered_prompt
            )
            if submitted
            else shape_of(parsed, decode=lambda ids: ""),
        )
        return await completion_collect(events, formatter, on_end)

    async def _wait_some(self, *, timeout: float) -> dict[int, Outcome]:
        if not self.in_flight:
            await asyncio.sleep(min(timeout, max(self.retry_at - time.monotonic(), 0.05)))
            return {}
        await asyncio.wait(
            self.in_flight.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        # Let lines ending together be recorded in one write.
        await asyncio.sleep(0.05)
        finished = {i: t for i, t in self.in_flight.items() if t.done()}
        outcomes = {}
        for index, task in finished.items():
            del self.in_flight[index]
            outcomes[index] = task.result()
        return outcomes

    async def _record(self, outcomes: dict[int, Outcome]) -> None:
        if outcomes:
            await db_call(_outcomes_save, batch=self.batch, outcomes=outcomes)

    async def _stop(self, status: str) -> bool:
        """Cancel or expire: abort the admitted lines, keep what finished, end the batch."""
        await _submitted_abort(self.dispatch, self.batch)
        # The aborted requests end at once; record what each finished with.
        if self.in_flight:
            await asyncio.wait(self.in_flight.values(), timeout=30)
        outcomes = {i: t.result() for i, t in self.in_flight.items() if t.done()}
        self.in_flight.clear()
        await self._record({i: o for i, o in outcomes.items() if o.state == LineState.SUCCEEDED})
        return await self._finish(status)

    async def _finish(self, status: str) -> bool:
        self.batch = await db_call(batch_finalize, batch=self.batch, status=status)
        log.info(
            "batch %s %s: %d completed, %d failed of %d",
            self.batch.id, status, self.batch.completed, self.batch.failed, self.batch.total,
        )  # fmt: skip
        return True

    async def _abandon(self) -> None:
        """Stop following lines (their requests keep running) and record those that ended.

        Submissions under way finish first (they take milliseconds): one cut off between its
        admission and the queue would hold its reservation and leave a request that never
        ends. One that still has not finished when the wait is up is left to the next step,
        which finds what it reached (see `_run_line`).
        """
        if self.submitting:
            await asyncio.wait(set(self.submitting), timeout=_SUBMIT_WAIT_SECONDS)
        outcomes = {i: t.result() for i, t in self.in_flight.items() if t.done()}
        for task in self.in_flight.values():
            task.cancel()
        await asyncio.gather(*self.in_flight.values(), return_exceptions=True)
        self.in_flight.clear()
        await self._record(outcomes)


async def _submitted_abort(dispatch: FrontDoor, batch: Batch) -> None:
    """Abort the requests of the batch's submitted lines that are still queued or running."""
    for line in await db_call(_lines, batch=batch, state=LineState.SUBMITTED, limit=None):
        where = await dispatch.whereabouts(line.request_id)
        if where is not None:
            await dispatch.cancel_by_id(where=where, request_id=line.request_id)


async def _reservation_release(rid: str, *, tenant_id: int) -> None:
    """Settle a reservation that queued nothing to nothing used (a no-op if it is settled)."""
    await quotas_get().release(
        tenant_id=tenant_id,
        request_id=rid,
        admitted_at=time.time(),
        used=Usage(tokens=0, cost_micros=0),
    )


def _succeeded(body: bytes) -> Outcome:
    return Outcome(state=LineState.SUCCEEDED, result={"status_code": 200, "body": json.loads(body)})


def _status(*, batch: Batch) -> str:
    return str(Batch.objects.values_list("status", flat=True).get(pk=batch.pk))


def _waiting_elsewhere(*, batch: Batch, since: dt.datetime) -> list[str]:
    """Other tenants' unfinished batches that have not had a step since `since` (a few)."""
    return list(
        Batch.objects.filter(status__in=UNFINISHED)
        .exclude(tenant_id=batch.tenant_id)
        .filter(Q(stepped_at__isnull=True) | Q(stepped_at__lt=since))
        .order_by(F("stepped_at").asc(nulls_first=True))
        .values_list("pk", flat=True)[:_WAITING_LOOKED_AT]
    )


def _lines(*, batch: Batch, state: str, limit: int | None) -> list[BatchLine]:
    lines = BatchLine.objects.filter(batch=batch, state=state).order_by("index")
    return list(lines[:limit] if limit is not None else lines)


def _claim(*, batch: Batch, limit: int) -> list[BatchLine]:
    """Mark the next pending lines submitted (before they are queued) and return them."""
    with transaction.atomic():
        lines = list(
            BatchLine.objects.select_for_update(skip_locked=True)
            .filter(batch=batch, state=LineState.PENDING)
            .order_by("index")[:limit]
        )
        BatchLine.objects.filter(pk__in=[line.pk for line in lines]).update(
            state=LineState.SUBMITTED
        )
    return lines


def _outcomes_save(*, batch: Batch, outcomes: dict[int, Outcome]) -> None:
    now = timezone.now()
    lines = list(BatchLine.objects.filter(batch=batch, index__in=list(outcomes)))
    for line in lines:
        outcome = outcomes[line.index]
        line.state, line.result, line.error = outcome.state, outcome.result, outcome.error
        line.ended_at = None if outcome.state == LineState.PENDING else now
    with transaction.atomic():
        BatchLine.objects.bulk_update(lines, ["state", "result", "error", "ended_at"])
        counts_refresh(batch=batch)


def _pending_fail(*, batch: Batch, error: ApiError) -> None:
    """End every line not yet run with the error that stops the batch (e.g. a revoked key)."""
    batch.lines.filter(state__in=[LineState.PENDING, LineState.SUBMITTED]).update(
        state=LineState.FAILED,
        result={"status_code": error.status, "body": error.body()},
        ended_at=timezone.now(),
    )


async def batch_step(batch_id: str) -> bool | None:
    """Run one step of a batch; True when it has ended, None when another runner holds it."""
    batch = await db_call(_batch, batch_id=batch_id)
    if batch is None or batch.ended:
        return True
    redis = dispatch_get().redis
    lease = settings.ROUNDHOUSE_BATCH_LEASE_SECONDS
    lock = Lock(redis, batch_lease_key(batch_id), timeout=lease, blocking=False)
    try:
        if not await lock.acquire():
            return None
        try:
            until = time.monotonic() + settings.ROUNDHOUSE_BATCH_STEP_SECONDS
            return await BatchRun(batch, lock, until=until).step()
        finally:
            with contextlib.suppress(LockError):
                await lock.release()
    finally:
        # What the step spawned (ending a request cut off half-way, releasing a reservation)
        # finishes before the loop ends and would cancel it.
        left = await settle(timeout=_SUBMIT_WAIT_SECONDS)
        if left:
            log.warning("batch %s: %d background tasks still running at the step's end",
                        batch_id, left)  # fmt: skip
        await redis.aclose()


async def batch_step_failed(batch_id: str, *, give_up: bool) -> bool:
    """After a step raised, end the batch if it need not run again; True once it has ended.

    A cancelled batch ends cancelled and one past its window expired, whatever its steps do;
    with `give_up` (its steps keep failing) one still running ends failed. Its lines still
    running are aborted and its unfinished lines end with it. Returns False, to try again,
    while another runner holds the batch.
    """
    batch = await db_call(_batch, batch_id=batch_id)
    if batch is None or batch.ended:
        return True
    if batch.status == BatchStatus.CANCELLING:
        status = BatchStatus.CANCELLED
    elif timezone.now() >= batch.expires_at:
        status = BatchStatus.EXPIRED
    elif give_up:
        status = BatchStatus.FAILED
    else:
        return False
    dispatch = dispatch_get()
    lease = settings.ROUNDHOUSE_BATCH_LEASE_SECONDS
    lock = Lock(dispatch.redis, batch_lease_key(batch_id), timeout=lease, blocking=False)
    try:
        if not await lock.acquire():
            return False
        try:
            try:
                await _submitted_abort(dispatch, batch)
            except Exception:
                # Their deadlines and leases still end them: the batch must end regardless.
                log.warning("batch %s: could not abort its lines", batch_id, exc_info=True)
            if status == BatchStatus.FAILED:
                message = "The batch stopped: its steps failed repeatedly (see its error file)."
                batch = await db_call(batch_fail, batch=batch, message=message)
            else:
                batch = await db_call(batch_finalize, batch=batch, status=status)
        finally:
            with contextlib.suppress(LockError):
                await lock.release()
    finally:
        await dispatch.redis.aclose()
    log.warning("batch %s %s after a failed step: %d completed, %d failed of %d",
                batch.id, status, batch.completed, batch.failed, batch.total)  # fmt: skip
    return True


def _batch(*, batch_id: str) -> Batch | None:
    # Not its input file: validation reads that once, and a step has no use for its bytes.
    return Batch.objects.select_related("api_key").filter(pk=batch_id).first()
