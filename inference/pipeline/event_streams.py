"""A request's events as a stream of an API's own events (the Responses API's, Anthropic's
Messages API's), built by that API's builder: whatever breaks, the client gets one terminal
event."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import msgspec

from dataplane.types import Delta, Event, Failed, Finished
from inference.base.errors import ApiError, internal_error
from inference.base.metrics import RequestClock
from inference.pipeline.admission import request_failure
from inference.pipeline.collect import events_close, stream_ended

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()


class EventBuilder(Protocol):
    """An API's events of a request: its opening ones, those of each delta, its closing ones
    (`error`: what a failed request answers), and the one error event of a broken stream."""

    def start(self) -> list[dict[str, Any]]: ...

    def delta(self, delta: Delta) -> list[dict[str, Any]]: ...

    def end(
        self, event: Finished | Failed, *, error: ApiError | None = None
    ) -> list[dict[str, Any]]: ...

    def broken(self, error: ApiError) -> dict[str, Any]: ...


async def builder_stream(
    events: AsyncIterator[Event],
    builder: EventBuilder,
    clock: RequestClock,
    *,
    name: str,
    at_end: Callable[[Finished | Failed], Awaitable[None]] | None = None,
) -> AsyncIterator[bytes]:
    """The builder's events of a request, as SSE. `at_end` runs once the request has ended,
    before the client sees its end (settle it, store it); `name` is the stream's in logs."""
    ended = False
    try:
        for opening in builder.start():
            yield sse(opening)
        async for event in events:
            if isinstance(event, Delta):
                for piece in builder.delta(event):
                    yield sse(piece)
            elif isinstance(event, Finished | Failed):
                clock.skip()  # the worker timed everything up to its terminal event
                failure = request_failure(event) if isinstance(event, Failed) else None
                closing = builder.end(event, error=failure)
                if at_end is not None:
                    await at_end(event)
                ended = True
                for piece in closing:
                    yield sse(piece)
                break
        clock.lap("relay")
        if not ended:
            raise stream_ended()
    except (asyncio.CancelledError, GeneratorExit):
        raise  # the client is gone: nobody is left to tell
    except BaseException as exc:
        log.error("the stream of %s failed", name, exc_info=True)
        if not ended:
            yield sse(builder.broken(exc if isinstance(exc, ApiError) else internal_error()))
        if not isinstance(exc, Exception):
            raise
    finally:
        await events_close(events)
        clock.finish()


def sse(event: dict[str, Any]) -> bytes:
    """One event as OpenAI streams it: its type as the SSE event name, the JSON as data."""
    return b"event: " + event["type"].encode() + b"\ndata: " + _json.encode(event) + b"\n\n"
