"""Where sentences end: the unit the toxicity classifier judges, in a whole text or a stream."""

from __future__ import annotations

import re

# A sentence ends at terminal punctuation (and any closing quotes) followed by space, or at a
# line break; "3.5" and "e.g.x" do not end one.
_BOUNDARY = re.compile(r"[.!?…]+[\"'”’)\]]*\s+|\n\s*")
# A run-on "sentence" (code, a list without full stops) is cut here so a stream never holds
# back more than this while it waits for the sentence to end.
LONGEST_SENTENCE = 400
# How far before the last look a boundary may begin (a full stop and closing quotes).
_BACKTRACK = 4


def sentence_end(text: str, start: int, *, scan_from: int | None = None) -> int | None:
    """Return where the sentence that begins at `start` ends, or None while it may go on.

    The end includes the space after the sentence. A stream passes `scan_from`, where its last
    look ended, so a sentence is read once however many pieces it arrives in.
    """
    end = len(text)
    scan_from = start if scan_from is None else max(start, scan_from - _BACKTRACK)
    boundary = _BOUNDARY.search(text, scan_from, min(end, start + LONGEST_SENTENCE))
    if boundary is not None:
        return boundary.end()
    if end - start <= LONGEST_SENTENCE:
        return None
    space = text.rfind(" ", start + LONGEST_SENTENCE // 2, start + LONGEST_SENTENCE)
    return space + 1 if space != -1 else start + LONGEST_SENTENCE


def sentence_spans(text: str, start: int = 0) -> list[tuple[int, int]]:
    """Return the (start, end) of every sentence from `start` on, the last one even if unfinished.

    Spans leave out surrounding space; blank sentences are skipped.
    """
    spans = []
    while start < len(text):
        end = sentence_end(text, start)
        if end is None:
            end = len(text)
        stripped = _strip(text, start, end)
        if stripped is not None:
            spans.append(stripped)
        start = end
    return spans


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None
