"""Relay a request's reply stream to its client, and cancel it when the client goes away."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from inference.background import spawn
from inference.dispatch import Dispatch
from inference.services import Submitted
from inference.types import Delta, Event, Failed, Finished, Started

log = logging.getLogger(__name__)


def cancel_soon(dispatch: Dispatch, submitted: Submitted) -> None:
    """Cancel a request without waiting, even from a task that is itself being cancelled."""
    spawn(dispatch.cancel(job=submitted.job))


# After its deadline a request still gets this long for its terminal event to arrive: the
# worker (or the queue) ends it at the deadline with `deadline_exceeded`.
_GRACE_SECONDS = 2.0


async def events(dispatch: Dispatch, submitted: Submitted) -> AsyncIterator[Event]:
    """Yield a request's events until its terminal one; consecutive deltas arrive merged.

    If the consumer stops early (client disconnect), the request is cancelled so the worker
    aborts it in the engine.
    """
    job = submitted.job
    after = "0-0"
    finished = False
    overdue = False
    try:
        while True:
            now = time.time()
            if now >= job.deadline and not overdue:
                # Still queued: it ends now, here. Running: its worker ends it.
                overdue = True
                await dispatch.expire(job)
            wait_until = job.deadline + _GRACE_SECONDS if overdue else job.deadline
            remaining = wait_until - now
            if overdue and remaining <= 0:
                cancel_soon(dispatch, submitted)
                finished = True
                yield Failed(
                    code="timeout",
                    message="the request took longer than its deadline",
                    prompt_tokens=len(job.prompt_token_ids),
                    completion_tokens=0,
                )
                return
            batch = await dispatch.read_events(
                deployment=job.deployment,
                request_id=job.request_id,
                after=after,
                block_ms=max(int(min(remaining, 5.0) * 1000), 1),
            )
            pending: Delta | None = None
            for entry_id, event in batch:
                after = entry_id
                if isinstance(event, Delta):
                    pending = _merge(pending, event)
                    continue
                if pending is not None:
                    yield pending
                    pending = None
                if isinstance(event, Finished | Failed):
                    finished = True
                    yield event
                    return
                if not isinstance(event, Started):
                    yield event
            if pending is not None:
                yield pending
    finally:
        if not finished:
            cancel_soon(dispatch, submitted)


async def attach(
    dispatch: Dispatch, *, deployment: str, request_id: str, deadline: float
) -> AsyncIterator[Event]:
    """Yield another request's events from its start (an Idempotency-Key retry).

    The attached client does not own the request: leaving early cancels nothing.
    """
    after = "0-0"
    while True:
        remaining = deadline + _GRACE_SECONDS - time.time()
        if remaining <= 0:
            yield Failed(
                code="timeout",
                message="the request took longer than its deadline",
                prompt_tokens=0,
                completion_tokens=0,
            )
            return
        batch = await dispatch.read_events(
            deployment=deployment,
            request_id=request_id,
            after=after,
            block_ms=max(int(min(remaining, 5.0) * 1000), 1),
        )
        pending: Delta | None = None
        for entry_id, event in batch:
            after = entry_id
            if isinstance(event, Delta):
                pending = _merge(pending, event)
                continue
            if pending is not None:
                yield pending
                pending = None
            if not isinstance(event, Started):
                yield event
            if isinstance(event, Finished | Failed):
                return
        if pending is not None:
            yield pending


def _merge(pending: Delta | None, event: Delta) -> Delta:
    if pending is None:
        return event
    return Delta(text=pending.text + event.text, tokens=pending.tokens + event.tokens)
