"""A response whose client stops reading is given up after the write timeout.

The send here stands for uvicorn's, which waits while the connection's write buffer is full;
tests/inference/invariants/test_cheap_checks.py cuts a real socket that never reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from django.http import HttpResponse, StreamingHttpResponse

from inference.base.metrics import write_timeouts
from inference.edge.asgi import ApiHandler, WriteTimeout


class _Transport:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


class _Cycle:
    """A connection whose client reads the first `taken` messages, then nothing."""

    def __init__(self, taken: int) -> None:
        self.transport = _Transport()
        self.taken = taken
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        if len(self.messages) >= self.taken:
            await asyncio.Event().wait()  # its buffer never drains
        self.messages.append(message)


@pytest.fixture
def handler(settings: Any) -> ApiHandler:
    settings.ROUNDHOUSE_WRITE_TIMEOUT_SECONDS = 0.05
    return ApiHandler()


async def test_a_response_whose_client_stops_reading_is_given_up(handler):
    cycle = _Cycle(taken=3)
    with pytest.raises(WriteTimeout):
        await handler.send_response(HttpResponse(b"x" * 1_000_000), cycle.send)
    assert [m["type"] for m in cycle.messages] == ["http.response.start"] + 2 * [
        "http.response.body"
    ]


async def test_a_stream_given_up_is_closed_as_on_a_disconnect(handler):
    closed = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: {}\n\n"
        finally:
            closed.set()  # a view's stream closes its events here: the request is cancelled

    cycle = _Cycle(taken=5)
    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    with pytest.raises(WriteTimeout):
        await handler.send_response(response, cycle.send)
    del response  # the handler lets it go, as it does a disconnected one's
    await asyncio.wait_for(closed.wait(), timeout=30)


async def test_a_stalled_connection_is_cut_and_counted(handler):
    cycle = _Cycle(taken=2)
    before = write_timeouts._value.get()
    await handler._send(HttpResponse(b"x" * 1_000_000), cycle.send)
    assert cycle.transport.aborted
    assert write_timeouts._value.get() == before + 1


async def test_a_client_that_reads_gets_the_whole_response(handler):
    cycle = _Cycle(taken=10**6)
    await handler._send(HttpResponse(b"x" * 1_000_000), cycle.send)
    assert b"".join(m.get("body", b"") for m in cycle.messages) == b"x" * 1_000_000
    assert not cycle.transport.aborted


async def test_a_slow_client_that_keeps_reading_is_not_cut(settings):
    """The timeout bounds each message's wait, not the whole response's."""
    settings.ROUNDHOUSE_WRITE_TIMEOUT_SECONDS = 1.0
    messages = []

    async def slow(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)  # a little of its buffer drains at a time
        messages.append(message)

    body = b"x" * (150 * 64 * 1024)  # 150 messages: longer than the timeout in all
    await ApiHandler().send_response(HttpResponse(body), slow)
    assert b"".join(m.get("body", b"") for m in messages) == body


async def test_no_write_timeout_leaves_a_slow_client_its_time(settings):
    settings.ROUNDHOUSE_WRITE_TIMEOUT_SECONDS = 0
    cycle = _Cycle(taken=2)
    sending = asyncio.create_task(ApiHandler()._send(HttpResponse(b"x" * 1_000_000), cycle.send))
    await asyncio.sleep(0.2)
    assert not sending.done()
    sending.cancel()
    await asyncio.gather(sending, return_exceptions=True)
