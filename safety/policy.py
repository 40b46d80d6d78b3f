"""A compiled policy pack: the input check before admission and the output filter of a stream."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from safety.detectors import DenyList, Detector, Finding, Pii, Toxicity
from safety.sentences import sentence_end

if TYPE_CHECKING:
    from safety.models import PolicyPack

# Kinds a stream cannot redact, so it stops on them whatever the pack's PII action: a private
# key block is longer than what a stream holds back.
UNREDACTABLE_IN_STREAM = frozenset({"private_key"})
# A span still growing at the end of the stream (a long key) is held back at most this long.
GROW_LIMIT = 256
# Characters before a scan's start that lookbehinds and word boundaries read.
LOOKBEHIND = 8
# Span detectors run once this much more text can be cleared, not on every token: a little
# more held back for far fewer scans.
SCAN_STEP = 16


def redaction(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def redact(text: str, findings: Iterable[Finding]) -> str:
    """Return the text with each finding's span replaced by `[REDACTED:<kind>]`."""
    out = []
    cursor = 0
    for f in sorted(findings, key=lambda f: (f.start, -f.end)):
        if f.end <= cursor:
            continue  # inside a span already redacted
        if f.start >= cursor:
            out.append(text[cursor : f.start])
            out.append(redaction(f.kind))
        cursor = f.end
    out.append(text[cursor:])
    return "".join(out)


def _first(findings: Sequence[Finding]) -> Finding:
    return min(findings, key=lambda f: (f.start, -f.end))


@dataclass(frozen=True)
class InputVerdict:
    """What to do with a request's text: allow it, send it on redacted, or refuse it."""

    action: str  # allow, redact or block
    text: str  # what to send on: the text, its redacted form, or "" when blocked
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class OutputStep:
    """What a stream may send the client now, and the finding that stopped it (once)."""

    text: str
    stop: Finding | None = None


@dataclass(frozen=True)
class Policy:
    """A pack compiled for use on the request path; immutable, so one is shared by requests."""

    detectors: tuple[Detector, ...]
    pii_action: str = "redact"
    apply_to_input: bool = True
    apply_to_output: bool = True
    pack_id: int | None = None
    name: str = ""
    # Packs that apply together (several names reach one model): each reads the text in turn,
    # with its own checks, PII action and stages; this policy then has no detectors of its own.
    parts: tuple[Policy, ...] = ()

    def redacts(self, finding: Finding, *, stream: bool = False) -> bool:
        """Return whether a finding is redacted (PII under a redact pack); others block."""
        if finding.detector != Pii.name or self.pii_action != "redact":
            return False
        return not (stream and finding.kind in UNREDACTABLE_IN_STREAM)

    def check_input(self, text: str) -> InputVerdict:
        """Check a request's text before admission.

        Toxic and denied text blocks; PII blocks or is redacted as the pack says. Packs applied
        together pass the text on in turn: a block by any blocks, and each redacts what it finds.
        """
        if self.parts:
            return self._parts_check(text)
        if not self.apply_to_input:
            return InputVerdict("allow", text)
        findings = tuple(
            sorted((f for d in self.detectors for f in d.find(text)), key=lambda f: f.start)
        )
        if not findings:
            return InputVerdict("allow", text)
        if all(self.redacts(f) for f in findings):
            return InputVerdict("redact", redact(text, findings), findings)
        return InputVerdict("block", "", findings)

    def _parts_check(self, text: str) -> InputVerdict:
        found: list[Finding] = []
        action = "allow"
        for part in self.parts:
            verdict = part.check_input(text)
            found.extend(verdict.findings)
            if verdict.action == "block":
                return InputVerdict("block", "", tuple(found))
            if verdict.action == "redact":
                action, text = "redact", verdict.text
        return InputVerdict(action, text, tuple(found))

    def output_filter(self) -> OutputFilter | OutputFilters:
        """Return a filter for one generation's stream of text."""
        if self.parts:
            return OutputFilters([part.output_filter() for part in self.parts])
        return OutputFilter(self)


def policy_combine(policies: Sequence[Policy]) -> Policy:
    """Return one policy that applies every one of `policies` (one: that one).

    Each keeps its own checks, PII action and stages: the input passes every pack that screens
    input, the output streams through every pack that filters output, so the text a client
    gets is what the strictest of them would let through, and more redacted where they differ.
    """
    if len(policies) == 1:
        return policies[0]
    return Policy(
        detectors=(),
        apply_to_input=any(p.apply_to_input for p in policies),
        apply_to_output=any(p.apply_to_output for p in policies),
        name=" + ".join(p.name for p in policies),
        parts=tuple(policies),
    )


def policy_compile(pack: PolicyPack) -> Policy:
    """Compile a pack's detectors, cheapest first."""
    detectors: list[Detector] = []
    if pack.deny_terms or pack.deny_patterns:
        detectors.append(DenyList(terms=pack.deny_terms, patterns=pack.deny_patterns))
    if pack.pii_kinds:
        detectors.append(Pii(pack.pii_kinds))
    if pack.toxicity_threshold is not None:
        detectors.append(Toxicity(pack.toxicity_threshold))
    return Policy(
        detectors=tuple(detectors),
        pii_action=pack.pii_action,
        apply_to_input=pack.apply_to_input,
        apply_to_output=pack.apply_to_output,
        pack_id=pack.pk,
        name=pack.name,
    )


class OutputFilter:
    """Filter a generation as it streams: redact PII, stop at toxic or denied text.

    Text is held back until every detector is sure of it: span detectors (PII, deny lists) need
    their `reach` after it (64 characters for PII and patterns, a term's length for terms; a
    match that runs to the end of the text is held while it grows, up to GROW_LIMIT), sentence
    detectors (toxicity) the end of its sentence (at most LONGEST_SENTENCE). Held text goes out
    on a later feed or on finish.

    Cost: span detectors run once per SCAN_STEP new characters, over what they have not cleared
    plus their reach before it (about 2 * reach + SCAN_STEP characters), so O(|delta|)
    amortised and never the whole stream; looking for the end of the sentence reads only the new
    text; the classifier runs once per finished sentence (about 0.5 ms). Memory is bounded the
    same way, however long the stream.

    Offsets of findings count characters of the raw stream (what the engine generated).
    """

    def __init__(self, policy: Policy) -> None:
        detectors = policy.detectors if policy.apply_to_output else ()
        self._policy = policy
        self._spans = tuple(d for d in detectors if d.reach is not None)
        self._sentences = tuple(d for d in detectors if d.reach is None)
        self._reach = max((d.reach or 0 for d in self._spans), default=0)
        self._hold = self._reach + 1
        self._text = ""  # the stream from _offset to its end
        self._offset = 0
        self._emitted = 0  # the stream before this went out (redacted)
        self._cleared = 0  # every span finding that begins before this is known
        self._sentence = 0  # where the first sentence not yet judged begins
        self._looked = 0  # how far sentence ends were looked for
        self._pending: list[Finding] = []  # redactions not yet sent
        self._finished = False
        self.redactions: list[Finding] = []  # redactions sent, to record
        self.stopped: Finding | None = None

    @property
    def _end(self) -> int:
        return self._offset + len(self._text)

    def feed(self, delta: str) -> OutputStep:
        """Take the next piece of generated text; return what may be sent now.

        After a stop nothing more is sent; the stop is reported on the step that found it.
        """
        if self.stopped is not None or self._finished:
            return OutputStep("")
        self._text += delta
        stops = self._scan(final=False)
        stops += self._judge(final=False)
        return self._release(stops, final=False)

    def finish(self) -> OutputStep:
        """End the stream: check what is held back and return what may still be sent."""
        if self.stopped is not None or self._finished:
            return OutputStep("")
        self._finished = True
        stops = self._scan(final=True)
        stops += self._judge(final=True)
        return self._release(stops, final=True)

    def _scan(self, *, final: bool, upto: int | None = None) -> list[Finding]:
        """Run the span detectors over what is not cleared; queue redactions, return stops."""
        end = self._end if upto is None else upto
        if not self._spans:
            self._cleared = end
            return []
        limit = end if final else end - self._hold
        if limit <= self._cleared or (not final and limit - self._cleared < SCAN_STEP):
            return []
        lo = max(self._offset, self._cleared - self._reach - LOOKBEHIND)
        window = self._text[lo - self._offset : end - self._offset]
        found = sorted(
            (f.shifted(lo) for d in self._spans for f in d.find(window, self._cleared - lo)),
            key=lambda f: (f.start, -f.end),
        )
        if not final:
            for f in found:
                # A match that runs to the end may still grow, or vanish ("ass" + "ume").
                if f.start < limit and f.end >= end and f.end - f.start < GROW_LIMIT:
                    limit = f.start
                    break
        kept = [f for f in found if f.start < limit]
        self._cleared = max([limit, *(f.end for f in kept)])
        stops = []
        for f in kept:
            if self._policy.redacts(f, stream=True):
                self._pending.append(f)
            else:
                stops.append(f)
        return stops

    def _judge(self, *, final: bool) -> list[Finding]:
        """Run the sentence detectors over the sentences finished since the last call."""
        if not self._sentences:
            self._sentence = self._end
            return []
        start = cursor = self._sentence
        look = max(start, self._looked)
        off = self._offset
        while (end := sentence_end(self._text, cursor - off, scan_from=look - off)) is not None:
            cursor = look = end + off
        self._looked = self._end
        if final:
            cursor = self._end
        if cursor == start:
            return []
        self._sentence = cursor
        chunk = self._text[start - self._offset : cursor - self._offset]
        return [f.shifted(start) for d in self._sentences for f in d.find(chunk)]

    def _release(self, stops: list[Finding], *, final: bool) -> OutputStep:
        if stops:
            stop = _first(stops)
            if stop.start > self._cleared:
                # A toxic sentence ahead of what the span detectors cleared: check the text
                # before it as if the stream ended there, since that text goes out now.
                stop = _first([stop, *self._scan(final=True, upto=stop.start)])
            self.stopped = stop
            upto = stop.start
        else:
            upto = self._end if final else min(self._cleared, self._sentence)
            for r in self._pending:
                if r.start < upto < r.end:
                    upto = r.start  # never send part of a span to redact
        text = self._render(upto)
        if self.stopped is not None:
            self._text, self._pending = "", []
        else:
            keep = max(self._offset, min(self._emitted, self._cleared - self._reach - LOOKBEHIND))
            self._text = self._text[keep - self._offset :]
            self._offset = keep
        return OutputStep(text, self.stopped if stops else None)

    def _render(self, upto: int) -> str:
        """Return the stream from what was sent to `upto`, redacted, and mark it sent."""
        out = []
        cursor = self._emitted
        waiting = []
        for r in sorted(self._pending, key=lambda f: (f.start, -f.end)):
            if r.start >= upto:
                waiting.append(r)
                continue
            self.redactions.append(r)
            if r.start >= cursor:
                out.append(self._text[cursor - self._offset : r.start - self._offset])
                out.append(redaction(r.kind))
            cursor = max(cursor, r.end)
        if cursor < upto:
            out.append(self._text[cursor - self._offset : upto - self._offset])
            cursor = upto
        self._pending = waiting
        self._emitted = cursor
        return "".join(out)


class OutputFilters:
    """Filter a stream through several packs' filters in turn, as one filter.

    Each filter reads what the one before it let through. A stop in any ends the stream: what
    the filters after it hold back is checked and sent as at the stream's end.
    """

    def __init__(self, filters: Sequence[OutputFilter | OutputFilters]) -> None:
        self._filters = list(filters)
        self._done = False

    @property
    def redactions(self) -> list[Finding]:
        return [r for f in self._filters for r in f.redactions]

    @property
    def stopped(self) -> Finding | None:
        return next((f.stopped for f in self._filters if f.stopped is not None), None)

    def feed(self, delta: str) -> OutputStep:
        """Take the next piece of generated text; return what may be sent now."""
        return self._through(delta, final=False)

    def finish(self) -> OutputStep:
        """End the stream: check what every filter holds back; return what may still be sent."""
        return self._through("", final=True)

    def _through(self, text: str, *, final: bool) -> OutputStep:
        if self._done:
            return OutputStep("")
        stop: Finding | None = None
        for screen in self._filters:
            step = screen.feed(text) if text else OutputStep("")
            text, stop = step.text, stop or step.stop
            if final or stop is not None:
                # The stream ends here: what this filter holds back goes on to the next now.
                end = screen.finish()
                text, stop = text + end.text, stop or end.stop
        self._done = final or stop is not None
        return OutputStep(text, stop)
