"""Read a JSONL file's lines from its bytes a piece at a time, split as `str.splitlines` splits."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

# Every boundary str.splitlines() splits at, so a file reads the same in pieces as whole.
_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


class NotText(ValueError):
    """The bytes are not UTF-8 text; `at` is the offset of the first byte that is not."""

    def __init__(self, at: int) -> None:
        super().__init__(f"not UTF-8 at byte {at}")
        self.at = at


def lines(pieces: Iterable[bytes]) -> Iterator[str]:
    """Yield the non-blank lines of UTF-8 bytes given in pieces, without their line ends.

    A line is held only until it ends; a piece may end anywhere (in a character's bytes, or
    between the CR and LF of one line end, read as two ends around a blank line, which is
    dropped). Raises NotText at the first byte that is not UTF-8.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    held: list[str] = []  # the start of a line that has not ended yet
    read = 0
    for piece in pieces:
        try:
            text = decoder.decode(piece)
        except UnicodeDecodeError as exc:
            pending = len(decoder.getstate()[0])
            raise NotText(read - pending + exc.start) from exc
        read += len(piece)
        for part in text.splitlines(keepends=True):
            if held and held[-1][-1] in _BREAKS:
                yield from _ended(held)
                held = []
            held.append(part)
    try:
        decoder.decode(b"", final=True)  # only a character cut off at the end is left
    except UnicodeDecodeError as exc:
        raise NotText(read - len(decoder.getstate()[0]) + exc.start) from exc
    if held:
        yield from _ended(held)


def _ended(held: list[str]) -> Iterator[str]:
    line = "".join(held)
    # The same lines as text.splitlines() gives, less those with nothing but white space.
    for one in line.splitlines():
        if one.strip():
            yield one
