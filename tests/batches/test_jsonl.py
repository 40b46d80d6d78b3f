"""A file's lines read a piece at a time are the lines of the whole file."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batches import jsonl

# Text that is mostly line ends of every kind splitlines knows, and characters of 1 to 4 bytes.
_TEXT = st.lists(
    st.sampled_from(
        ["a", " ", "é", "日", "\U0001f600", "\n", "\r", "\r\n", "\x0b", "\x1c", "\x85", "\u2028"]
    ),
    max_size=60,
).map("".join)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True)]


@given(text=_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=240), max_size=8))
def test_pieces_cut_anywhere_read_as_the_whole_text_splits(text, cuts):
    data = text.encode()
    expected = [line for line in text.splitlines() if line.strip()]
    assert list(jsonl.lines(_split(data, cuts))) == expected


def test_a_cr_lf_cut_between_two_pieces_ends_one_line():
    assert list(jsonl.lines([b"{}\r", b"\n[]\r", b"\n"])) == ["{}", "[]"]


@pytest.mark.parametrize(
    ("pieces", "at"),
    [([b"ok\n", b"\xff"], 3), ([b"ok\n\xc3", b"(\n"], 3), ([b"ab", b"\xe6\x97"], 2)],
    ids=["a-bad-byte", "a-bad-continuation-across-pieces", "cut-off-at-the-end"],
)
def test_bytes_that_are_not_utf8_name_the_first_bad_byte(pieces, at):
    with pytest.raises(jsonl.NotText) as refused:
        list(jsonl.lines(pieces))
    assert refused.value.at == at
    joined = b"".join(pieces)
    with pytest.raises(UnicodeDecodeError) as whole:
        joined.decode()
    assert whole.value.start == at
