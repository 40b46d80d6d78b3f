"""The JSON parse every body goes through: its fast parser never changes what a body means.

json_load parses with msgspec first and hands anything msgspec refuses to the json module, so
each document must come out exactly as the json module reads it (values and types), and each
refusal must be the json module's own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.json_body import BodyProblem, json_load

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _stdlib(raw: bytes | str) -> Any:
    return json.loads(raw)


# How fast documents are drawn is no part of what this checks: on a machine busy with other
# work the health check failed a clean run.
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(document=_documents, ascii_only=st.booleans(), as_bytes=st.booleans())
def test_every_valid_document_parses_to_what_the_json_module_reads(
    document: Any, ascii_only: bool, as_bytes: bool
) -> None:
    text = json.dumps(document, ensure_ascii=ascii_only)
    raw: bytes | str = text.encode("utf-8", "surrogatepass") if as_bytes else text
    parsed = json_load(raw)
    assert repr(parsed) == repr(_stdlib(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\\ud800"}',  # a lone surrogate, escaped: read, then refused by json_check
        b'{"a": "\xed\xa0\x80"}',  # the same, encoded
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b"\xef\xbb\xbf{}",
        b'{"a": 01}',
        b'{"a": "x\ny"}',
        b'{"a": 1}\x00',
        b'{"a": ' + b"9" * 5000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff",
        b"",
        '{"a": "\ud800"}',  # a str holding a lone surrogate (a WebSocket text frame)
    ],
)
def test_what_the_fast_parser_refuses_is_read_or_refused_as_the_json_module_does(
    raw: bytes | str,
) -> None:
    try:
        expected: Any = repr(_stdlib(raw))
    except (ValueError, RecursionError) as exc:
        expected = type(exc)
    try:
        got: Any = repr(json_load(raw))
    except BodyProblem as problem:
        assert not isinstance(expected, str), f"{raw[:20]!r}: read as {expected}, got {problem}"
        return
    assert got == expected
