"""A compiled policy's verdict on a request's input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inference.base.errors import ApiError
from safety.detectors import PII_KINDS, DenyList, Finding, Pii, Toxicity
from safety.policy import Policy, redact

REDACTING = Policy(
    detectors=(DenyList(terms=["falcon"]), Pii(PII_KINDS), Toxicity(0.8)), pii_action="redact"
)
BLOCKING = Policy(detectors=(Pii(PII_KINDS),), pii_action="block")


def test_clean_input_is_allowed():
    verdict = REDACTING.check_input("Summarise the attached report in 3 bullet points.")
    assert (verdict.action, verdict.findings) == ("allow", ())
    assert verdict.text == "Summarise the attached report in 3 bullet points."


def test_toxic_input_is_blocked():
    verdict = REDACTING.check_input("Hello. You are a stupid idiot and I hate you.")
    assert verdict.action == "block"
    assert verdict.text == ""
    assert [(f.detector, f.kind) for f in verdict.findings] == [("toxicity", "toxic")]


def test_input_with_a_deny_term_is_blocked_even_with_pii_to_redact():
    verdict = REDACTING.check_input("Mail bob@example.com about Falcon.")
    assert verdict.action == "block"
    assert {f.detector for f in verdict.findings} == {"deny_list", "pii"}


def test_pii_in_input_is_redacted_under_a_redacting_pack():
    verdict = REDACTING.check_input("Mail bob@example.com or call 555-123-4567 re 4111111111111111")
    assert verdict.action == "redact"
    assert verdict.text == "Mail [REDACTED:email] or call [REDACTED:phone] re [REDACTED:card]"
    assert [f.kind for f in verdict.findings] == ["email", "phone", "card"]


def test_pii_in_input_is_blocked_under_a_blocking_pack():
    verdict = BLOCKING.check_input("my key: sk-proj-abcDEF1234567890ghijKLMN")
    assert (verdict.action, verdict.text) == ("block", "")
    assert [f.kind for f in verdict.findings] == ["secret"]


def test_a_private_key_block_is_redacted_whole():
    block = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN\nBgkqhkiG9w0B\n-----END PRIVATE KEY-----"
    text = f"key:\n{block}\nok?"
    verdict = REDACTING.check_input(text)
    assert verdict.text == "key:\n[REDACTED:private_key]\nok?"


def test_a_pack_off_for_input_allows_anything():
    policy = Policy(detectors=(DenyList(terms=["falcon"]),), apply_to_input=False)
    assert policy.check_input("falcon").action == "allow"


def test_overlapping_spans_are_redacted_once():
    text = "abcdefghij"
    spans = [Finding("pii", "a", 1, 5), Finding("pii", "b", 3, 8), Finding("pii", "c", 4, 6)]
    assert redact(text, spans) == "a[REDACTED:a]ij"


def test_importing_safety_does_not_load_the_classifier():
    code = (
        "import sys, django; django.setup();"
        "import safety.admin, safety.policy, safety.selectors, safety.services;"
        "from safety.detectors import Toxicity; Toxicity(0.5);"
        "print('profanity_check' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"},
    )
    assert result.stdout.strip() == "False"


def test_a_redacted_message_reaches_a_template_that_loops_over_content_redacted(monkeypatch):
    import asyncio

    from inference.body.fields import CHAT
    from inference.body.parser import generation_parse
    from inference.pipeline import safety as content_policy
    from models_registry.tokenizer import CONTENT_PARTS

    monkeypatch.setattr(content_policy, "_record", lambda *args: None)  # the audit's write
    parts = [{"type": "text", "text": "Mail jane.doe@example.com"}, {"type": "text", "text": "now"}]
    clean = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": clean}, {"role": "user", "content": parts}],
    }
    request = generation_parse(body, endpoint=CHAT)
    screened = asyncio.run(
        content_policy.input_screen(request, policy=REDACTING, tenant_id=1, request_id="r")
    )
    assert screened.messages is not None and request.messages is not None
    untouched, redacted = screened.messages
    # A message the screen left alone keeps its parts; a redacted one is its redacted text
    # alone (which such a template gets as one part): no part keeps what was removed.
    assert untouched == request.messages[0]
    assert redacted == {"role": "user", "content": "Mail [REDACTED:email]\nnow"}
    assert CONTENT_PARTS not in redacted


def test_each_conversation_of_a_batch_chat_is_screened_and_redacted_in_place(monkeypatch):
    import asyncio

    from inference.chat.protocol import chat_batch_parse
    from inference.pipeline import safety as content_policy

    monkeypatch.setattr(content_policy, "_record", lambda *args: None)  # the audit's write
    clean = [{"role": "user", "content": "Hello there"}]
    mailing = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Mail jane.doe@example.com"},
    ]
    request = chat_batch_parse({"model": "m", "messages": [clean, mailing, clean]})
    screened = asyncio.run(
        content_policy.input_screen(request, policy=REDACTING, tenant_id=1, request_id="r")
    )
    assert screened.chats() == (
        clean,
        [mailing[0], {"role": "user", "content": "Mail [REDACTED:email]"}],
        clean,
    )
    assert screened.messages == clean  # the first, as ever
    blocked = chat_batch_parse(
        {"model": "m", "messages": [clean, [{"role": "user", "content": "a falcon"}]]}
    )
    with pytest.raises(ApiError) as refused:
        asyncio.run(
            content_policy.input_screen(blocked, policy=REDACTING, tenant_id=1, request_id="r")
        )
    assert (refused.value.status, refused.value.code) == (400, "content_policy_violation")
