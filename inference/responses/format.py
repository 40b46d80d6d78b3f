"""The Responses API's answer: the Response object and its semantic stream events, built
from a request's engine events (inference.responses.protocol turns the request into chat)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dataplane.types import Delta, Failed, Finished, TokenLogprob, ToolCallDelta
from inference.base.errors import ApiError
from inference.chat.format import token_logprobs

_json = msgspec.json.Encoder()


def usage_of(finished: Finished | Failed) -> dict[str, Any]:
    cached = finished.cached_tokens if isinstance(finished, Finished) else 0
    thinking = finished.reasoning_tokens if isinstance(finished, Finished) else None
    # cache_write_tokens: the input tokens written to the prefix cache, as vLLM's Responses
    # server counts them beside OpenAI's cached_tokens.
    written = finished.cache_created_tokens if isinstance(finished, Finished) else 0
    return {
        "input_tokens": finished.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": finished.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": thinking or 0},
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
    }


def _without_bytes(shaped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shaped log probabilities as a stream's text events carry them: without bytes."""
    return [
        {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top_logprobs": [
                {"token": alt["token"], "logprob": alt["logprob"]} for alt in entry["top_logprobs"]
            ],
        }
        for entry in shaped
    ]


@dataclass
class _Call:
    item: dict[str, Any]
    position: int  # its output_index


@dataclass
class ResponseBuilder:
    """A response's object and its stream of events, built from the request's events.

    Items are written in the order the model produced them: a reasoning model's thinking (a
    reasoning item), a message with its text, then each function call. `events()` of each
    step returns what a stream sends for it.

    With log probabilities asked for (`echo["top_logprobs"]` not None), the message's text
    carries those of its tokens: each text event those of the tokens since the last one, and
    the text part all of them, a last token without text of its own (the end of sequence)
    included, as vLLM's server lists them. Tokens of a function call have no place for theirs.
    """

    response_id: str
    model: str
    echo: dict[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = field(default_factory=list)
    sequence: int = 0
    status: str = "in_progress"
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete: dict[str, Any] | None = None
    completed_at: int | None = None
    _message: dict[str, Any] | None = None
    _message_index: int = -1
    _thought: dict[str, Any] | None = None  # the open reasoning item
    _thought_index: int = -1
    _calls: dict[int, _Call] = field(default_factory=dict)
    _open_call: int | None = None
    _logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet on the message

    def fresh(self) -> ResponseBuilder:
        """A builder of the same response from its start (a second reader of its events)."""
        return ResponseBuilder(
            response_id=self.response_id,
            model=self.model,
            echo=self.echo,
            created_at=self.created_at,
            status=self.status,
        )

    def body(self) -> dict[str, Any]:
        """The Response object as it stands."""
        text = "".join(
            part.get("text", "")
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
        )
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "model": self.model,
            "output": self.output,
            "output_text": text,
            "usage": self.usage,
            **self.echo,
        }

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def broken(self, error: ApiError) -> dict[str, Any]:
        """The one error event of a stream that broke before the response ended."""
        return error_event(self.sequence, error)

    def start(self) -> list[dict[str, Any]]:
        """The events that open a stream: created, then in progress; a background response
        is queued until its request starts (`running`)."""
        created = self._event("response.created", response=self.body())
        if self.status == "queued":
            return [created, self._event("response.queued", response=self.body())]
        return [created, self._event("response.in_progress", response=self.body())]

    def running(self) -> list[dict[str, Any]]:
        """The event of a queued response whose request has started (none after that)."""
        if self.status != "queued":
            return []
        self.status = "in_progress"
        return [self._event("response.in_progress", response=self.body())]

    def _thought_open(self) -> list[dict[str, Any]]:
        self._thought = {
            "type": "reasoning",
            "id": self.response_id.replace("resp_", "rs_", 1),
            "summary": [],
            "content": [],
            "status": "in_progress",
        }
        self._thought_index = len(self.output)
        self.output.append(self._thought)
        added = self._event(
            "response.output_item.added",
            output_index=self._thought_index,
            item=json.loads(_json.encode(self._thought)),
        )
        self._thought["content"].append({"type": "reasoning_text", "text": ""})
        return [added]

    def _thought_close(self) -> list[dict[str, Any]]:
        thought = self._thought
        if thought is None:
            return []
        self._thought = None
        thought["status"] = "completed"
        return [
            self._event(
                "response.reasoning_text.done",
                item_id=thought["id"],
                output_index=self._thought_index,
                content_index=0,
                text=thought["content"][0]["text"],
            ),
            self._event(
                "response.output_item.done", output_index=self._thought_index, item=thought
            ),
        ]

    def _thought_piece(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._thought is None:
            events += self._message_close() + self._call_close() + self._thought_open()
        assert self._thought is not None
        self._thought["content"][0]["text"] += text
        events.append(
            self._event(
                "response.reasoning_text.delta",
                item_id=self._thought["id"],
                output_index=self._thought_index,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _message_open(self) -> list[dict[str, Any]]:
        self._message = {
            "type": "message",
            "id": self.response_id.replace("resp_", "msg_", 1),
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self._message_index = len(self.output)
        self.output.append(self._message)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        added = self._event(
            "response.output_item.added",
            output_index=self._message_index,
            item=json.loads(_json.encode(self._message)),
        )
        self._message["content"].append(part)
        return [
            added,
            self._event(
                "response.content_part.added",
                item_id=self._message["id"],
                output_index=self._message_index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            ),
        ]

    @property
    def _top(self) -> int | None:
        top = self.echo.get("top_logprobs")
        return top if isinstance(top, int) else None

    def _logprobs_taken(self, part: dict[str, Any]) -> list[dict[str, Any]]:
        """The pending log probabilities, added to the text part; as a text event lists them."""
        top, taken = self._top, self._logprobs
        if top is None or not taken:
            return []
        self._logprobs = []
        shaped = token_logprobs(taken, top)
        part["logprobs"].extend(shaped)
        return _without_bytes(shaped)

    def _message_close(self) -> list[dict[str, Any]]:
        message = self._message
        if message is None:
            return []
        self._message = None
        part = message["content"][0]
        message["status"] = "completed"
        self._logprobs_taken(part)
        where = {"item_id": message["id"], "output_index": self._message_index, "content_index": 0}
        done = _without_bytes(part["logprobs"])
        return [
            self._event("response.output_text.done", **where, text=part["text"], logprobs=done),
            self._event("response.content_part.done", **where, part=part),
            self._event(
                "response.output_item.done", output_index=self._message_index, item=message
            ),
        ]

    def _call_close(self) -> list[dict[str, Any]]:
        if self._open_call is None:
            return []
        call = self._calls[self._open_call]
        self._open_call = None
        call.item["status"] = "completed"
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=call.item["id"],
                output_index=call.position,
                name=call.item["name"],
                arguments=call.item["arguments"],
            ),
            self._event("response.output_item.done", output_index=call.position, item=call.item),
        ]

    def _call_piece(self, piece: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        call = self._calls.get(piece.index)
        if call is None:
            events += self._thought_close() + self._message_close() + self._call_close()
            item = {
                "type": "function_call",
                "id": f"fc_{self.response_id.removeprefix('resp_')}_{piece.index}",
                "call_id": piece.id or f"call_{self.response_id.removeprefix('resp_')}",
                "name": piece.name or "",
                "arguments": "",
                "status": "in_progress",
            }
            call = self._calls[piece.index] = _Call(item=item, position=len(self.output))
            self.output.append(item)
            self._open_call = piece.index
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=call.position,
                    item=json.loads(_json.encode(item)),
                )
            )
        elif piece.name:
            call.item["name"] += piece.name
        if piece.arguments:
            call.item["arguments"] += piece.arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item["id"],
                    output_index=call.position,
                    delta=piece.arguments,
                )
            )
        return events

    def delta(self, delta: Delta) -> list[dict[str, Any]]:
        """The events of new output (only the first choice: a response has one)."""
        if delta.index != 0:
            return []
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += self._thought_piece(delta.reasoning)
        if delta.tool_calls:
            self._logprobs = []  # a function call's tokens: no text carries them
        elif delta.logprobs and self._top is not None and (delta.text or not delta.reasoning):
            self._logprobs.extend(delta.logprobs)  # a thinking step's have no text to go with
        if delta.text:
            if self._message is None:
                events += self._thought_close() + self._call_close() + self._message_open()
            assert self._message is not None
            part = self._message["content"][0]
            part["text"] += delta.text
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self._message["id"],
                    output_index=self._message_index,
                    content_index=0,
                    delta=delta.text,
                    logprobs=self._logprobs_taken(part),
                )
            )
        for piece in delta.tool_calls or []:
            events += self._call_piece(piece)
        return events

    def end(
        self, event: Finished | Failed, *, error: ApiError | None = None
    ) -> list[dict[str, Any]]:
        """The events that close every open item and end the response."""
        events = self._thought_close() + self._message_close() + self._call_close()
        self.usage = usage_of(event)
        self.completed_at = int(time.time())
        if isinstance(event, Failed) and event.code == "cancelled":
            self.status = "cancelled"  # a background response cancelled: not an error
            kind = "response.cancelled"
        elif isinstance(event, Failed):
            self.status = "failed"
            self.error = {
                "code": error.code if error is not None else event.code,
                "message": error.message if error is not None else event.message,
            }
            kind = "response.failed"
        elif event.finish_reason == "length":
            self.status = "incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
            kind = "response.incomplete"
        elif event.finish_reason == "content_filter":
            self.status = "incomplete"
            self.incomplete = {"reason": "content_filter"}
            kind = "response.incomplete"
        else:
            self.status = "completed"
            kind = "response.completed"
        events.append(self._event(kind, response=self.body()))
        return events


def error_event(sequence: int, error: ApiError) -> dict[str, Any]:
    """The one `error` event of a stream that broke."""
    return {
        "type": "error",
        "sequence_number": sequence,
        "code": error.code,
        "message": error.message,
        "param": error.param,
    }
