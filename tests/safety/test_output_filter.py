"""The streaming output filter: spans split across pieces, redaction, stops, the held tail."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from safety.detectors import PII_KINDS, DenyList, Finding, Pii, Toxicity
from safety.policy import LOOKBEHIND, SCAN_STEP, Policy, policy_combine
from safety.sentences import LONGEST_SENTENCE

REDACTING = Policy(
    detectors=(DenyList(terms=["project falcon"], patterns=[r"acme-\d{4}"]), Pii(PII_KINDS)),
    pii_action="redact",
)
WITH_TOXICITY = Policy(
    detectors=(*REDACTING.detectors, Toxicity(0.8)),
    pii_action="redact",
)
CLEAN = (
    "Here is the plan for 2024. We ship 3 features, each with 12 tests; "
    "the budget is $1,299.99 and the deadline is 2024-10-15.\nThanks for reading!"
)
WITH_PII = (
    "Sure. Write to bob.smith@example.com or call +44 20 7946 0958, "
    "and pay with 4111 1111 1111 1111 before noon."
)
REDACTED = (
    "Sure. Write to [REDACTED:email] or call [REDACTED:phone], "
    "and pay with [REDACTED:card] before noon."
)


def _pieces(text: str, sizes: Sequence[int]) -> list[str]:
    pieces, i, n = [], 0, 0
    while i < len(text):
        size = sizes[n % len(sizes)]
        pieces.append(text[i : i + size])
        i, n = i + size, n + 1
    return pieces


def _stream(policy: Policy, pieces: Sequence[str]) -> tuple[str, Finding | None, list[str]]:
    """Feed pieces until a stop, then finish; return what was sent, the stop, and each step."""
    out = policy.output_filter()
    sent = []
    for piece in pieces:
        step = out.feed(piece)
        sent.append(step.text)
        if step.stop is not None:
            return "".join(sent), step.stop, sent
    step = out.finish()
    sent.append(step.text)
    return "".join(sent), step.stop, sent


def test_clean_text_comes_through_unchanged_character_by_character():
    sent, stop, _ = _stream(WITH_TOXICITY, list(CLEAN))
    assert (sent, stop) == (CLEAN, None)


def test_pii_split_across_single_characters_is_redacted():
    sent, stop, steps = _stream(REDACTING, list(WITH_PII))
    assert (sent, stop) == (REDACTED, None)
    assert not any("example" in step or "7946" in step for step in steps)


def test_redactions_are_kept_for_recording():
    out = REDACTING.output_filter()
    for char in WITH_PII:
        out.feed(char)
    out.finish()
    assert [f.kind for f in out.redactions] == ["email", "phone", "card"]
    assert out.stopped is None


FRAGMENTS = [
    "bob.smith@example.com.",
    "ops@acme.io,",
    "+44 20 7946 0958",
    "(555) 123-4567",
    "4111-1111-1111-1111",
    "4111 1111 1111 1112",
    "sk-proj-abcDEF1234567890ghijKLMN",
    'api_key = "Zx9kQ2mP7vL4tR8wYb3n"',
    "AKIAIOSFODNN7EXAMPLE",
    "I have 3 apples and 2024 was good.",
    "2024-10-15",
    "assume",
    "\n",
    "word " * 12,
]
SENSITIVE = ["bob.smith", "ops@", "7946", "123-4567", "4111-1111", "abcDEF", "Zx9kQ2", "AKIAIOS"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=30),
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12),
)
def test_any_split_of_the_stream_gives_what_one_piece_gives(fragments, sizes):
    text = " ".join(fragments)
    whole, _, _ = _stream(REDACTING, [text])
    split, _, _ = _stream(REDACTING, _pieces(text, sizes))
    assert split == whole == REDACTING.check_input(text).text
    assert not any(secret in split for secret in SENSITIVE)


def test_a_deny_term_split_across_pieces_stops_before_it():
    text = "Our roadmap: Project   Falcon launches soon. More after."
    sent, stop, _ = _stream(REDACTING, list(text))
    assert sent == "Our roadmap: "
    assert stop is not None
    assert (stop.detector, stop.kind) == ("deny_list", "term")
    assert text[stop.start : stop.end] == "Project   Falcon"


def test_a_deny_pattern_split_across_pieces_stops_the_stream():
    sent, stop, _ = _stream(REDACTING, _pieces("see ticket ACME-2024 for details", [3]))
    assert sent == "see ticket "
    assert stop is not None and stop.kind == "pattern"


def test_a_word_that_only_begins_like_a_deny_term_goes_through():
    policy = Policy(detectors=(DenyList(terms=["ass"]),))
    sent, stop, _ = _stream(policy, list("We assume the class passes."))
    assert (sent, stop) == ("We assume the class passes.", None)


def test_a_toxic_sentence_stops_the_stream_and_is_never_sent():
    text = "Happy to help with that. You are a stupid idiot and I hate you. Anyway, here it is."
    sent, stop, _ = _stream(WITH_TOXICITY, _pieces(text, [2, 5, 1]))
    assert sent == "Happy to help with that. "
    assert stop is not None
    assert (stop.detector, stop.kind) == ("toxicity", "toxic")
    assert text[stop.start : stop.end] == "You are a stupid idiot and I hate you."


def test_text_before_a_toxic_sentence_is_still_redacted():
    text = "Mail bob@example.com now. You are a stupid idiot and I hate you."
    sent, stop, _ = _stream(WITH_TOXICITY, list(text))
    assert sent == "Mail [REDACTED:email] now. "
    assert stop is not None and stop.detector == "toxicity"


def test_a_toxic_last_sentence_is_caught_on_finish():
    sent, stop, _ = _stream(WITH_TOXICITY, list("Fine. You stupid idiot"))
    assert sent == "Fine. "
    assert stop is not None and stop.detector == "toxicity"


def test_nothing_is_sent_after_a_stop_and_the_stop_is_reported_once():
    out = REDACTING.output_filter()
    steps = [out.feed(piece) for piece in _pieces("ok then project falcon " + "x " * 100, [4])]
    stops = [s.stop for s in steps if s.stop is not None]
    assert len(stops) == 1
    after = steps[[s.stop for s in steps].index(stops[0]) + 1 :]
    assert after and all(s.text == "" and s.stop is None for s in after)
    assert out.finish().text == ""
    assert out.stopped == stops[0]


def test_pii_under_a_blocking_pack_stops_the_stream():
    policy = Policy(detectors=(Pii(["email"]),), pii_action="block")
    sent, stop, _ = _stream(policy, list("Contact bob@example.com for access."))
    assert sent == "Contact "
    assert stop is not None and (stop.detector, stop.kind) == ("pii", "email")


def test_a_private_key_stops_even_a_redacting_stream():
    body = "\n".join(["MIIEowIBAAKCAQEAq83vZ9kQ2mP7vL4tR8wYb3nQ2mP7vL4tR8wYb3n"] * 20)
    text = f"Here you go:\n-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\n"
    sent, stop, steps = _stream(REDACTING, _pieces(text, [3]))
    assert sent == "Here you go:\n"
    assert stop is not None and stop.kind == "private_key"
    assert not any("MIIE" in step for step in steps)


def test_finish_releases_the_held_tail():
    out = REDACTING.output_filter()
    first = out.feed("The answer is 42, as always.")
    assert first.text == ""  # shorter than what span detectors hold back
    last = out.finish()
    assert (first.text + last.text, last.stop) == ("The answer is 42, as always.", None)


def test_a_long_stream_goes_out_as_it_comes_holding_back_a_bounded_tail():
    out = WITH_TOXICITY.output_filter()
    sent = 0
    fed = 0
    for _ in range(300):
        piece = "and so the list goes on "  # no sentence ends: a run-on
        fed += len(piece)
        sent += len(out.feed(piece).text)
        held = fed - sent
        assert held <= LONGEST_SENTENCE + 64 + SCAN_STEP + LOOKBEHIND + len(piece)
    assert sent > fed - LONGEST_SENTENCE - 100


def test_a_pack_off_for_output_passes_text_through():
    policy = Policy(detectors=(DenyList(terms=["falcon"]),), apply_to_output=False)
    out = policy.output_filter()
    assert out.feed("falcon ").text == "falcon "


PII_ONLY = Policy(detectors=(Pii(PII_KINDS),), pii_action="redact")
DENY_ONLY = Policy(detectors=(DenyList(terms=["project falcon"]),))


@given(sizes=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=4))
@settings(max_examples=50, deadline=None)
def test_packs_applied_together_redact_as_one_pack_with_both_checks_would(sizes):
    together = policy_combine([DENY_ONLY, PII_ONLY])
    sent, stop, _ = _stream(together, _pieces(WITH_PII, sizes))
    assert (sent, stop) == (REDACTED, None)


def test_packs_applied_together_stop_where_either_would_and_send_nothing_after():
    text = "Write to bob.smith@example.com about project falcon and more text after it."
    for order in ([DENY_ONLY, PII_ONLY], [PII_ONLY, DENY_ONLY]):
        sent, stop, _ = _stream(policy_combine(order), list(text))
        assert stop is not None and stop.detector == "deny_list"
        assert sent == "Write to [REDACTED:email] about "


def test_a_pack_that_filters_no_output_lets_the_others_filter_it():
    input_only = Policy(detectors=(DenyList(terms=["project falcon"]),), apply_to_output=False)
    together = policy_combine([input_only, PII_ONLY])
    assert together.apply_to_output and together.apply_to_input
    sent, stop, _ = _stream(together, list("about project falcon: bob.smith@example.com"))
    assert (sent, stop) == ("about project falcon: [REDACTED:email]", None)
