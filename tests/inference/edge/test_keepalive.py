"""A stream with nothing to send sends keep-alives, and what it makes in one go goes in one
write (inference/edge/endpoint.kept_alive).

The logic, with the stream's maker a generator that waits; tests/e2e/test_keepalive.py runs a
queued stream through a relay that cuts idle connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator

import pytest
from django.http import StreamingHttpResponse

from inference.base.metrics import stream_keepalives
from inference.edge.asgi import ApiHandler, LastPart
from inference.edge.endpoint import AHEAD_BYTES, SSE_KEEPALIVE, kept_alive, sse_response
from inference.messages.format import PING

# The gap a slow stream leaves is many keep-alive periods long, so that the test reads what
# happens in it, not how long anything took.
PERIOD = 0.02
GAP = 0.3


class _Made:
    """A stream's chunks: `pauses[i]` seconds before chunk i; whether it was closed."""

    def __init__(self, *pauses: float, fail: BaseException | None = None) -> None:
        self.pauses = pauses
        self.fail = fail
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            for index, pause in enumerate(self.pauses):
                await asyncio.sleep(pause)
                yield b"data: %d\n\n" % index
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


async def _all(stream: AsyncIterable[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]


async def _first_event(stream: AsyncIterator[bytes], keepalive: bytes = SSE_KEEPALIVE) -> bytes:
    """The stream's first chunk that is not a keep-alive: on a busy machine the maker may not
    have run before the first period passed."""
    while (chunk := await anext(stream)) == keepalive:
        pass
    return chunk


def _sent(response: StreamingHttpResponse) -> AsyncIterable[bytes]:
    content = response.streaming_content
    assert isinstance(content, AsyncIterable)  # an async stream, as the views make
    return content


async def test_a_stream_that_waits_sends_keepalives_in_the_gap_and_then_its_events():
    made = _Made(0, GAP, 0)
    before = stream_keepalives._value.get()
    sent = await _all(kept_alive(made.chunks(), keepalive=SSE_KEEPALIVE, seconds=PERIOD))
    events = [chunk for chunk in sent if chunk != SSE_KEEPALIVE]
    assert events == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    gap = sent[sent.index(b"data: 0\n\n") + 1 : sent.index(b"data: 1\n\n")]
    assert len(gap) >= 2  # several periods passed in the gap, each with its keep-alive
    assert gap == [SSE_KEEPALIVE] * len(gap)
    assert stream_keepalives._value.get() - before == sent.count(SSE_KEEPALIVE)
    assert made.closed


async def test_a_stream_that_never_waits_sends_no_keepalive():
    made = _Made(0, 0, 0, 0)
    sent = await _all(kept_alive(made.chunks(), keepalive=SSE_KEEPALIVE, seconds=GAP))
    assert sent == [b"data: %d\n\n" % i for i in range(4)]


async def test_what_the_stream_raises_is_raised_where_it_is_sent():
    made = _Made(0, fail=RuntimeError("the relay failed"))
    stream = kept_alive(made.chunks(), keepalive=SSE_KEEPALIVE, seconds=PERIOD)
    assert await _first_event(stream) == b"data: 0\n\n"
    with pytest.raises(RuntimeError, match="the relay failed"):
        await _first_event(stream)
    assert made.closed


class _NotAnException(BaseException):
    """What no `except Exception` catches (a SystemExit, a KeyboardInterrupt, a cancel)."""


@pytest.mark.parametrize(
    "failure", [_NotAnException("interrupted"), asyncio.CancelledError("the relay stopped")]
)
async def test_what_is_not_an_exception_is_raised_where_it_is_sent_too(failure):
    # A maker that died of it once left the stream sending keep-alives for ever.
    made = _Made(0, fail=failure)
    stream = kept_alive(made.chunks(), keepalive=SSE_KEEPALIVE, seconds=PERIOD)
    assert await _first_event(stream) == b"data: 0\n\n"
    with pytest.raises(type(failure)):
        async with asyncio.timeout(GAP * 10):  # not a keep-alive after another
            while True:
                assert await anext(stream) == SSE_KEEPALIVE
    assert made.closed


async def test_a_client_that_leaves_closes_the_stream_while_it_waits():
    made = _Made(0, 60)
    stream = kept_alive(made.chunks(), keepalive=PING, seconds=PERIOD)
    assert await _first_event(stream, PING) == b"data: 0\n\n"
    assert await anext(stream) == PING  # waiting for chunk 1, a minute away
    await stream.aclose()  # the disconnect
    assert made.closed  # its generator closed: the request is cancelled there


async def test_a_cancelled_send_closes_the_stream_too():
    made = _Made(0, 60)
    stream = kept_alive(made.chunks(), keepalive=SSE_KEEPALIVE, seconds=60)
    assert await anext(stream) == b"data: 0\n\n"
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(PERIOD)
    waiting.cancel()  # the write timeout cancels the task that sends the response
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    assert made.closed


async def test_the_setting_turns_keepalives_off(settings):
    settings.ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS = 0
    sent = await _all(_sent(sse_response(_Made(GAP).chunks())))
    assert sent == [b"data: 0\n\n"]  # sent as made: nothing in the gap
    settings.ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS = PERIOD
    sent = await _all(_sent(sse_response(_Made(GAP).chunks())))
    assert sent[0] == SSE_KEEPALIVE and sent[-1] == b"data: 0\n\n"


async def _burst(*chunks: bytes) -> AsyncIterator[bytes]:
    """Chunks made in one go, as a request's last tokens and its end are."""
    for chunk in chunks:
        yield chunk


async def test_chunks_made_in_one_go_go_out_as_one_part_which_says_it_is_the_last():
    last = LastPart()
    stream = kept_alive(_burst(b"a", b"b", b"c"), keepalive=SSE_KEEPALIVE, seconds=60, last=last)
    assert await anext(stream) == b"abc"
    assert last.reached
    assert await _all(stream) == []


async def test_only_the_part_after_which_the_stream_ends_says_it_is_the_last():
    last = LastPart()
    stream = kept_alive(_Made(0, GAP).chunks(), keepalive=SSE_KEEPALIVE, seconds=60, last=last)
    assert await anext(stream) == b"data: 0\n\n"
    assert not last.reached
    assert await anext(stream) == b"data: 1\n\n"
    assert last.reached


async def test_a_reader_that_falls_behind_gets_what_was_made_meanwhile_in_one_part_up_to_a_bound():
    size = 16 * 1024
    made = 0

    async def many() -> AsyncIterator[bytes]:
        nonlocal made
        for _ in range(100):
            made += 1
            yield b"x" * size
            await asyncio.sleep(0)

    stream = kept_alive(many(), keepalive=SSE_KEEPALIVE, seconds=60)
    first = await anext(stream)
    assert len(first) < AHEAD_BYTES
    await asyncio.sleep(GAP)  # the reader is busy with its first part; the maker goes on
    assert made <= len(first) // size + AHEAD_BYTES // size + 1  # to its bound, not to its end
    assert len(await anext(stream)) == AHEAD_BYTES  # what it made meanwhile, in one part
    await stream.aclose()


async def _sent_messages(response: StreamingHttpResponse) -> list[dict]:
    messages: list[dict] = []

    async def send(message: dict) -> None:
        messages.append(message)

    await ApiHandler().send_response(response, send)
    return messages


async def test_a_streams_last_part_ends_its_body_in_the_same_message(settings):
    settings.ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS = 60
    messages = await _sent_messages(sse_response(_Made(0, GAP).chunks()))
    assert [m["type"] for m in messages] == ["http.response.start"] + 2 * ["http.response.body"]
    assert messages[1] == {"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True}
    # The body's end is the last part's own message, not an empty one after it.
    assert messages[2] == {"type": "http.response.body", "body": b"data: 1\n\n"}


async def test_a_last_part_longer_than_a_message_ends_the_body_with_its_last_slice(settings):
    settings.ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS = 60
    long = b"y" * (ApiHandler.chunk_size + 10)
    messages = await _sent_messages(sse_response(_burst(long)))
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert b"".join(m["body"] for m in bodies) == long
    assert [m.get("more_body", False) for m in bodies] == [True, False]
    assert bodies[-1]["body"] == long[ApiHandler.chunk_size :]


async def test_without_keepalives_a_stream_still_joins_its_parts_and_ends_its_body_with_them(
    settings,
):
    settings.ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS = 0
    messages = await _sent_messages(sse_response(_burst(b"a", b"b")))
    assert messages[1:] == [{"type": "http.response.body", "body": b"ab"}]


async def test_a_stream_that_does_not_mark_its_last_part_ends_its_body_after_it():
    messages = await _sent_messages(StreamingHttpResponse(_burst(b"a", b"b")))
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert [m.get("body", b"") for m in bodies] == [b"a", b"b", b""]
    assert [m.get("more_body", False) for m in bodies] == [True, True, False]


def test_anthropics_ping_is_an_sse_event_named_ping():
    assert PING == b'event: ping\ndata: {"type": "ping"}\n\n'
