"""Collect a request's reply events into its whole OpenAI response body (no streaming)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from dataplane.types import Delta, Embeddings, Event, Failed, Finished
from inference.admission import request_failure
from inference.errors import ApiError
from inference.openai_format import BYTES_FORMATS, embeddings_binary, embeddings_json
from inference.params import EmbeddingRequest

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


@dataclass(frozen=True)
class EmbeddingsAnswer:
    """An embeddings answer: a JSON body, or vLLM's binary one with its metadata header.

    Its body is encoded a piece at a time as `pieces` is read (about ANSWER_PIECE_BYTES
    each), from the vectors it holds; either it or `body` is read, once.
    """

    pieces: Iterator[bytes]
    content_type: str = "application/json"
    metadata: str | None = None  # the `metadata` header of a `bytes` answer

    @property
    def body(self) -> bytes:
        """The whole body at once."""
        return b"".join(self.pieces)


async def embeddings_collect(
    events: AsyncIterator[Event],
    request: EmbeddingRequest,
    *,
    model: str,
    on_end: OnEnd,
    request_id: str,
) -> EmbeddingsAnswer:
    """Return an embeddings answer, or raise the ApiError the request ended with; its id is
    `embd-<request_id>`, as vLLM's server names one."""
    try:
        return await _embeddings_body(
            events, request, model=model, on_end=on_end, request_id=request_id
        )
    finally:
        await events_close(events)


async def _embeddings_body(
    events: AsyncIterator[Event],
    request: EmbeddingRequest,
    *,
    model: str,
    on_end: OnEnd,
    request_id: str,
) -> EmbeddingsAnswer:
    vectors: Embeddings | None = None
    async for event in events:
        if isinstance(event, Embeddings):
            vectors = event
        elif isinstance(event, Finished | Failed):
            if on_end is not None:
                on_end(event)
            if isinstance(event, Failed):
                raise request_failure(event)
            if vectors is None:
                raise ApiError(503, "engine_error", "The worker sent no vectors.", retry_after=1)
            shape: dict[str, Any] = {
                "vectors": vectors.data,
                "native": vectors.dimensions,
                "dimensions": request.dimensions or vectors.dimensions,
                "model": model,
                "tokens": event.prompt_tokens,
                "embed_dtype": request.embed_dtype,
                "endianness": request.endianness,
                "normalize": request.use_activation,
            }
            named: dict[str, Any] = {
                "response_id": f"embd-{request_id}",
                "created": int(time.time()),
            }
            if request.encoding_format not in BYTES_FORMATS:
                pieces = embeddings_json(encoding_format=request.encoding_format, **named, **shape)
                return EmbeddingsAnswer(pieces)
            pieces, metadata = embeddings_binary(**named, **shape)
            shown = None if request.encoding_format == "bytes_only" else _json.encode(metadata)
            return EmbeddingsAnswer(
                pieces,
                content_type="application/octet-stream",
                metadata=shown.decode() if shown is not None else None,
            )
    raise stream_ended()
