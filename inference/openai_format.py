"""Response bodies and stream chunks exactly as OpenAI's API shapes them."""

from __future__ import annotations

from typing import Any

import msgspec

from inference.params import CHAT

_json = msgspec.json.Encoder()


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Formatter:
    """Build the bodies of one response: ids, model and timestamps fixed at creation."""

    def __init__(
        self, *, endpoint: str, request_id: str, model: str, created: int, fingerprint: str
    ) -> None:
        self.chat = endpoint == CHAT
        self.id = f"chatcmpl-{request_id}" if self.chat else f"cmpl-{request_id}"
        self.model = model
        self.created = created
        self.fingerprint = fingerprint

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def complete(
        self, *, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> bytes:
        """Return the body of a non-streaming response."""
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion")
        body["choices"] = [choice]
        body["usage"] = usage_body(prompt_tokens, completion_tokens)
        return _json.encode(body)

    def chunk(
        self, *, text: str, finish_reason: str | None, first: bool, include_usage: bool
    ) -> bytes:
        """Return one SSE event carrying a piece of the output."""
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text or first:
                delta["content"] = text
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion")
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None
        return b"data: " + _json.encode(body) + b"\n\n"

    def usage_chunk(self, *, prompt_tokens: int, completion_tokens: int) -> bytes:
        """Return the final chunk that carries usage (`stream_options.include_usage`)."""
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage_body(prompt_tokens, completion_tokens)
        return b"data: " + _json.encode(body) + b"\n\n"


def error_chunk(body: dict[str, Any]) -> bytes:
    """Return an SSE event carrying an error, which OpenAI's SDKs raise as an APIError."""
    return b"data: " + _json.encode(body) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def embeddings_body(
    *, vectors: bytes, native: int, dimensions: int, encoding_format: str, model: str, tokens: int
) -> dict[str, Any]:
    """The body of an embeddings response, vectors as floats or base64 float32 (little-endian).

    A vector cut to fewer `dimensions` (a Matryoshka model) is normalised again to unit length.
    """
    import base64

    import numpy as np

    rows = np.frombuffer(vectors, dtype="<f4").reshape(-1, native)
    if dimensions < native:
        rows = rows[:, :dimensions]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        rows = (rows / np.maximum(norms, 1e-12)).astype("<f4")
    if encoding_format == "base64":
        items: list[Any] = [base64.b64encode(row.tobytes()).decode() for row in rows]
    else:
        items = rows.tolist()
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": item} for i, item in enumerate(items)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
