"""An embedding's base64 bytes in the number type and byte order the client asks for.

vLLM's embeddings server takes `embed_dtype` (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2)
and `endianness` (native, big, little) for base64 output: the vector is converted as torch
converts a float32 tensor, and bfloat16 and fp8 values are sent as their raw bits. The same
conversions are written here in numpy, so that a frontend never loads torch (three seconds and
200 MB) for a formatting option; `tests/inference/test_vector_bytes.py` checks them against
vLLM's own encoder bit for bit, over every float16 value, edge cases and random vectors.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt

EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
# The bytes one value takes in each number type.
EMBED_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
ENDIANNESS = ("native", "big", "little")

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
