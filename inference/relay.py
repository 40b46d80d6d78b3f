"""Relay a request's reply stream to its client, and cancel it when the client goes away."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from inference.background import spawn
from inference.content_policy import output_filtered
from inference.dispatch import Dispatch, Whereabouts
from inference.response_cache import Stored
from inference.services import CacheUse, Submitted, content_keep, responses_get
from inference.types import Delta, Event, Failed, Finished, Started
from safety.policy import Policy

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
    finished = False
    # A cacheable answer the tenant's cache lacks is kept as it streams, stored if it ends well;
    # a tenant that retains its text keeps what the request produced, however it ended.
    fill = submitted.cache if submitted.cache is not None and not submitted.cache.hit else None
    keep = fill is not None or submitted.prompt_text is not None
    text: list[str] = []
    followed = _follow(
        dispatch,
        deployment=job.deployment,
        request_id=job.request_id,
        deadline=job.deadline,
        # Still queued: it ends now, in the queue. Running: its worker ends it.
        at_deadline=lambda: dispatch.expire(job),
    )
    policy = submitted.policy
    if policy is not None and policy.apply_to_output:
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
            finished = isinstance(event, Finished | Failed)
            if keep:
                if isinstance(event, Delta):
                    text.append(event.text)
                elif finished:
                    _ended(submitted, "".join(text), event, fill=fill)
            yield event
        if not finished:
            finished = True
            cancel_soon(dispatch, submitted)
            yield _timed_out(prompt_tokens=len(job.prompt_token_ids))
    finally:
        if not finished:
            cancel_soon(dispatch, submitted)


def _ended(submitted: Submitted, text: str, event: Event, *, fill: CacheUse | None) -> None:
    """Fill the response cache and retain the text, off the client's path."""
    if fill is not None and isinstance(event, Finished):
        answer = Stored(text, event.finish_reason, event.completion_tokens)
        spawn(responses_get().put(fill.key, answer, seconds=fill.seconds))
    if submitted.prompt_text is not None:
        spawn(content_keep(submitted, text))


async def attach(
    dispatch: Dispatch,
    *,
    deployment: str,
    request_id: str,
    deadline: float,
    policy: Policy | None = None,
    tenant_id: int = 0,
) -> AsyncIterator[Event]:
    """Yield another request's events from its start (an Idempotency-Key retry, a batch line).

    The attached client does not own the request: leaving early cancels nothing. Its tenant's
    policy filters the text as it does for the request's own client; text it stops is never
    sent, and the request is cancelled if it still runs.
    """
    followed = _follow(dispatch, deployment=deployment, request_id=request_id, deadline=deadline)
    if policy is not None and policy.apply_to_output:
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
    dispatch: Dispatch,
    *,
    deployment: str,
    request_id: str,
    deadline: float,
    at_deadline: Callable[[], Awaitable[object]] | None = None,
) -> AsyncIterator[Event]:
    """Yield a reply stream's events (deltas merged) up to its terminal one.

    Stops without a terminal event if none arrives within the grace time after the deadline;
    `at_deadline` runs once when the deadline passes.
    """
    after = "0-0"
    overdue = False
    while True:
        now = time.time()
        if now >= deadline and not overdue:
            overdue = True
            if at_deadline is not None:
                await at_deadline()
        remaining = (deadline + _GRACE_SECONDS if overdue else deadline) - now
        if overdue and remaining <= 0:
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
            if isinstance(event, Started):
                continue
            yield event
            if isinstance(event, Finished | Failed):
                return
        if pending is not None:
            yield pending


def _timed_out(*, prompt_tokens: int) -> Failed:
    return Failed(
        code="timeout",
        message="the request took longer than its deadline",
        prompt_tokens=prompt_tokens,
        completion_tokens=0,
    )


def _merge(pending: Delta | None, event: Delta) -> Delta:
    if pending is None:
        return event
    return Delta(text=pending.text + event.text, tokens=pending.tokens + event.tokens)
