"""Collect a request's reply events into one whole answer body (no streaming), built by the
surface's collector (chat's formatter, or the Responses and Messages builders).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

import msgspec

from dataplane.types import Delta, Event, Failed, Finished
from inference.base.errors import ApiError
from inference.pipeline.admission import request_failure

_json = msgspec.json.Encoder()
OnEnd = Callable[[Finished | Failed], None] | None


async def events_close(events: AsyncIterator[Event]) -> None:
    """Close a request's event stream now, so a request nobody reads on is cancelled at once
    rather than whenever the stream is collected."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


def stream_ended() -> ApiError:
    """The refusal of a reply stream that closed without a terminal event."""
    return ApiError(503, "stream_ended", "The reply stream ended without a result.", retry_after=1)


class Collector(Protocol):
    """What builds a whole answer from a request's events (a chat or text completion's
    Formatter, a message's MessageBuilder)."""

    def add(self, delta: Delta) -> object: ...

    def complete(self, finished: Finished) -> bytes: ...


async def completion_collect(
    events: AsyncIterator[Event], formatter: Collector, on_end: OnEnd
) -> bytes:
    """Return a whole answer's body (a chat or text completion's, a message's), or raise the
    ApiError the request ended with.

    Whatever else raises, the events are closed first, which cancels a request still running.
    """
    try:
        async for event in events:
            if isinstance(event, Delta):
                formatter.add(event)
            elif isinstance(event, Finished | Failed):
                if on_end is not None:
                    on_end(event)
                if isinstance(event, Failed):
                    raise request_failure(event)
                return formatter.complete(event)
    finally:
        await events_close(events)
    raise stream_ended()
