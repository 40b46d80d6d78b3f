"""The WebSocket's frames: what a request's events carry beyond text, and the bounds on what
a socket's client may send before its frames are read (`_Inbox`)."""

from __future__ import annotations

import asyncio
from typing import Any

from dataplane.types import Delta, Finished
from inference.chat.format import finished_usage
from inference.websocket.format import delta_message
from inference.websocket.protocol import FRAME_BYTES
from inference.websocket.views import _Inbox


def test_a_reasoning_models_thinking_rides_in_its_own_key():
    frame = delta_message("c1", Delta(text="", tokens=2, reasoning="They greet me."))
    assert frame == {
        "type": "delta",
        "id": "c1",
        "text": "",
        "tokens": 2,
        "reasoning": "They greet me.",
    }
    assert "reasoning" not in delta_message("c1", Delta(text="Hi", tokens=1))


def test_the_finished_frames_usage_counts_the_thinking_where_a_model_thinks():
    thinking = Finished(
        finish_reason="stop", prompt_tokens=4, completion_tokens=9, reasoning_tokens=6
    )
    assert finished_usage(thinking)["completion_tokens_details"] == {"reasoning_tokens": 6}
    plain = Finished(finish_reason="stop", prompt_tokens=4, completion_tokens=9)
    assert "completion_tokens_details" not in finished_usage(plain)


class _Server:
    """What a server hands a consumer: the messages given, then nothing until the test ends."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.done = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if not self.messages:
            self.done.set()
            await asyncio.Event().wait()
        return self.messages.pop(0)


def _text(text: str) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": text}


async def _inbox_after(*messages: dict[str, Any]) -> tuple[bool, list[dict[str, Any]]]:
    """Let an inbox take every message; return whether it is closing, and what the consumer
    would read."""
    server = _Server(*messages)
    inbox = _Inbox(server.receive)
    pump = asyncio.create_task(inbox.pump())
    taken = asyncio.create_task(server.done.wait())
    await asyncio.wait([taken, pump], timeout=5, return_when=asyncio.FIRST_COMPLETED)
    taken.cancel()
    read: list[dict[str, Any]] = []
    while inbox._waiting:
        read.append(await inbox.get())
    closing = inbox.closing.is_set()
    pump.cancel()
    await asyncio.gather(pump, return_exceptions=True)
    return closing, read


async def test_frames_wait_in_order_with_their_size(settings):
    settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES = 100
    closing, read = await _inbox_after({"type": "websocket.connect"}, _text("ab"), _text("é"))
    assert [m["type"] for m in read] == [
        "websocket.connect",
        "websocket.receive",
        "websocket.receive",
    ]
    assert [m.get(FRAME_BYTES) for m in read] == [None, 2, 2]  # UTF-8 bytes, as sent
    assert not closing


async def test_a_frame_over_the_limit_closes_the_socket_with_1009_dropping_what_waits(settings):
    settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES = 100
    _, read = await _inbox_after(
        _text("a" * 10),
        _text("é" * 51),
        _text("a" * 10),  # 102 bytes in 51 characters
    )
    [overflow] = read  # the frame before it dropped unread, the one after never taken
    assert overflow["type"] == "websocket.overflow" and overflow["code"] == 1009
    assert overflow["error"].code == "frame_too_large"
    _, read = await _inbox_after({"type": "websocket.receive", "bytes": b"x" * 101})
    assert read[0]["code"] == 1009


async def test_frames_past_the_backlog_close_the_socket_with_1008(settings):
    settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES = 100
    settings.ROUNDHOUSE_WS_MAX_WAITING_FRAMES = 3
    _, read = await _inbox_after(*[_text("{}")] * 3)
    assert len(read) == 3  # up to the bound, every frame waits its turn
    closing, read = await _inbox_after(*[_text("{}")] * 4)
    [overflow] = read
    assert overflow["code"] == 1008 and overflow["error"].code == "too_many_frames"
    assert closing
    # Bytes count too: three frames of 80 bytes are more than twice the frame limit.
    _, read = await _inbox_after(*[_text("a" * 80)] * 3)
    assert [m["code"] for m in read] == [1008]


async def test_a_hang_up_goes_before_the_frames_waiting(settings):
    settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES = 100
    closing, read = await _inbox_after(
        _text("{}"), _text("{}"), {"type": "websocket.disconnect", "code": 1000}
    )
    assert read == [{"type": "websocket.disconnect", "code": 1000}]
    assert closing  # a refused frame's hold ends at once
