"""Embedding vectors as the API returns them: shortened Matryoshka vectors and base64, the
JSON encoded a slice of vectors at a time."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import numpy as np
import pytest

from inference.embeddings.format import (
    ANSWER_PIECE_BYTES,
    embeddings_binary,
    embeddings_json,
    rows_encoded,
)
from models_registry.selectors import encoder_dimensions


def _vectors(rows: np.ndarray) -> bytes:
    return rows.astype("<f4").tobytes()


def embeddings_body(**shape: Any) -> dict[str, Any]:
    return msgspec.json.decode(b"".join(embeddings_json(**shape)))


def test_a_shortened_vector_keeps_its_leading_dimensions_at_unit_length():
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(3, 8))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    body = embeddings_body(
        vectors=_vectors(rows), native=8, dimensions=4, encoding_format="float", model="m", tokens=5
    )
    got = np.array([item["embedding"] for item in body["data"]])
    assert got.shape == (3, 4)
    assert np.linalg.norm(got, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    # Same direction as the first four dimensions of the full vector.
    expected = rows[:, :4] / np.linalg.norm(rows[:, :4], axis=1, keepdims=True)
    assert got == pytest.approx(expected, abs=1e-6)
    assert [item["index"] for item in body["data"]] == [0, 1, 2]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


def test_native_vectors_are_returned_as_they_are():
    rows = np.array([[3.0, 4.0, 0.0]])
    body = embeddings_body(
        vectors=_vectors(rows), native=3, dimensions=3, encoding_format="float", model="m", tokens=1
    )
    assert body["data"][0]["embedding"] == [3.0, 4.0, 0.0]


def test_base64_vectors_are_little_endian_float32_of_the_same_values():
    rows = np.array([[0.6, 0.8, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    floats = embeddings_body(
        vectors=_vectors(rows), native=4, dimensions=2, encoding_format="float", model="m", tokens=2
    )
    packed = embeddings_body(
        vectors=_vectors(rows),
        native=4,
        dimensions=2,
        encoding_format="base64",
        model="m",
        tokens=2,
    )
    for f, b in zip(floats["data"], packed["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == pytest.approx(f["embedding"])


def test_a_model_offers_its_native_size_then_its_matryoshka_sizes_largest_first():
    assert encoder_dimensions({"dimensions": 384}) == (384,)
    head = {"dimensions": 768, "matryoshka_dimensions": [64, 256, 128, 768, 1024]}
    assert encoder_dimensions(head) == (768, 256, 128, 64)
    assert encoder_dimensions({}) == ()


def test_a_shortened_vector_asked_for_as_pooled_is_not_normalised_again():
    rows = np.array([[3.0, 4.0, 12.0]])
    body = embeddings_body(
        vectors=_vectors(rows),
        native=3,
        dimensions=2,
        encoding_format="float",
        model="m",
        tokens=1,
        normalize=False,
    )
    assert body["data"][0]["embedding"] == [3.0, 4.0]


def _whole(rows: np.ndarray, *, encoding_format: str, embed_dtype: str, endianness: str) -> bytes:
    """The body as one object encoded at once, as the answer was written before its pieces."""
    if encoding_format == "base64":
        encoded = rows_encoded(rows, embed_dtype, endianness)
        items: list[Any] = [base64.b64encode(row).decode() for row in encoded]
    else:
        items = rows.tolist()
    return msgspec.json.encode(
        {
            "id": "embd-7",
            "created": 1700000000,
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": item}
                for i, item in enumerate(items)
            ],
            "model": 'all-minilm-l6-v2@1 "quoted" é',
            "usage": {"prompt_tokens": 9, "total_tokens": 9},
        }
    )


@pytest.mark.parametrize(
    ("encoding_format", "embed_dtype", "endianness"),
    [
        ("float", "float32", "native"),
        ("base64", "float32", "native"),
        ("base64", "float16", "big"),
        ("base64", "fp8_e5m2", "little"),
    ],
)
@pytest.mark.parametrize("count", [1, 3, 700])
def test_an_answer_sent_in_pieces_is_the_whole_body_byte_for_byte(
    encoding_format, embed_dtype, endianness, count
):
    rows = np.random.default_rng(count).standard_normal((count, 384)).astype("<f4")
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    pieces = list(
        embeddings_json(
            vectors=rows.tobytes(),
            native=384,
            dimensions=384,
            encoding_format=encoding_format,
            model='all-minilm-l6-v2@1 "quoted" é',
            tokens=9,
            embed_dtype=embed_dtype,
            endianness=endianness,
            response_id="embd-7",
            created=1700000000,
        )
    )
    whole = _whole(rows, encoding_format=encoding_format, embed_dtype=embed_dtype,
                   endianness=endianness)  # fmt: skip
    assert b"".join(pieces) == whole
    # A connection holds a piece of a large answer at a time, never the answer.
    assert max(len(piece) for piece in pieces) <= ANSWER_PIECE_BYTES
    if len(whole) > 4 * ANSWER_PIECE_BYTES:
        assert len(pieces) > len(whole) // ANSWER_PIECE_BYTES


def test_a_shortened_answer_in_pieces_is_normalised_as_a_whole_one():
    rows = np.random.default_rng(3).standard_normal((500, 64)).astype("<f4")
    pieces = list(
        embeddings_json(
            vectors=rows.tobytes(), native=64, dimensions=16, encoding_format="float",
            model="m", tokens=1,
        )
    )  # fmt: skip
    cut = rows[:, :16] / np.maximum(np.linalg.norm(rows[:, :16], axis=1, keepdims=True), 1e-12)
    got = msgspec.json.decode(b"".join(pieces))["data"]
    assert len(pieces) > 3
    assert [item["embedding"] for item in got] == cut.astype("<f4").tolist()


def test_a_bytes_answer_comes_in_pieces_of_whole_vectors():
    rows = np.random.default_rng(4).standard_normal((2048, 384)).astype("<f4")
    made, metadata = embeddings_binary(
        vectors=rows.tobytes(), native=384, dimensions=384, model="m", tokens=1,
        response_id="embd-1", created=1, embed_dtype="float16",
    )  # fmt: skip
    pieces = list(made)
    assert b"".join(pieces) == rows.astype(np.float16).tobytes()
    assert max(len(piece) for piece in pieces) <= ANSWER_PIECE_BYTES
    assert all(len(piece) % (384 * 2) == 0 for piece in pieces)
    assert metadata["data"][-1]["end"] == 2048 * 384 * 2
