"""Relay a request's reply stream to its client, and cancel it when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from dataplane.background import spawn
from dataplane.frontdoor import FrontDoor, Whereabouts
from dataplane.redis_client import UNREACHABLE, Outage
from dataplane.replies import ReaderFailed
from dataplane.types import Delta, Event, Failed, Finished, Started
from inference.base.metrics import stream_ended, stream_outcome
from inference.pipeline.admission import Submitted, content_keep
from inference.pipeline.answer_cache import CacheUse, Stored
from inference.pipeline.breaker import breaker_ended
from inference.pipeline.clients import answer_cache_get, dispatch_get
from inference.pipeline.idempotency import Original
from inference.pipeline.safety import output_filtered, policy_get
from safety.policy import Policy

log = logging.getLogger(__name__)


@dataclass
class Cursor:
    """Where a reader is in a reply stream: the entry id of the last event it was given.

    SSE sends it as each event's `id:`, so a client cut off mid-stream (its frontend died, its
    network dropped) resumes after it with `Last-Event-ID` and gets every token once.
    """

    last: str = "0-0"


def cancel_soon(dispatch: FrontDoor, submitted: Submitted) -> None:
    """Cancel a request without waiting, even from a task that is itself being cancelled."""
    spawn(dispatch.cancel(job=submitted.job))


# The terminal event a client gets when its frontend's reply reader failed: the request may
# run on, but this relay cannot say how it ends. Not the request's own end (see `events`).
RELAY_FAILED = "relay_failed"

# After its deadline a request still gets this long for its terminal event to arrive: the
# worker (or the queue) ends it at the deadline with `deadline_exceeded`.
_GRACE_SECONDS = 2.0


async def events(
    dispatch: FrontDoor, submitted: Submitted, *, cursor: Cursor | None = None
) -> AsyncIterator[Event]:
    """Yield a request's events until its terminal one; consecutive deltas arrive merged.

    If the consumer stops early (client disconnect), or the relay fails, the request is
    cancelled so the worker aborts it in the engine: its client got its terminal event.

    A streamed request's relay counts how it ended (`roundhouse_streams_ended_total`): every
    surface, SSE and WebSocket, relays its own requests here.
    """
    job = submitted.job
    finished = False
    outcome = ""  # how it ended, once it did; "" when the consumer stopped early
    # A cacheable answer the tenant's cache lacks is kept as it streams, stored if it ends well;
    # a tenant that retains its text keeps what the request produced, however it ended.
    fill = submitted.cache if submitted.cache is not None and not submitted.cache.hit else None
    keep = fill is not None or submitted.prompt_text is not None
    text: list[str] = []
    policy = submitted.policy
    filtered = policy is not None and policy.apply_to_output
    followed = _follow(
        dispatch,
        deployment=job.deployment,
        request_id=job.request_id,
        deadline=job.deadline,
        # Still queued: it ends now, in the queue. Running: its worker ends it.
        at_deadline=lambda: dispatch.expire(job),
        # Filtered text is held back: the stream's position is not the client's.
        cursor=None if filtered else cursor,
    )
    if policy is not None and filtered:
        followed = output_filtered(
            followed,
            policy=policy,
            tenant_id=job.tenant_id,
            request_id=job.request_id,
            prompt_tokens=len(job.prompt_token_ids),
            stop=lambda: dispatch.cancel(job=job),
        )
    try:
        async for event in followed:
            if isinstance(event, Failed) and event.code == RELAY_FAILED:
                outcome = "relay_failed"
                yield event  # `finished` stays False: the request is cancelled below
                return
            finished = isinstance(event, Finished | Failed)
            if finished:
                outcome = stream_outcome(event.code if isinstance(event, Failed) else None)
            if finished and submitted.breaker_alias:
                breaker_ended(submitted.breaker_alias, job.tenant_id, job.request_id, event)
            if keep:
                if isinstance(event, Delta):
                    text.append(event.text)
                elif finished:
                    _ended(submitted, "".join(text), event, fill=fill)
            yield event
        if not finished:
            finished = True
            outcome = "timeout"
            cancel_soon(dispatch, submitted)
            yield _timed_out(prompt_tokens=len(job.prompt_token_ids))
    except Exception:
        outcome = outcome or "error"
        raise
    finally:
        if not finished:
            cancel_soon(dispatch, submitted)
        if job.stream:
            stream_ended(deployment=job.deployment, outcome=outcome or "client_gone")


def _ended(submitted: Submitted, text: str, event: Event, *, fill: CacheUse | None) -> None:
    """Fill the response cache and retain the text, off the client's path."""
    if fill is not None and isinstance(event, Finished):
        answer = Stored(text, event.finish_reason, event.completion_tokens, event.stop_reason(0))
        spawn(answer_cache_get().put(fill.key, answer, seconds=fill.seconds))
    if submitted.prompt_text is not None:
        spawn(content_keep(submitted, text))


async def original_events(original: Original, *, tenant_id: int) -> AsyncIterator[Event]:
    """The events of an Idempotency-Key's first request, for its retry: from the start of its
    reply stream (kept as long as the key), filtered by the tenant's policy as the first
    request's own answer was."""
    return attach(
        dispatch_get(),
        deployment=original.deployment,
        request_id=original.request_id,
        deadline=original.deadline,
        policy=await policy_get(tenant_id=tenant_id, version=original.version),
        tenant_id=tenant_id,
    )


async def attach(
    dispatch: FrontDoor,
    *,
    deployment: str,
    request_id: str,
    deadline: float,
    policy: Policy | None = None,
    tenant_id: int = 0,
    after: str = "0-0",
    cursor: Cursor | None = None,
) -> AsyncIterator[Event]:
    """Yield another request's events from its start, or after an entry id (a resumed stream).

    Used for an Idempotency-Key retry, a batch line and a client resuming with Last-Event-ID.

    The attached client does not own the request: leaving early cancels nothing. Its tenant's
    policy filters the text as it does for the request's own client; text it stops is never
    sent, and the request is cancelled if it still runs.
    """
    filtered = policy is not None and policy.apply_to_output
    followed = _follow(
        dispatch,
        deployment=deployment,
        request_id=request_id,
        deadline=deadline,
        after=after,
        cursor=None if filtered else cursor,
    )
    if policy is not None and filtered:
        where = Whereabouts(tenant_id=tenant_id, deployment=deployment)
        followed = output_filtered(
            followed,
            policy=policy,
            tenant_id=tenant_id,
            request_id=request_id,
            prompt_tokens=0,
            stop=lambda: dispatch.cancel_by_id(where=where, request_id=request_id),
        )
    finished = False
    async for event in followed:
        finished = isinstance(event, Finished | Failed)
        yield event
    if not finished:
        yield _timed_out(prompt_tokens=0)


async def _follow(
    dispatch: FrontDoor,
    *,
    deployment: str,
    request_id: str,
    deadline: float,
    at_deadline: Callable[[], Awaitable[object]] | None = None,
    after: str = "0-0",
    cursor: Cursor | None = None,
) -> AsyncIterator[Event]:
    """Yield a reply stream's events after an entry id (deltas merged) up to its terminal one.

    Stops without a terminal event if none arrives within the grace time after the deadline;
    `at_deadline` runs once when the deadline passes. Ends with a `relay_failed` event if the
    reply reader fails.
    """
    overdue = False
    # One per stream: the frontend's refusals already say Redis is down, at warning level.
    outage = Outage("relaying a reply stream", log, logging.DEBUG)
    follower = dispatch.follow_replies(deployment=deployment, request_id=request_id, after=after)
    try:
        while True:
            now = time.time()
            if now >= deadline and not overdue:
                overdue = True
                if at_deadline is not None:
                    # Unreachable, the reaper ends the queued job at its deadline instead.
                    with contextlib.suppress(*UNREACHABLE):
                        await at_deadline()
            remaining = (deadline + _GRACE_SECONDS if overdue else deadline) - now
            if overdue and remaining <= 0:
                return
            try:
                batch = await follower.read(block_ms=max(int(min(remaining, 5.0) * 1000), 1))
                outage.ok()
            except ReaderFailed as exc:
                log.warning("relay of %s failed: %s", request_id, exc)
                yield _relay_failed()
                return
            except UNREACHABLE as exc:
                # The request runs on and its events are kept: read on from the same entry
                # once Redis is back (or end, as above, if the deadline passes first).
                await asyncio.sleep(min(outage.failed(exc), max(remaining, 0.0)))
                continue
            pending: Delta | None = None
            pending_last = after
            for entry_id, event in batch:
                if isinstance(event, Delta):
                    if pending is not None and not pending.joins(event):
                        if cursor is not None:
                            cursor.last = pending_last
                        yield pending
                        pending = None
                    pending = event if pending is None else pending.then(event)
                    pending_last = after = entry_id
                    continue
                if pending is not None:
                    if cursor is not None:
                        cursor.last = pending_last
                    yield pending
                    pending = None
                after = entry_id
                if cursor is not None:
                    cursor.last = entry_id
                if isinstance(event, Started):
                    continue
                yield event
                if isinstance(event, Finished | Failed):
                    return
            if pending is not None:
                if cursor is not None:
                    cursor.last = pending_last
                yield pending
    finally:
        follower.close()


def _relay_failed() -> Failed:
    return Failed(
        code=RELAY_FAILED,
        message="this frontend lost the request's reply stream; please retry",
        prompt_tokens=0,
        completion_tokens=0,
    )


def _timed_out(*, prompt_tokens: int) -> Failed:
    return Failed(
        code="timeout",
        message="the request took longer than its deadline",
        prompt_tokens=prompt_tokens,
        completion_tokens=0,
    )
