"""Base64 vectors in another number type or byte order are the bytes vLLM's server sends.

The platform converts in numpy (a frontend never loads torch); vLLM converts with torch. Both
are run here on the same float32 values: every float16 value (which covers each type's
rounding boundaries, subnormals, infinities and NaNs), values across float32's whole range,
random bit patterns, and the edges of the fp8 ranges.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from vllm.entrypoints.pooling.utils import encode_pooling_bytes
from vllm.utils.serial_utils import tensor2binary

from inference.embeddings.format import embeddings_binary, embeddings_json, rows_encoded
from inference.embeddings.protocol import EMBED_DTYPES, ENDIANNESS


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    scaled = rng.standard_normal(50_000) * np.exp2(rng.integers(-40, 40, 50_000))
    bit_patterns = rng.integers(0, 1 << 32, 50_000, dtype=np.uint64).astype(np.uint32)
    # The fp8 ranges' ends and the points where rounding carries past them; subnormals.
    edges = [0.0, -0.0, 448, 464, 479.99, 480, 57344, 61439.9, 61440, 65536, 3.4e38, 1e-45]
    edges += [2.0**-k for k in (6, 9, 10, 14, 16, 17, 18)] + [np.inf, -np.inf, np.nan]
    return np.concatenate(
        [
            every_half.astype(np.float32),
            scaled.astype(np.float32),
            bit_patterns.view(np.float32),
            np.array(edges, dtype=np.float32),
        ]
    )


VALUES = _values()


@pytest.mark.parametrize("endianness", ENDIANNESS)
@pytest.mark.parametrize("embed_dtype", EMBED_DTYPES)
def test_each_number_type_and_byte_order_gives_vllms_bytes(embed_dtype, endianness):
    (ours,) = rows_encoded(VALUES.reshape(1, -1), embed_dtype, endianness)
    theirs = tensor2binary(torch.from_numpy(VALUES.copy()), embed_dtype, endianness)
    assert len(ours) == len(theirs)
    if ours != theirs:
        size = len(ours) // VALUES.size
        differ = np.frombuffer(ours, np.uint8) != np.frombuffer(theirs, np.uint8)
        wrong = VALUES[differ.reshape(-1, size).any(axis=1)]
        pytest.fail(f"{wrong.size} values differ from vLLM's, first {wrong[:5].tolist()}")


def _body(rows: np.ndarray, **options: Any) -> dict[str, Any]:
    pieces = embeddings_json(
        vectors=rows.astype("<f4").tobytes(),
        native=rows.shape[1],
        dimensions=rows.shape[1],
        model="m",
        tokens=len(rows),
        **options,
    )
    return msgspec.json.decode(b"".join(pieces))


def test_each_vector_of_a_response_is_encoded_alone():
    rows = np.array([[0.6, 0.8, 0.0], [0.0, -1.0, 0.0]])
    body = _body(rows, encoding_format="base64", embed_dtype="float16", endianness="big")
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), ">f2") for d in body["data"]]
    assert np.allclose(decoded, rows, atol=1e-3)


def test_floats_stay_json_numbers_whatever_the_number_type():
    """As on vLLM's server, `embed_dtype` and `endianness` shape base64 only."""
    body = _body(np.array([[0.6, 0.8]]), encoding_format="float", embed_dtype="fp8_e4m3")
    assert body["data"][0]["embedding"] == pytest.approx([0.6, 0.8], abs=1e-7)


@pytest.mark.parametrize(
    ("embed_dtype", "endianness"), [("float32", "native"), ("bfloat16", "big")]
)
def test_a_bytes_answer_is_laid_out_as_vllms(embed_dtype, endianness):
    """The body and the metadata's items are vLLM's, for the same vectors."""
    rows = np.random.default_rng(5).standard_normal((3, 8)).astype("<f4")
    body, metadata = embeddings_binary(
        vectors=rows.tobytes(),
        native=8,
        dimensions=8,
        model="m",
        tokens=7,
        response_id="embd-1",
        created=1,
        embed_dtype=embed_dtype,
        endianness=endianness,
        normalize=False,
    )
    outputs = [SimpleNamespace(outputs=SimpleNamespace(data=torch.from_numpy(r))) for r in rows]
    chunks, items = encode_pooling_bytes(outputs, embed_dtype, endianness)  # type: ignore[arg-type]
    assert b"".join(body) == b"".join(chunks)
    assert metadata["data"] == [{**item, "shape": list(item["shape"])} for item in items]
    assert metadata["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
