"""What `/v1/ws` sends back: each delta as a JSON frame, and the close code of a refused key."""

from __future__ import annotations

from typing import Any

from dataplane.types import Delta
from inference.base.errors import ApiError


def close_code(exc: ApiError) -> int:
    """The close code of a key that does not let a socket in: 4401 or 4403, as HTTP's status."""
    return 4401 if exc.status == 401 else 4403


def delta_message(client_id: str, delta: Delta) -> dict[str, Any]:
    """A delta as the socket sends it: text and tokens, and what else the request asked for."""
    message: dict[str, Any] = {
        "type": "delta",
        "id": client_id,
        "text": delta.text,
        "tokens": delta.tokens,
    }
    if delta.index:
        message["index"] = delta.index
    if delta.reasoning:
        message["reasoning"] = delta.reasoning
    if delta.token_ids is not None:
        message["token_ids"] = delta.token_ids
    if delta.tool_calls:
        message["tool_calls"] = [
            {"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}
            for c in delta.tool_calls
        ]
    entries = [*(delta.prompt_logprobs or []), *(delta.logprobs or [])]
    if entries:
        message["logprobs"] = [
            {
                "token": e.token,
                "logprob": e.logprob,
                "top_logprobs": [{"token": t.token, "logprob": t.logprob} for t in e.top],
            }
            for e in entries
        ]
    return message
