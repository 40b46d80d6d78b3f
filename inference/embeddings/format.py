"""An embeddings answer as its client reads it: OpenAI's JSON (floats or base64) or vLLM's
binary body, encoded a piece at a time as the client takes it.

vLLM's embeddings server takes `embed_dtype` (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2)
and `endianness` (native, big, little) for base64 output: the vector is converted as torch
converts a float32 tensor, and bfloat16 and fp8 values are sent as their raw bits. The same
conversions are written here in numpy, so that a frontend never loads torch (three seconds and
200 MB) for a formatting option; `tests/inference/embeddings/test_vector_bytes.py` checks them
against vLLM's own encoder bit for bit, over every float16 value, edge cases and random vectors.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from dataplane.types import (
    Embeddings,
    Event,
    Failed,
    Finished,
)
from inference.base.errors import ApiError
from inference.body.parser import EmbeddingRequest
from inference.pipeline.admission import request_failure
from inference.pipeline.collect import OnEnd, events_close, stream_ended

_json = msgspec.json.Encoder()

# The bytes one value takes in each number type.
EMBED_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}

_U32 = npt.NDArray[np.uint32]


def rows_encoded(rows: npt.NDArray[np.float32], embed_dtype: str, endianness: str) -> list[bytes]:
    """Each row (float32 vectors) as the bytes of `embed_dtype`, in `endianness` byte order."""
    values = np.ascontiguousarray(rows, dtype=np.float32)
    converted: npt.NDArray[np.generic]
    # Past a type's range a value becomes what torch makes of it, not a warning.
    with np.errstate(all="ignore"):
        if embed_dtype == "float32":
            converted = values
        elif embed_dtype == "float16":
            converted = _float16(values)
        elif embed_dtype == "bfloat16":
            converted = _bfloat16_bits(values)
        elif embed_dtype == "fp8_e4m3":
            converted = _fp8_bits(values, e4m3=True)
        elif embed_dtype == "fp8_e5m2":
            converted = _fp8_bits(values, e4m3=False)
        else:
            raise ValueError(f"no embed_dtype {embed_dtype!r}")
    if endianness not in ("native", sys.byteorder) and converted.itemsize > 1:
        converted = converted.byteswap()
    return [row.tobytes() for row in converted]


def _float16(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float16]:
    """IEEE half precision, rounded to nearest even; a NaN keeps its sign and the top bits of
    its payload, made quiet, as torch's conversion does (numpy's may leave it signalling)."""
    halves = values.astype(np.float16)
    nan = np.isnan(values)
    if nan.any():
        bits: _U32 = values.view(np.uint32)
        quiet = ((bits >> 16) & 0x8000) | 0x7E00 | ((bits & 0x7FFFFF) >> 13)
        halves = np.where(nan, quiet.astype(np.uint16).view(np.float16), halves)
    return halves


def _bfloat16_bits(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """Round to nearest even on the top 16 bits; any NaN becomes 0xFFFF, as torch's
    vectorised conversion writes it."""
    bits: _U32 = values.view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))) >> 16
    return np.where(np.isnan(values), np.uint32(0xFFFF), rounded).astype(np.uint16)


def _fp8_bits(values: npt.NDArray[np.float32], *, e4m3: bool) -> npt.NDArray[np.uint8]:
    """Round to nearest even into fp8 E4M3FN (no infinity: past its range, the largest
    finite value; NaN 0x7F) or E5M2 (past its range, infinity 0x7C; NaN 0x7F).

    A normal result adds a rounding bias to the float32 bits and keeps the top ones; a
    subnormal one comes from a float32 addition that puts its bits at the bottom of the word.
    """
    bias, mantissa = (7, 3) if e4m3 else (15, 2)
    shift = 23 - mantissa
    # The first magnitude past the range (480 for E4M3FN, 65536 for E5M2), the smallest
    # normal one, and the addend that aligns a subnormal's bits.
    past = np.uint32(1087 << 20) if e4m3 else np.uint32(143 << 23)
    normal = np.uint32((127 - bias + 1) << 23)
    aligner = np.uint32((127 - bias + shift + 1) << 23)

    bits: _U32 = values.view(np.uint32)
    sign = bits & np.uint32(0x80000000)
    magnitude = bits ^ sign
    small = (magnitude.view(np.float32) + aligner.view(np.float32)).view(np.uint32) - aligner
    odd = (magnitude >> shift) & 1
    rebias = np.uint32(((bias - 127) << 23) & 0xFFFFFFFF)
    large = (magnitude + rebias + np.uint32((1 << (shift - 1)) - 1) + odd) >> shift
    result = np.where(magnitude < normal, small, large & 0xFF)
    if e4m3:
        result = np.where(result == 0x7F, np.uint32(0x7E), result)  # a carry into NaN saturates
        beyond = np.where(magnitude > np.uint32(0x7F800000), np.uint32(0x7F), np.uint32(0x7E))
    else:
        beyond = np.where(magnitude > np.uint32(0x7F800000), np.uint32(0x7F), np.uint32(0x7C))
    result = np.where(magnitude >= past, beyond, result)
    return (result | (sign >> 24)).astype(np.uint8)


# vLLM's binary answers: the vectors' bytes as the body, and (but for bytes_only) where each
# starts and ends in a `metadata` header.
BYTES_FORMATS = ("bytes", "bytes_only")
# An embeddings answer is encoded this many bytes at a time (about; at least one vector), each
# piece as the client has taken the one before: a connection holds the vectors and a piece,
# never the whole answer (its JSON floats take about five times the vectors' bytes).
ANSWER_PIECE_BYTES = 64 * 1024
# The most bytes one float32 value takes as a JSON number and its comma (-1.2345678901234567e-05,),
# and one vector's object around its values.
_FLOAT_JSON_BYTES = 24
_ITEM_JSON_BYTES = 64


def embeddings_json(
    *,
    vectors: bytes,
    native: int,
    dimensions: int,
    encoding_format: str,
    model: str,
    tokens: int,
    embed_dtype: str = "float32",
    endianness: str = "native",
    normalize: bool = True,
    response_id: str = "",
    created: int = 0,
) -> Iterator[bytes]:
    """The JSON body of an embeddings response, a slice of vectors at a time, vectors as
    floats or base64 (float32 in this machine's byte order, unless `embed_dtype` and
    `endianness` ask for others).

    Joined, the pieces are the body encoded whole, byte for byte. A vector cut to fewer
    `dimensions` (a Matryoshka model) is normalised again to unit length, unless the request
    asked for vectors as pooled (`normalize` false). With a `response_id` it opens with the
    `id` and `created` vLLM's server adds to OpenAI's shape.
    """
    import base64

    rows = _embedding_rows(vectors, native=native, dimensions=dimensions, normalize=normalize)
    named = {"id": response_id, "created": created} if response_id else {}
    # The body's members around `data`, each encoded as the whole body's encoder writes them.
    yield _json.encode({**named, "object": "list"})[:-1] + b',"data":['
    if encoding_format == "base64":
        row_bytes = -(-rows.shape[1] * EMBED_DTYPE_BYTES[embed_dtype] // 3) * 4 + _ITEM_JSON_BYTES
    else:
        row_bytes = rows.shape[1] * _FLOAT_JSON_BYTES + _ITEM_JSON_BYTES
    step = max(1, ANSWER_PIECE_BYTES // row_bytes)
    for first in range(0, len(rows), step):
        part = rows[first : first + step]
        items: list[Any]
        if encoding_format == "base64":
            encoded = rows_encoded(part, embed_dtype, endianness)
            items = [base64.b64encode(row).decode() for row in encoded]
        else:
            items = part.tolist()
        data = [
            {"object": "embedding", "index": first + i, "embedding": item}
            for i, item in enumerate(items)
        ]
        yield (b"," if first else b"") + _json.encode(data)[1:-1]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    yield b"]," + _json.encode({"model": model, "usage": usage})[1:]


def embeddings_binary(
    *,
    vectors: bytes,
    native: int,
    dimensions: int,
    model: str,
    tokens: int,
    response_id: str,
    created: int,
    embed_dtype: str = "float32",
    endianness: str = "native",
    normalize: bool = True,
) -> tuple[Iterator[bytes], dict[str, Any]]:
    """vLLM's `bytes` answer: the vectors end to end, a slice of them at a time, and the
    metadata that finds each one (its bytes' start and end, its shape, number type and byte
    order) with the usage."""

    rows = _embedding_rows(vectors, native=native, dimensions=dimensions, normalize=normalize)
    size = rows.shape[1] * EMBED_DTYPE_BYTES[embed_dtype]
    items = [
        {
            "index": index,
            "embed_dtype": embed_dtype,
            "endianness": endianness,
            "start": index * size,
            "end": (index + 1) * size,
            "shape": [rows.shape[1]],
        }
        for index in range(len(rows))
    ]
    metadata = {
        "id": response_id,
        "created": created,
        "model": model,
        "data": items,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    step = max(1, ANSWER_PIECE_BYTES // max(size, 1))

    def pieces() -> Iterator[bytes]:
        for first in range(0, len(rows), step):
            yield b"".join(rows_encoded(rows[first : first + step], embed_dtype, endianness))

    return pieces(), metadata


def _embedding_rows(vectors: bytes, *, native: int, dimensions: int, normalize: bool) -> Any:
    """The float32 vectors, cut to `dimensions` and then normalised again if asked."""
    import numpy as np

    rows = np.frombuffer(vectors, dtype="<f4").reshape(-1, native)
    if dimensions >= native:
        return rows
    rows = rows[:, :dimensions]
    if not normalize:
        return rows
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype("<f4")


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
