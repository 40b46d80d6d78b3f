"""Each detector on its own: the real toxicity classifier, PII patterns, deny lists."""

from __future__ import annotations

import pytest
import regex

from safety.detectors import (
    PII_KINDS,
    DenyList,
    Pii,
    SlowPatternError,
    Toxicity,
    deny_pattern_compile,
    luhn_valid,
)

ORDINARY = [
    "I have 3 apples and 2024 was good",
    "The meeting is on 2024-10-15 at 10:30, room 4.",
    "We used 1,234,567 tokens and 8192 of context; the run took 1704067200000 ms.",
    "Order 12345678901 shipped; version 1.234.567 is out.",
    "Call me maybe? Pages 120-135 cover it; the ratio was 3/4.",
    "Prices rose 5% to $1,299.99 in Q3 2024.",
    "Set max_tokens = 1024 and temperature = 0.7 for this password-free demo.",
]


def _found(detector, text):
    return [(f.kind, text[f.start : f.end]) for f in detector.find(text)]


def test_it_finds_a_toxic_sentence_and_passes_a_benign_one():
    toxicity = Toxicity(0.8)
    assert _found(toxicity, "You are a stupid idiot and I hate you.") == [
        ("toxic", "You are a stupid idiot and I hate you.")
    ]
    assert _found(toxicity, "Thanks, the quarterly report looks great.") == []


def test_it_finds_one_toxic_line_in_a_long_benign_text():
    benign = "The report covers revenue, costs and the plan for next year. " * 30
    text = benign + "\nShut up, you worthless piece of shit.\n" + benign
    findings = Toxicity(0.8).find(text)
    assert [text[f.start : f.end] for f in findings] == ["Shut up, you worthless piece of shit."]


def test_it_finds_a_toxic_phrase_diluted_in_a_long_sentence():
    text = (
        "Per the ticket from 2024-10-15 the password field and the config file and the api "
        "and you are a stupid idiot and the rest of the deploy notes follow here"
    )
    assert Toxicity(0.8).find(text)


def test_its_threshold_decides():
    assert Toxicity(0.99).find("This assignment sucks.") == []
    assert Toxicity(0.5).find("This assignment sucks.")


@pytest.mark.parametrize("text", ORDINARY)
def test_it_finds_no_pii_in_ordinary_text_with_numbers(text):
    assert _found(Pii(PII_KINDS), text) == []


def test_it_finds_emails():
    text = "Write to bob.smith+news@example.co.uk, or ops@acme.io."
    assert _found(Pii(["email"]), text) == [
        ("email", "bob.smith+news@example.co.uk"),
        ("email", "ops@acme.io"),
    ]


@pytest.mark.parametrize(
    "phone",
    [
        "+44 20 7946 0958",
        "+1 (555) 123-4567",
        "+33 1 23 45 67 89",
        "+4930123456",
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "1-800-555-0199",
    ],
)
def test_it_finds_international_and_us_phone_numbers(phone):
    assert _found(Pii(["phone"]), f"Call {phone} today.") == [("phone", phone)]


def test_a_phone_number_ends_where_a_card_number_next_to_it_begins():
    text = "+44 20 7946 0958 4111 1111 1111 1111"
    assert _found(Pii(["phone", "card"]), text) == [
        ("phone", "+44 20 7946 0958"),
        ("card", "4111 1111 1111 1111"),
    ]


@pytest.mark.parametrize("text", ["5551234567 tokens", "+5 points", "+12 345", "1-2-3"])
def test_it_does_not_take_bare_numbers_for_phones(text):
    assert _found(Pii(["phone"]), text) == []


def test_it_finds_cards_only_with_a_valid_checksum():
    text = (
        "Pay with 4111 1111 1111 1111, 5500-0000-0000-0004 or 378282246310005; "
        "not 4111 1111 1111 1112."
    )
    assert _found(Pii(["card"]), text) == [
        ("card", "4111 1111 1111 1111"),
        ("card", "5500-0000-0000-0004"),
        ("card", "378282246310005"),
    ]


def test_luhn():
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")


@pytest.mark.parametrize(
    "secret",
    [
        "rh-abcdefghijkl" + "Zx9kQ2mP7vL4tR8wYb3nQ2mP7vL4",
        "sy-abcdefghijkl" + "Zx9kQ2mP7vL4tR8wYb3nQ2mP7vL4",  # issued before the rename
        "sk-proj-abcDEF1234567890ghijKLMN",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "a1B2c3D4e5" * 4,
    ],
)
def test_it_finds_keys(secret):
    assert _found(Pii(["secret"]), f"my key is {secret} ok") == [("secret", secret)]


def test_it_finds_the_value_of_a_labelled_secret():
    text = 'config: api_key = "Zx9kQ2mP7vL4tR8wYb3n", {"db_password": "h7#Kq2!pLz9@wX"}'
    assert _found(Pii(["secret"]), text) == [
        ("secret", "Zx9kQ2mP7vL4tR8wYb3n"),
        ("secret", "h7#Kq2!pLz9@wX"),
    ]


def test_it_leaves_a_labelled_value_that_does_not_look_random():
    assert _found(Pii(["secret"]), "password: aaaaaaaaaaaaaaaa and token = 1111111111111") == []


def test_it_finds_a_private_key_block_whole():
    block = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nq83v\n-----END RSA PRIVATE KEY-----"
    assert _found(Pii(["secret"]), f"here:\n{block}\nthanks") == [("private_key", block)]


def test_it_only_looks_for_the_kinds_asked():
    text = "bob@example.com 555-123-4567"
    assert _found(Pii(["phone"]), text) == [("phone", "555-123-4567")]
    with pytest.raises(ValueError, match="unknown PII kinds: ssn"):
        Pii(["ssn"])


def test_it_matches_deny_terms_as_whole_words_in_any_case():
    deny = DenyList(terms=["Project Falcon", "ass"])
    text = "About PROJECT   falcon: assume nothing, Ass."
    assert _found(deny, text) == [("term", "PROJECT   falcon"), ("term", "Ass")]


def test_it_matches_deny_patterns_in_any_case():
    deny = DenyList(patterns=[r"acme-\d{4}"])
    assert _found(deny, "ticket ACME-2024 and acme-12") == [("pattern", "ACME-2024")]


def test_it_refuses_a_pattern_that_does_not_compile():
    with pytest.raises(regex.error):
        deny_pattern_compile("(unclosed")


def test_it_refuses_a_pattern_that_backtracks_catastrophically():
    with pytest.raises(SlowPatternError):
        deny_pattern_compile(r"(a+)+$")


def test_it_refuses_a_pattern_that_matches_empty_text():
    with pytest.raises(ValueError, match="empty"):
        deny_pattern_compile(r"x*")


def test_a_pattern_that_runs_out_of_time_fails_closed():
    deny = DenyList(patterns=[r"(a+)+$"])  # not saved through the checks
    assert [f.kind for f in deny.find("a" * 5000 + "!")] == ["timeout"]
