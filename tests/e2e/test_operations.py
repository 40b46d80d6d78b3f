"""vLLM's operational endpoints end to end: /health, /version, /tokenize and /detokenize.

What each must answer is vLLM's own server's answer (vllm/entrypoints/serve/instrumentator and
serve/tokenize): the same paths and body shapes, and the token ids vLLM computes, computed here
as vLLM computes them: the model's Hugging Face tokenizer called on the prompt (special tokens
added by default), or on the chat template's text for messages (none added by default).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from tenants.services import api_key_issue, tenant_create
from tests.conftest import ALIAS, CONTEXT, ROOT

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Count to three."},
]
PROMPT = "def tokenize(text):\n    return text.split()"


@pytest.fixture(scope="module")
def hf(demo_model_dir: Path) -> Any:
    """The model's tokenizer as vLLM loads it (transformers' AutoTokenizer)."""
    return AutoTokenizer.from_pretrained(str(demo_model_dir), local_files_only=True)


@pytest.fixture
def client(stack: Any) -> Any:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _error(response: httpx.Response, status: int, code: str, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["message"]


def test_health_answers_200_with_an_empty_body_without_a_key(client):
    response = client.get("/health")
    assert response.status_code == 200
    assert response.content == b""
    assert client.post("/health").status_code == 405
    # vLLM's SageMaker-style ping answers the same, to GET and POST.
    for ping in (client.get("/ping"), client.post("/ping")):
        assert (ping.status_code, ping.content) == (200, b"")


def test_version_names_the_platforms_version(client):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    response = client.get("/version")
    assert response.status_code == 200
    assert response.json() == {"version": pyproject["project"]["version"]}


def test_tokenize_a_prompt_as_vllm_does(client, world, hf):
    response = client.post(
        "/tokenize", json={"model": ALIAS, "prompt": PROMPT}, headers=_auth(world.acme_key)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["count", "max_model_len", "tokens", "token_strs"]
    expected = hf(PROMPT, add_special_tokens=True)["input_ids"]
    assert body["tokens"] == expected
    assert expected[0] == hf.bos_token_id  # the special tokens vLLM adds by default
    assert body["count"] == len(expected)
    assert body["max_model_len"] == CONTEXT  # the deployment's; acme's own limit is larger
    assert body["token_strs"] is None
    assert response.headers["x-roundhouse-model-version"] == world.version.version
    assert response.headers["x-ratelimit-remaining-requests"]


def test_tokenize_without_special_tokens_and_with_token_strings(client, world, hf):
    body = {"model": ALIAS, "prompt": PROMPT, "add_special_tokens": False}
    response = client.post(
        "/tokenize", json={**body, "return_token_strs": True}, headers=_auth(world.acme_key)
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    expected = hf(PROMPT, add_special_tokens=False)["input_ids"]
    assert answer["tokens"] == expected
    assert answer["token_strs"] == hf.convert_ids_to_tokens(expected)


@pytest.mark.parametrize(
    ("options", "template"),
    [
        ({}, {"add_generation_prompt": True}),
        ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
        (
            {"add_generation_prompt": False, "continue_final_message": True},
            {"add_generation_prompt": False, "continue_final_message": True},
        ),
    ],
)
def test_tokenize_messages_with_the_chat_template(client, world, hf, options, template):
    messages = [*MESSAGES, {"role": "assistant", "content": "One, two"}]
    response = client.post(
        "/tokenize",
        json={"model": ALIAS, "messages": messages, **options},
        headers=_auth(world.acme_key),
    )
    assert response.status_code == 200, response.text
    text = hf.apply_chat_template(messages, tokenize=False, **template)
    expected = hf(text, add_special_tokens=False)["input_ids"]
    assert response.json()["tokens"] == expected
    assert response.json()["count"] == len(expected)


def test_the_chat_template_renders_as_for_chat_completions(client, world, hf):
    """The messages a chat request sends tokenise to what that request is billed for."""
    headers = _auth(world.acme_key)
    tokens = client.post("/tokenize", json={"model": ALIAS, "messages": MESSAGES}, headers=headers)
    chat = client.post(
        "/v1/chat/completions",
        json={"model": ALIAS, "messages": MESSAGES, "max_tokens": 1},
        headers=headers,
    )
    assert chat.status_code == 200, chat.text
    assert tokens.json()["count"] == chat.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("special", [True, False])
def test_a_round_trip_gives_the_prompt_back(client, world, hf, special):
    headers = _auth(world.acme_key)
    body = {"model": ALIAS, "prompt": PROMPT, "add_special_tokens": special}
    tokens = client.post("/tokenize", json=body, headers=headers).json()["tokens"]
    response = client.post("/detokenize", json={"model": ALIAS, "tokens": tokens}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": hf.decode(tokens)}  # vLLM keeps special tokens
    assert response.json()["prompt"] == (hf.bos_token if special else "") + PROMPT
    assert response.headers["x-roundhouse-model-version"] == world.version.version


def test_an_unknown_model_is_the_same_404_as_for_chat(client, world):
    headers = _auth(world.globex_key)
    model = "acme-private-model"
    chat = client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": MESSAGES},
        headers=headers,
    )
    _error(chat, 404, "model_not_found", "model")
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})):
        response = client.post(path, json={"model": model, **body}, headers=headers)
        _error(response, 404, "model_not_found", "model")
        assert response.json() == chat.json()


def test_a_key_is_required(client, world):
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        _error(client.post(path, json={"model": ALIAS, **body}), 401, "missing_api_key", None)
        response = client.post(
            path, json={"model": ALIAS, **body}, headers=_auth(world.models_only_key)
        )
        _error(response, 403, "insufficient_scope", None)


@pytest.mark.parametrize(
    ("path", "body", "code", "param"),
    [
        ("/tokenize", {"prompt": 5}, "invalid_type", "prompt"),
        ("/tokenize", {}, "missing_required_parameter", "prompt"),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "invalid_value", "prompt"),
        ("/tokenize", {"messages": [{"role": "robot"}]}, "invalid_value", "messages[0].role"),
        ("/tokenize", {"prompt": "a", "chat_template": "{{ 1 }}"}, "unsupported_parameter",
         "chat_template"),
        ("/tokenize", {"prompt": "a", "return_token_strs": "yes"}, "invalid_type",
         "return_token_strs"),
        ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "invalid_value",
         "continue_final_message"),
        ("/detokenize", {}, "missing_required_parameter", "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "invalid_type", "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "invalid_value", "tokens[1]"),
        ("/detokenize", {"tokens": [1, 1 << 40]}, "invalid_value", "tokens[1]"),
    ],
)  # fmt: skip
def test_a_bad_field_is_a_400_naming_it(client, world, path, body, code, param):
    response = client.post(path, json={"model": ALIAS, **body}, headers=_auth(world.acme_key))
    _error(response, 400, code, param)


def test_an_unknown_field_is_refused_and_a_chat_only_one_is_not_read(client, world, hf):
    body = {"model": ALIAS, "prompt": PROMPT, "echo_me": 1}
    response = client.post("/tokenize", json=body, headers=_auth(world.acme_key))
    _error(response, 400, "unsupported_parameter", "echo_me")
    body = {"model": ALIAS, "prompt": PROMPT, "add_generation_prompt": False}
    response = client.post("/tokenize", json=body, headers=_auth(world.acme_key))
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == hf(PROMPT)["input_ids"]


def test_they_take_requests_but_no_tokens_from_the_tenants_limits(client, django_db_blocker):
    with django_db_blocker.unblock():
        tenant = tenant_create(slug="vlad-tokenizers")
        tenant.quota.requests_per_minute = 2
        tenant.quota.save()
        key = api_key_issue(tenant=tenant, name="tokenize").token
    headers = _auth(key)
    first = client.post("/tokenize", json={"model": ALIAS, "prompt": PROMPT}, headers=headers)
    second = client.post("/detokenize", json={"model": ALIAS, "tokens": [1, 2]}, headers=headers)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    tokens_left = {r.headers["x-ratelimit-remaining-tokens"] for r in (first, second)}
    assert tokens_left == {first.headers["x-ratelimit-limit-tokens"]}  # no token was counted
    third = client.post("/tokenize", json={"model": ALIAS, "prompt": PROMPT}, headers=headers)
    _error(third, 429, "rate_limit_exceeded", None)


def test_they_are_at_vllms_paths_not_under_v1(client, world):
    response = client.post(
        "/v1/tokenize", json={"model": ALIAS, "prompt": "hi"}, headers=_auth(world.acme_key)
    )
    _error(response, 404, "not_found", None)
