"""Detectors: what a policy looks for in a text, and where they found it.

A detector returns spans and kinds, never the text it matched, so a finding can be logged and
recorded for any tenant. Span detectors (PII, deny lists) find bounded spans and say how far back
a match may begin (`reach`); sentence detectors (toxicity) judge whole sentences (`reach` None).
A stream holds back what each kind needs (see safety.policy.OutputFilter).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import regex

from safety.classifier import toxicity_scores
from safety.sentences import sentence_spans
from tenants.keys import PREFIXES as KEY_PREFIXES
from tenants.keys import PUBLIC_ID_LENGTH


@dataclass(frozen=True)
class Finding:
    """What a detector found and where: `text[start:end]` (the text itself is not kept)."""

    detector: str
    kind: str
    start: int
    end: int

    def shifted(self, by: int) -> Finding:
        return replace(self, start=self.start + by, end=self.end + by)


def disjoint(findings: Iterable[Finding]) -> list[Finding]:
    """Return findings in order, leaving out any that overlaps one before it (the longer wins)."""
    kept: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.start, -f.end)):
        if not kept or f.start >= kept[-1].end or f.start == f.end:
            kept.append(f)
    return kept


class Detector(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def reach(self) -> int | None:
        """The most characters a match needs before it can be found; None: whole sentences."""
        ...

    def find(self, text: str, start: int = 0) -> list[Finding]:
        """Return findings that begin at or after `start`; text before it is only context."""
        ...


# --- toxicity -------------------------------------------------------------------------------


# A toxic phrase inside a long sentence is diluted by the words around it: long sentences are
# also scored in windows of this many words (half overlapping), and judged by the worst.
WINDOW_WORDS = 8


def _windows(sentence: str) -> list[str]:
    words = sentence.split()
    if len(words) <= WINDOW_WORDS:
        return [sentence]
    step = WINDOW_WORDS // 2
    return [sentence] + [
        " ".join(words[i : i + WINDOW_WORDS]) for i in range(0, len(words) - step, step)
    ]


class Toxicity:
    """The offline alt-profanity-check classifier, applied sentence by sentence.

    A long benign text with one toxic line is judged on that line, not diluted by the rest.
    """

    name = "toxicity"
    reach = None

    def __init__(self, threshold: float) -> None:
        if not 0 < threshold <= 1:
            raise ValueError("the toxicity threshold must be in (0, 1]")
        self.threshold = threshold

    def find(self, text: str, start: int = 0) -> list[Finding]:
        spans = sentence_spans(text, start)
        windows = [_windows(text[s:e]) for s, e in spans]
        scores = iter(toxicity_scores([w for each in windows for w in each]))
        worst = [max(next(scores) for _ in each) for each in windows]
        return [
            Finding(self.name, "toxic", s, e)
            for (s, e), score in zip(spans, worst, strict=True)
            if score >= self.threshold
        ]


# --- PII ------------------------------------------------------------------------------------

PII_KINDS = ("email", "phone", "card", "secret")
# Every PII pattern below is found once this many characters of it are written (hence the
# bounds on an address's local part and a key header's words); longer matches (a key, a long
# domain) are found by then and held while they grow (see OutputFilter).
PII_REACH = 64


def luhn_valid(digits: str) -> bool:
    """Return whether a card number's digits pass the Luhn checksum."""
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = int(char)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _digits(text: str) -> str:
    return "".join(c for c in text if c.isdigit())


def _card(text: str) -> int:
    return len(text) if luhn_valid(_digits(text)) else 0


def _phone(text: str) -> int:
    # E.164 allows at most 15 digits: groups past that (a number written next to it) are not
    # part of it. Fewer than 8 digits is an extension or a count, not a phone number.
    while len(_digits(text)) > 15:
        text = re.sub(r"[ .-]?\d+$", "", text)
    return len(text) if len(_digits(text)) >= 8 else 0


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _random_looking(text: str) -> int:
    # A labelled value counts as a secret when it looks random: "password: changeme" does not.
    return len(text) if _entropy(text) >= 3.0 else 0


@dataclass(frozen=True)
class _PiiPattern:
    family: str  # the PII kind a pack enables
    kind: str  # what a finding is called (a private key is a `secret` a stream cannot redact)
    pattern: re.Pattern[str]
    # How much of the match is the PII (0: none of it): a checksum, a digit count, entropy.
    accept: Callable[[str], int] | None = None
    group: int | str = 0  # the part of the match that is the PII (a secret, not its label)


_SECRET_LABEL = (
    r"(?i:\b[a-z0-9_.-]{0,20}(?:api[_-]?key|secret|token|passw(?:or)?d|pwd|access[_-]?key"  # nosec B105
    r"|private[_-]?key|auth)\b)"
)
_PII_PATTERNS = (
    _PiiPattern(
        "email",
        "email",
        re.compile(
            r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,47}@"
            r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,8}[A-Za-z]{2,24}(?![\w-])"
        ),
    ),
    # International: a leading +, then 8 to 15 digits in groups.
    _PiiPattern(
        "phone",
        "phone",
        re.compile(r"(?<![\w+])\+[1-9]\d{0,2}(?:[ .-]?\(\d{1,4}\))?(?:[ .-]?\d{1,4}){2,6}(?!\w)"),
        _phone,
    ),
    # North American: separators required, so a bare 10-digit count or an id is not a phone.
    _PiiPattern(
        "phone",
        "phone",
        re.compile(
            r"(?<![\w+.-])(?:1[ .-]?)?(?:\([2-9]\d{2}\)[ .-]?|[2-9]\d{2}[ .-])\d{3}[ .-]\d{4}"
            r"(?![\w-]|\.\d)"
        ),
    ),
    # 13 to 19 digits (spaces or dashes allowed) starting like a card network's numbers
    # (2-6), with a valid Luhn checksum: a millisecond timestamp or an order id is not a card.
    _PiiPattern(
        "card",
        "card",
        re.compile(r"(?<![\w-])[2-6]\d{3}(?:[ -]?\d){9,15}(?![\w-])"),
        _card,
    ),
    # The platform's own keys, under the current prefix and the former one.
    _PiiPattern(
        "secret",
        "secret",
        re.compile(
            rf"\b(?:{'|'.join(re.escape(p) for p in KEY_PREFIXES)})"
            rf"[a-z0-9]{{{PUBLIC_ID_LENGTH}}}[A-Za-z0-9_-]{{16,128}}"
        ),
    ),
    _PiiPattern("secret", "secret", re.compile(r"\bsk-[A-Za-z0-9_-]{20,256}")),
    _PiiPattern("secret", "secret", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    _PiiPattern(
        "secret", "secret", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_\w{22,255})")
    ),
    # The whole block when its end is there; else the header and the base64 lines after it. A
    # stream stops at the header whatever the pack's PII action.
    _PiiPattern(
        "secret",
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]{1,12} ){0,2}PRIVATE KEY-----"
            r"(?:[\s\S]{0,16384}?-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY-----"
            r"|(?:\s*[A-Za-z0-9+/=]{8,}){0,400})"
        ),
    ),
    # `api_key = "…"`, `"password": "…"`, `GITHUB_TOKEN=…`: only the value is the secret.
    _PiiPattern(
        "secret",
        "secret",
        re.compile(
            _SECRET_LABEL + r"[\"']?\s{0,3}[:=]\s{0,3}[\"']?(?P<value>[A-Za-z0-9_\-+/=.~!@#$%^&*]"
            r"{12,256})"
        ),
        _random_looking,
        "value",
    ),
)


class Pii:
    """Emails, phone numbers, card numbers (Luhn-checked) and keys or secrets."""

    name = "pii"
    reach = PII_REACH

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = frozenset(kinds)
        unknown = self.kinds - set(PII_KINDS)
        if unknown:
            raise ValueError(f"unknown PII kinds: {', '.join(sorted(unknown))}")
        self._patterns = tuple(p for p in _PII_PATTERNS if p.family in self.kinds)

    def find(self, text: str, start: int = 0) -> list[Finding]:
        findings = []
        # A match may begin up to `reach` before `start` (a secret's label) and still be new.
        scan_from = max(0, start - self.reach)
        for p in self._patterns:
            for match in p.pattern.finditer(text, scan_from):
                s, e = match.span(p.group)
                if p.accept is not None:
                    e = s + p.accept(text[s:e])
                if s < start or s == e:
                    continue
                findings.append(Finding(self.name, p.kind, s, e))
        return disjoint(findings)


# --- deny lists -----------------------------------------------------------------------------

# A tenant's pattern gets this long to scan one text; one that takes longer fails closed.
PATTERN_TIMEOUT_SECONDS = 0.1
# In a stream, a pattern's match is caught across pieces when it is at most this long.
PATTERN_REACH = 64
# Texts a pattern is tried on when saved: ones that make a backtracking pattern explode.
_PATTERN_PROBES = (
    "a" * 4000 + "!",
    "a " * 2000 + "!",
    "0" * 4000 + "x",
    "a@" * 2000,
    "\n" * 2000 + "x",
)


class SlowPatternError(ValueError):
    """A deny pattern that backtracks too much to run on every request."""


def deny_pattern_compile(pattern: str) -> regex.Pattern[str]:
    """Compile a tenant's deny pattern (case-insensitive), refusing ones too slow to run.

    Raises regex.error when it does not compile, SlowPatternError when a probe text makes it
    run past the timeout, ValueError when it matches empty text (and so everywhere).
    """
    compiled = regex.compile(pattern, regex.IGNORECASE)
    if compiled.search("") is not None:
        raise ValueError("matches empty text")
    for probe in _PATTERN_PROBES:
        try:
            compiled.search(probe, timeout=PATTERN_TIMEOUT_SECONDS)
        except TimeoutError as exc:
            raise SlowPatternError("backtracks too much (it could stall requests)") from exc
    return compiled


def _terms_pattern(terms: Iterable[str]) -> re.Pattern[str] | None:
    words = sorted({t.strip() for t in terms if t.strip()}, key=len, reverse=True)
    if not words:
        return None
    # A term of several words matches however the words are spaced.
    alternatives = "|".join(r"\s+".join(re.escape(w) for w in t.split()) for t in words)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


class DenyList:
    """A tenant's words (whole words, any case) and regular expressions (any case)."""

    name = "deny_list"

    def __init__(self, terms: Sequence[str] = (), patterns: Sequence[str] = ()) -> None:
        self._terms = _terms_pattern(terms)
        # Patterns were compiled and probed when the pack was saved (deny_patterns_validate).
        self._patterns = tuple(regex.compile(p, regex.IGNORECASE) for p in patterns)
        longest_term = max((len(t) + 16 for t in terms), default=0)  # room for extra spaces
        self.reach = max(longest_term, PATTERN_REACH if patterns else 0)

    def find(self, text: str, start: int = 0) -> list[Finding]:
        findings = []
        scan_from = max(0, start - self.reach)
        if self._terms is not None:
            for match in self._terms.finditer(text, scan_from):
                if match.start() >= start:
                    findings.append(Finding(self.name, "term", *match.span()))
        for compiled in self._patterns:
            try:
                for match in compiled.finditer(text, scan_from, timeout=PATTERN_TIMEOUT_SECONDS):
                    if match.start() >= start and match.end() > match.start():
                        findings.append(Finding(self.name, "pattern", *match.span()))
            except TimeoutError:
                # Fail closed: a pattern that cannot finish must not let the text through.
                findings.append(Finding(self.name, "timeout", start, start))
        return disjoint(findings)
