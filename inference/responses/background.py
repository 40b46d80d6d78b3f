"""Background responses: they run on with no client attached and end in the store, whichever
frontend is alive.

A background response's events are rebuilt from its reply stream in Redis, one event per
entry (never merged as a live relay merges them), so every frontend that replays it numbers
its events alike: a stream resumed elsewhere with `starting_after` sends each event once.
What ends it in the store: the frontend that accepted it (it follows the reply stream to
the end), or, when that frontend is gone, the first `GET` of it on any frontend, or the
minutely sweep (`responses_orphans_finish`), within the reply stream's lifetime.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from config.db import db_call
from dataplane.frontdoor import FrontDoor
from dataplane.types import Delta, Event, Failed, Finished
from inference.pipeline.admission import request_failure
from inference.pipeline.safety import Policy, output_filtered, policy_get, served_version
from inference.responses.format import ResponseBuilder
from inference.responses.store import (
    TERMINAL_STATUSES,
    Kept,
    response_finish,
    responses_unfinished,
)

log = logging.getLogger(__name__)
# A follower's longest wait for a reply entry before it looks at the deadline again.
_BLOCK_S = 5.0


def builder_of(kept: Kept) -> ResponseBuilder:
    """A builder that replays a stored background response from its start."""
    body = dict(kept.body)
    echo = {
        k: v
        for k, v in body.items()
        if k
        not in (
            "id", "object", "created_at", "completed_at", "status", "error",
            "incomplete_details", "model", "output", "output_text", "usage",
        )
    }  # fmt: skip
    return ResponseBuilder(
        response_id=kept.id,
        model=body["model"],
        echo=echo,
        created_at=body["created_at"],
        status="queued",
    )


async def _entries(
    dispatch: FrontDoor, *, deployment: str, request_id: str, follow: bool, deadline: float
) -> AsyncIterator[Event]:
    """A request's reply events one entry at a time.

    A poll (`follow` false) reads what the stream holds now with reads of its own; a follower
    waits for the rest up to the end (or the deadline) over the frontend's shared reader of
    the deployment, so a thousand background responses do not hold a thousand connections.
    """
    if not follow:
        after = "0-0"
        while True:
            entries = await dispatch.read_events(
                deployment=deployment, request_id=request_id, after=after, block_ms=1
            )
            if not entries:
                return
            for _, event in entries:
                yield event
                if isinstance(event, Finished | Failed):
                    return
            after = entries[-1][0]
    follower = dispatch.follow_replies(deployment=deployment, request_id=request_id, after="0-0")
    try:
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                return
            batch = await follower.read(block_ms=max(int(min(remaining, _BLOCK_S) * 1000), 1))
            for _, event in batch:
                yield event
                if isinstance(event, Finished | Failed):
                    return
    finally:
        follower.close()


async def replay(
    dispatch: FrontDoor,
    builder: ResponseBuilder,
    *,
    deployment: str,
    request_id: str,
    tenant_id: int,
    policy: Policy | None,
    follow: bool,
    deadline: float,
    on_end: Callable[[Finished | Failed], None] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Yield a background response's events from its start; the builder ends up holding it.

    Without `follow` it reads what the stream holds now (a poll); the last event is then not
    terminal when the response is still running. `on_end` gets the request's terminal event.
    """
    for opening in builder.start():
        yield opening
    events = _entries(
        dispatch, deployment=deployment, request_id=request_id, follow=follow, deadline=deadline
    )
    if policy is not None and policy.apply_to_output:
        from dataplane.frontdoor import Whereabouts

        where = Whereabouts(tenant_id=tenant_id, deployment=deployment)
        events = output_filtered(
            events,
            policy=policy,
            tenant_id=tenant_id,
            request_id=request_id,
            prompt_tokens=0,
            stop=lambda: dispatch.cancel_by_id(where=where, request_id=request_id),
        )
    async for event in events:
        for piece in builder.running():
            yield piece
        if isinstance(event, Delta):
            for piece in builder.delta(event):
                yield piece
        elif isinstance(event, Finished | Failed):
            if on_end is not None:
                on_end(event)
            error = request_failure(event) if isinstance(event, Failed) else None
            for piece in builder.end(event, error=error):
                yield piece
            return


async def finish_stored(builder: ResponseBuilder, *, tenant_id: int, last_sequence: int) -> bool:
    """Write a background response's end to the store once (False: it was written already)."""
    return await db_call(
        response_finish,
        tenant_id=tenant_id,
        response_id=builder.response_id,
        body=builder.body(),
        last_sequence=last_sequence,
    )


async def settle_from_stream(
    dispatch: FrontDoor,
    kept: Kept,
    *,
    tenant_id: int,
    policy: Policy | None,
    follow: bool,
    deadline: float,
) -> ResponseBuilder | None:
    """Rebuild a background response from its reply stream; store its end when it has one.

    Returns the builder (the response as it stands), or None when the stream is gone.
    """
    where = await dispatch.whereabouts(kept.request_id)
    if where is None:
        return None
    builder = builder_of(kept)
    last = -1
    async for event in replay(
        dispatch,
        builder,
        deployment=where.deployment,
        request_id=kept.request_id,
        tenant_id=tenant_id,
        policy=policy,
        follow=follow,
        deadline=deadline,
    ):
        last = event["sequence_number"]
    if builder.status in TERMINAL_STATUSES:
        await finish_stored(builder, tenant_id=tenant_id, last_sequence=last)
    return builder


async def orphans_finish(dispatch: FrontDoor, *, older_than: float = 60.0) -> int:
    """End in the store every unfinished background response whose request has ended (its
    accepting frontend is gone); return how many. Run by the minutely sweep."""
    finished = 0
    for tenant_id, kept in await db_call(responses_unfinished, older_than=older_than):
        try:
            # The tenant's safety policy reads the text as it read the client's stream.
            policy = await policy_get(
                tenant_id=tenant_id, version=served_version(kept.body["model"])
            )
            builder = await settle_from_stream(
                dispatch, kept, tenant_id=tenant_id, policy=policy, follow=False, deadline=0.0
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("could not finish background response %s", kept.id)
            continue
        if builder is not None and builder.status in TERMINAL_STATUSES:
            finished += 1
    return finished
