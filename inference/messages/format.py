"""Anthropic's Messages API's answer: the message and its stream of events, built from a
request's engine events (inference.messages.protocol turns the request into chat)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dataplane.types import Delta, Failed, Finished, ToolCallDelta
from inference.base.errors import ApiError

_json = msgspec.json.Encoder()
# What a Messages stream sends when it has had nothing to send for a while, as Anthropic's does.
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def usage_of(finished: Finished | Failed) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` are the prompt's tokens neither read from the prefix
    cache nor written to it, as vLLM's Messages server counts them."""
    cached = finished.cached_tokens if isinstance(finished, Finished) else 0
    created = finished.cache_created_tokens if isinstance(finished, Finished) else 0
    return {
        "input_tokens": max(0, finished.prompt_tokens - cached - created),
        "output_tokens": finished.completion_tokens,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
    }


def stop_reason_of(
    finish_reason: str, stop_sequence: str | None, *, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """Anthropic's stop_reason and stop_sequence of chat's finish reason: a cut-off is
    `max_tokens`; complete tool calls `tool_use`; a stop string `stop_sequence`, naming it."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None  # a content filter, say: Anthropic's API has no reason for it
    if tool_complete:
        return "tool_use", None
    if stop_sequence is not None:
        return "stop_sequence", stop_sequence
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""


@dataclass
class MessageBuilder:
    """A message and its stream of events, built from the request's events (choice 0's).

    A reasoning model's thinking is a `thinking` block (with a signature, which nothing
    checks here), the answer's text a `text` block and each tool call a `tool_use` block, in
    the order the model wrote them; text that comes while a tool call is open waits and
    follows it as a block of its own. With `thinking_shown` off (`thinking.display:
    "omitted"`) a thinking block comes with its signature and no text, as Anthropic's API
    answers it; the thinking's tokens still count as output.
    """

    message_id: str
    model: str
    prompt_tokens: int
    thinking_shown: bool = True
    # The whole message's parts, in order.
    thinking: str = ""
    text: str = ""
    calls: dict[int, _Call] = field(default_factory=dict)
    # The stream's state: the open block, its index, what waits for it to close.
    _index: int = 0
    _open: str | None = None
    _open_call: str | None = None  # the open tool_use block's id
    _signature: str | None = None
    _pending: list[str] = field(default_factory=list)
    _ids: dict[int, str] = field(default_factory=dict)  # a tool call's index → its id
    _tool_used: bool = False
    _last_arguments: list[str] = field(default_factory=list)

    def start(self) -> list[dict[str, Any]]:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def _block_start(self, block: dict[str, Any]) -> dict[str, Any]:
        self._open = block["type"]
        self._signature = uuid.uuid4().hex if block["type"] == "thinking" else None
        self._open_call = block.get("id") if block["type"] == "tool_use" else None
        return {"type": "content_block_start", "index": self._index, "content_block": block}

    def _block_stop(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        events: list[dict[str, Any]] = []
        if self._signature is not None:
            signature = {"type": "signature_delta", "signature": self._signature}
            events.append(self._delta_event(signature))
        events.append({"type": "content_block_stop", "index": self._index})
        self._open, self._open_call, self._signature = None, None, None
        self._index += 1
        return events

    def _delta_event(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _stop_and_flush(self) -> list[dict[str, Any]]:
        """Close the open block; text that waited for it follows as a block of its own."""
        waiting = "".join(self._pending)
        self._pending.clear()
        events = self._block_stop()
        if waiting:
            events.append(self._block_start({"type": "text", "text": ""}))
            events.append(self._delta_event({"type": "text_delta", "text": waiting}))
            events += self._block_stop()
        return events

    def _call_piece(self, piece: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        call = self.calls.get(piece.index)
        if call is None:
            call = self.calls[piece.index] = _Call(id=piece.id or "", name=piece.name or "")
        elif piece.name:
            call.name += piece.name
        call.arguments += piece.arguments
        if piece.id is not None:
            self._ids[piece.index] = piece.id
            if self._open_call != piece.id and piece.name is not None:
                events += self._stop_and_flush()
                self._tool_used, self._last_arguments = True, []
                block = {"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}}
                events.append(self._block_start(block))
            call_id: str | None = piece.id
        else:
            call_id = self._ids.get(piece.index)
        if piece.arguments and call_id is not None and self._open_call == call_id:
            self._last_arguments.append(piece.arguments)
            events.append(
                self._delta_event({"type": "input_json_delta", "partial_json": piece.arguments})
            )
        return events

    def delta(self, delta: Delta) -> list[dict[str, Any]]:
        """The events of new output (choice 0's: a message has one)."""
        if delta.index != 0:
            return []
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            self.thinking += delta.reasoning
            if self._open != "thinking":
                events += self._stop_and_flush()
                events.append(self._block_start({"type": "thinking", "thinking": ""}))
            if self.thinking_shown:
                events.append(
                    self._delta_event({"type": "thinking_delta", "thinking": delta.reasoning})
                )
        if delta.text:
            self.text += delta.text
            if self._open == "tool_use":
                self._pending.append(delta.text)
            else:
                if self._open != "text":
                    events += self._stop_and_flush()
                    events.append(self._block_start({"type": "text", "text": ""}))
                events.append(self._delta_event({"type": "text_delta", "text": delta.text}))
        for piece in delta.tool_calls or []:
            events += self._call_piece(piece)
        return events

    def broken(self, error: ApiError) -> dict[str, Any]:
        """The one `error` event of a stream that broke or a request that failed."""
        return error.anthropic_body()

    def add(self, delta: Delta) -> None:
        """Take new output into the whole message."""
        self.delta(delta)

    def complete(self, finished: Finished) -> bytes:
        """The whole message's body."""
        return _json.encode(self.body(finished))

    def end(
        self, event: Finished | Failed, *, error: ApiError | None = None
    ) -> list[dict[str, Any]]:
        """The events that close the open block and end the message; a failed request's
        stream ends with its error (`error`) instead."""
        if isinstance(event, Failed):
            return [self.broken(error or ApiError(503, event.code, event.message))]
        finished = event
        events = self._stop_and_flush()
        complete = self._tool_used and _is_json("".join(self._last_arguments))
        reason, sequence = stop_reason_of(
            finished.finish_reason or "stop",
            finished.stop_sequence,
            tool_used=self._tool_used,
            tool_complete=complete,
        )
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage_of(finished),
            }
        )
        events.append({"type": "message_stop"})
        return events

    def body(self, finished: Finished) -> dict[str, Any]:
        """The whole message."""
        content: list[dict[str, Any]] = []
        if self.thinking:
            shown = self.thinking if self.thinking_shown else ""
            content.append({"type": "thinking", "thinking": shown, "signature": uuid.uuid4().hex})
        if self.text:
            content.append({"type": "text", "text": self.text})
        for _, call in sorted(self.calls.items()):
            try:
                arguments = json.loads(call.arguments) if call.arguments else {}
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                # Cut off mid-way (max_tokens): what the model wrote, under a key of its own.
                arguments = {"_partial_arguments": call.arguments}
            content.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}
            )
        if not content:
            content.append({"type": "text", "text": ""})  # Anthropic's shape of nothing said
        reason, sequence = stop_reason_of(
            finished.finish_reason,
            finished.stop_sequence,
            tool_used=bool(self.calls),
            tool_complete=bool(self.calls),
        )
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.model,
            "stop_reason": reason,
        }
        if sequence is not None:
            message["stop_sequence"] = sequence
        message["usage"] = usage_of(finished)
        return message
