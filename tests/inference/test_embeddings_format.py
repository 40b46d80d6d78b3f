"""Embedding vectors as the API returns them: shortened Matryoshka vectors and base64."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from inference.openai_format import embeddings_body
from models_registry.selectors import encoder_dimensions


def _vectors(rows: np.ndarray) -> bytes:
    return rows.astype("<f4").tobytes()


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
