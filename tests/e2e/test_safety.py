"""Safety packs on the request path: input screened before admission, output filtered live."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from billing.models import UsageRecord
from privacy.selectors import content_get
from safety.models import Intervention
from safety.services import policy_assign, policy_pack_save
from tenants.services import api_key_issue, quota_update, tenant_create, tenant_privacy_update
from tests.conftest import ALIAS

TOXIC = "you are a fucking idiot and I hate you"


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _tenant_with_pack(slug: str, retain: bool = False, **pack: Any) -> tuple[Any, str]:
    tenant = tenant_create(slug=slug)
    policy_assign(tenant=tenant, pack=policy_pack_save(name=f"{slug}-pack", **pack))
    if retain:
        tenant_privacy_update(tenant=tenant, retention_days=1)
    return tenant, api_key_issue(tenant=tenant, name="tests").token


def _chat(client: httpx.Client, key: str, content: Any, **fields: Any) -> httpx.Response:
    body = {"model": ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    return client.post(
        "/v1/chat/completions",
        json={**body, **fields},
        headers={"Authorization": f"Bearer {key}"},
    )


def _interventions(django_db_blocker: Any, tenant: Any) -> list[Intervention]:
    with django_db_blocker.unblock():
        deadline = time.monotonic() + 10
        while not (found := list(Intervention.objects.filter(tenant=tenant))):
            assert time.monotonic() < deadline, "no intervention was recorded"
            time.sleep(0.1)
        return found


def test_a_toxic_prompt_is_blocked_before_admission_and_recorded_without_its_text(
    client, world, django_db_blocker
):
    with django_db_blocker.unblock():
        tenant, key = _tenant_with_pack("oscorp", toxicity_threshold=0.8)
    refused = _chat(client, key, TOXIC)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("content_policy_violation", "messages")
    assert "toxicity" in error["message"]
    assert "x-ratelimit-limit-requests" in refused.headers
    (found,) = _interventions(django_db_blocker, tenant)
    assert (found.stage, found.detector, found.action) == ("input", "toxicity", "block")
    assert found.request_id == refused.headers["x-request-id"]
    with django_db_blocker.unblock():
        # Not admitted: no usage record, nothing billed.
        assert not UsageRecord.objects.filter(request_id=found.request_id).exists()
    assert _chat(client, key, "a kind word about rivers").status_code == 200
    # A tenant without the pack is unaffected.
    assert _chat(client, world.acme_key, TOXIC).status_code == 200


def test_pii_is_redacted_or_blocked_as_the_pack_says(client, django_db_blocker):
    with django_db_blocker.unblock():
        redacting, redact_key = _tenant_with_pack(
            "umbrella-eu", retain=True, pii_kinds=["email", "card"], pii_action="redact"
        )
        _, block_key = _tenant_with_pack("cyberlife", pii_kinds=["email"], pii_action="block")
    prompt = "Mail jane.doe@example.com about card 4111 1111 1111 1111 today"
    # In parts: what a template that loops over content would get is redacted too.
    parts = [{"type": "text", "text": half} for half in prompt.split(" about ")]
    redacted = _chat(client, redact_key, parts)
    assert redacted.status_code == 200, redacted.text
    blocked = _chat(client, block_key, prompt)
    assert blocked.status_code == 400
    assert blocked.json()["error"]["code"] == "content_policy_violation"
    # What reached the engine (and the tenant's retained text) had the PII replaced.
    rid = redacted.headers["x-request-id"]
    with django_db_blocker.unblock():
        deadline = time.monotonic() + 10
        while (kept := content_get(tenant=redacting, request_id=rid)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    (message,) = json.loads(kept.prompt)
    assert set(message) == {"role", "content"}
    sent = message["content"]
    assert "jane.doe@example.com" not in sent and "4111" not in sent
    assert "[REDACTED:email]" in sent and "[REDACTED:card]" in sent
    kinds = {(i.detector, i.kind, i.action) for i in _interventions(django_db_blocker, redacting)}
    assert kinds == {("pii", "email", "redact"), ("pii", "card", "redact")}


def test_a_generation_that_turns_unsafe_stops_with_content_filter_and_bills_what_was_made(
    client, world, django_db_blocker, usage_of
):
    question = {"messages": [{"role": "user", "content": "Tell me about the yard"}]}
    asked = {**question, "max_tokens": 96, "temperature": 0, "ignore_eos": True}
    free = client.post(
        "/v1/chat/completions",
        json={"model": ALIAS, **asked},
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    full = free.json()["choices"][0]["message"]["content"]
    # A word the model (greedy, so the same again) says well into its answer becomes denied.
    words = [m for m in re.finditer(r"\b[A-Za-z]{4,}\b", full) if m.start() >= 24]
    assert words, full
    term = next(m.group() for m in words if full.lower().find(m.group().lower()) == m.start())
    with django_db_blocker.unblock():
        tenant, key = _tenant_with_pack("weyland", deny_terms=[term])

    def stream() -> tuple[str, list[str | None], str]:
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": ALIAS, **asked, "stream": True},
            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "unsafe-1"},
        ) as streamed:
            assert streamed.status_code == 200
            chunks = [json.loads(line[6:]) for line in streamed.iter_lines()
                      if line.startswith("data: {")]  # fmt: skip
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        text = "".join(c["delta"].get("content") or "" for c in choices)
        return text, [c.get("finish_reason") for c in choices], streamed.headers["x-request-id"]

    text, reasons, rid = stream()
    assert reasons[-1] == "content_filter"
    assert term.lower() not in text.lower()
    assert full.startswith(text)
    # A retry with the same Idempotency-Key replays the filtered answer, never the raw one.
    replayed, replay_reasons, replay_rid = stream()
    assert (replayed, replay_reasons[-1], replay_rid) == (text, "content_filter", rid)
    # Aborted in the engine and billed for the tokens generated up to the stop.
    (record,) = usage_of(rid)
    assert record.status == "cancelled"
    assert 0 < record.completion_tokens < 96
    # Each time the text was withheld (the answer, then its replay) is an intervention.
    found = _interventions(django_db_blocker, tenant)
    assert {(f.request_id, f.stage, f.detector, f.action) for f in found} == {
        (rid, "output", "deny_list", "stop")
    }


def test_token_level_output_is_refused_where_the_output_is_screened(client, django_db_blocker):
    """Log probabilities and token ids name the tokens the screen would take out of the text
    (a redacted email, a denied term), and a prompt's log probabilities the model's likeliest
    tokens at each position: a tenant whose pack screens output is told so, with a 400 naming
    the field; the same pack on input only lets them through."""
    with django_db_blocker.unblock():
        _, screened = _tenant_with_pack("screened-output", pii_kinds=["email"])
        _, input_only = _tenant_with_pack(
            "screened-input", pii_kinds=["email"], apply_to_output=False
        )
    for field, value in (("logprobs", True), ("prompt_logprobs", 1), ("return_token_ids", True)):
        refused = _chat(client, screened, "hello", **{field: value})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", field)
        served = _chat(client, input_only, "hello", **{field: value})
        assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["token_ids"]


# --- which pack a request runs under, and every path that answers its text -----------------

EMAIL = "jane.doe@example.com"
# A JSON schema whose first field is an enum of one address makes the model write that
# address, whatever it is asked.
ADDRESSED: dict[str, Any] = {
    "type": "object",
    "properties": {"to": {"type": "string", "enum": [EMAIL]}},
    "required": ["to"],
    "additionalProperties": False,
}
# The same, then a letter it writes for as long as max_tokens lets it (`no_quotes` keeps it
# from ending the string).
LETTER: dict[str, Any] = {
    **ADDRESSED,
    "properties": {**ADDRESSED["properties"], "body": {"type": "string"}},
    "required": ["to", "body"],
}


@pytest.fixture(scope="session")
def no_quotes(demo_model_dir) -> dict[str, int]:
    """A logit_bias away from every token with a quote in it: inside a string, where any
    other token may come, the model never ends the string. And further away from whitespace:
    where the grammar needs a quote it also allows whitespace, which would otherwise beat the
    pushed-away quote there forever."""
    from tokenizers import Tokenizer

    from models_registry.demo_model import whitespace_token_ids

    tokenizer = Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))
    quotes = [
        token_id
        for token_id in range(tokenizer.get_vocab_size())
        if '"' in tokenizer.decode([token_id], skip_special_tokens=False)
    ]
    spaces = {str(i): -100 for i in whitespace_token_ids(demo_model_dir)}
    return {**spaces, **{str(i): -50 for i in quotes}}


def _alias_pack(slug: str, alias: str, **pack: Any) -> tuple[Any, str]:
    """A tenant whose pack is assigned to one name only (not as its default)."""
    tenant = tenant_create(slug=slug)
    policy_assign(tenant=tenant, pack=policy_pack_save(name=f"{slug}-pack", **pack), alias=alias)
    return tenant, api_key_issue(tenant=tenant, name="tests").token


def _addressed(schema: dict[str, Any] = ADDRESSED) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "mail", "schema": schema}}


def test_a_pack_on_an_alias_screens_every_name_that_reaches_its_model(
    client, world, django_db_blocker
):
    # tiny-chat routes to tiny-llama: the pack assigned to the alias is the model's, so its
    # model name and a pinned version get the same input block, redaction and refusals.
    with django_db_blocker.unblock():
        _, key = _alias_pack(
            "alias-packed", ALIAS, deny_terms=["falcon"], pii_kinds=["email"], pii_action="redact"
        )
    for model in (ALIAS, "tiny-llama", world.version.public_name):
        blocked = _chat(client, key, "about the falcon", model=model)
        assert blocked.status_code == 400, (model, blocked.text)
        assert blocked.json()["error"]["code"] == "content_policy_violation"
        refused = _chat(client, key, "hello", model=model, logprobs=True)
        assert refused.status_code == 400, (model, refused.text)
        assert refused.json()["error"]["param"] == "logprobs"
        if model == "tiny-llama":
            # A bare model name goes to its newest deployed version, which other tests may
            # have registered without a worker: its output is checked by the other two names.
            continue
        answered = _chat(
            client, key, "write", model=model, response_format=_addressed(),
            max_tokens=40, temperature=0,
        )  # fmt: skip
        assert answered.status_code == 200, (model, answered.text)
        content = answered.json()["choices"][0]["message"]["content"]
        assert EMAIL not in content and "[REDACTED:email]" in content, (model, content)


def test_a_resumed_stream_is_screened_by_the_pack_of_the_model_that_served_it(
    client, django_db_blocker
):
    with django_db_blocker.unblock():
        _, key = _alias_pack("resume-packed", ALIAS, pii_kinds=["email"], pii_action="redact")
    auth = {"Authorization": f"Bearer {key}"}
    first = _chat(
        client, key, "write", response_format=_addressed(), max_tokens=40, temperature=0,
        stream=True,
    )  # fmt: skip
    assert first.status_code == 200 and "[REDACTED:email]" in first.text, first.text
    rid = first.headers["x-request-id"]
    # Read again from its start on GET /v1/requests/{id}/stream (as after a lost connection).
    again = client.get(f"/v1/requests/{rid}/stream", headers=auth)
    assert again.status_code == 200, again.text
    assert EMAIL not in again.text and "[REDACTED:email]" in again.text


def test_cancelling_a_background_response_answers_and_keeps_only_the_screened_text(
    stack, no_quotes, django_db_blocker
):
    with django_db_blocker.unblock():
        tenant, key = _tenant_with_pack("cancel-packed", pii_kinds=["email"], pii_action="redact")
        # Room for a long letter: the screen holds the text back while the model writes runs
        # that could still grow into an address, so the first screened text can come a second
        # into the generation; the poll must see it, and cancel, before the letter ends.
        quota_update(tenant=tenant, changes={"max_tokens_per_request": 1900})
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        auth = {"Authorization": f"Bearer {key}"}
        accepted = client.post(
            "/v1/responses",
            json={
                "model": ALIAS,
                "input": "Write a letter",
                "background": True,
                "max_output_tokens": 1900,
                "temperature": 0,
                "ignore_eos": True,
                "logit_bias": no_quotes,
                "text": {"format": {"type": "json_schema", "name": "mail", "schema": LETTER}},
            },
            headers=auth,
        )
        assert accepted.status_code == 200, accepted.text
        response_id = accepted.json()["id"]
        deadline = time.monotonic() + 60
        while True:  # polled (screened) until the address has been written, still running
            polled = client.get(f"/v1/responses/{response_id}", headers=auth).json()
            assert polled["status"] in ("queued", "in_progress"), polled
            if "[REDACTED:email]" in json.dumps(polled["output"]):
                break
            assert time.monotonic() < deadline, polled
            time.sleep(0.05)
        cancelled = client.post(f"/v1/responses/{response_id}/cancel", headers=auth)
        assert cancelled.status_code == 200, cancelled.text
        kept = client.get(f"/v1/responses/{response_id}", headers=auth)
    # The answer to the cancel, and the response kept, carry the text as the poll read it (the
    # address is in the echoed schema, not in the output).
    for body in (cancelled.json(), kept.json()):
        output = json.dumps(body["output"])
        assert body["status"] == "cancelled"
        assert EMAIL not in output and "[REDACTED:email]" in output, output
