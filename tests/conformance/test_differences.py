"""Where the platform answers differently from vLLM's own server on purpose: one test a row.

The table is in docs/conformance.md ("Intentional differences"); each row names its test here.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from inference.body.inputs import MAX_MESSAGES
from inference.pipeline.submission import MAX_PROMPT_LOGPROBS
from tests.conformance.cases import ASK, FUNCTIONS, HELLO, LONG, PATHS, THINK
from tests.conformance.conftest import THINKING
from tests.conftest import ACME_MAX_TOKENS, ALIAS

pytestmark = pytest.mark.django_db(transaction=False)

CHAT_PATH = "/v1/chat/completions"
BATCH_PATH = PATHS["batch"]
BODY = {"model": ALIAS, "messages": HELLO, "temperature": 0, "max_tokens": 4}


def _both(targets: Any, body: dict[str, Any]) -> tuple[httpx.Response, httpx.Response]:
    return targets.platform.post(CHAT_PATH, json=body), targets.vllm.post(CHAT_PATH, json=body)


def test_model_names_the_version_that_answered(targets: Any) -> None:
    ours, theirs = _both(targets, BODY)
    assert theirs.json()["model"] == ALIAS
    version = ours.headers["x-roundhouse-model-version"]
    assert ours.json()["model"] == f"tiny-llama@{version}"


def test_the_id_is_the_request_id(targets: Any) -> None:
    ours, theirs = _both(targets, BODY)
    assert ours.json()["id"] == f"chatcmpl-{ours.headers['x-request-id']}"
    assert theirs.json()["id"].startswith("chatcmpl-")
    assert "x-request-id" not in theirs.headers


def test_the_fingerprint_names_the_version(targets: Any) -> None:
    ours, theirs = _both(targets, BODY)
    assert ours.json()["system_fingerprint"] == f"rh-{ours.headers['x-roundhouse-model-version']}"
    assert theirs.json()["system_fingerprint"].startswith("vllm-")


def test_the_platform_adds_its_headers(targets: Any) -> None:
    ours, theirs = _both(targets, BODY)
    added = {"x-request-id", "x-roundhouse-model-version", "x-ratelimit-limit-requests"}
    assert added <= set(ours.headers)
    assert not added & set(theirs.headers)


def test_a_refusal_names_its_code_and_field(targets: Any) -> None:
    ours, theirs = _both(targets, {**BODY, "n": 0})
    assert ours.status_code == theirs.status_code == 400
    assert theirs.json()["error"]["code"] == 400
    assert theirs.json()["error"]["type"] == "BadRequestError"
    error = ours.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["code"], str)
    assert error["param"] == "n"
    assert ours.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", "4"), ("add_special_tokens", "yes"), ("echo", 1)]
)
def test_a_value_of_another_json_type_is_refused(targets: Any, field: str, value: Any) -> None:
    ours, theirs = _both(targets, {**BODY, field: value})
    assert theirs.status_code == 200  # coerced: "4" read as 4, "yes" and 1 as true
    assert ours.status_code == 400
    assert ours.json()["error"]["code"] == "invalid_type"
    assert ours.json()["error"]["param"] == field


@pytest.mark.parametrize("field", ["ignore_eos", "echo", "bad_words", "skip_special_tokens"])
def test_a_null_field_is_read_as_absent(targets: Any, field: str) -> None:
    ours, theirs = _both(targets, {**BODY, field: None})
    assert theirs.status_code == 400  # its request model types these fields without null
    assert f"body.{field}" in theirs.text
    assert ours.status_code == 200, ours.text
    plain = targets.platform.post(CHAT_PATH, json=BODY)
    assert ours.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


@pytest.mark.parametrize(("field", "value"), [("top_k", 2**21), ("repetition_penalty", 1000.0)])
def test_a_sampling_value_past_the_platforms_bound_is_refused(
    targets: Any, field: str, value: Any
) -> None:
    ours, theirs = _both(targets, {**BODY, field: value})
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 400
    assert (ours.json()["error"]["code"], ours.json()["error"]["param"]) == ("invalid_value", field)


def test_include_reasoning_false_is_refused_where_nothing_thinks(targets: Any) -> None:
    """On a model without a reasoning parser there is no thinking to leave out: vLLM's server
    serves the request and drops the logprobs it asked for; the platform refuses it."""
    body = {**BODY, "include_reasoning": False, "logprobs": True}
    ours, theirs = _both(targets, body)
    assert theirs.status_code == 200
    assert theirs.json()["choices"][0]["logprobs"] is None
    assert ours.status_code == 400
    assert ours.json()["error"]["code"] == "unsupported_parameter"
    assert ours.json()["error"]["param"] == "include_reasoning"


def test_a_request_without_a_key_is_refused(targets: Any) -> None:
    ours = httpx.post(f"{targets.platform.base_url}{CHAT_PATH}", json=BODY, timeout=60)
    theirs = targets.vllm.post(CHAT_PATH, json=BODY)
    assert ours.status_code == 401
    assert ours.json()["error"]["code"] == "missing_api_key"
    assert theirs.status_code == 200


def test_max_tokens_is_capped_by_the_tenants_quota(targets: Any) -> None:
    ours, theirs = _both(targets, {**BODY, "max_tokens": ACME_MAX_TOKENS + 1})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["code"] == "max_tokens_exceeded"
    assert ours.json()["error"]["param"] == "max_tokens"


def test_a_request_past_the_context_is_refused_not_cut_short(targets: Any) -> None:
    """vLLM's server cuts max_tokens to what the context has left and answers (a shorter
    answer than asked for, finish_reason length); the platform says the request does not
    fit, as OpenAI's API does, unless the client asked for truncation."""
    long = [{"role": "user", "content": "word " * 2000}]
    body = {**BODY, "messages": long, "max_tokens": ACME_MAX_TOKENS}
    ours, theirs = _both(targets, body)
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["usage"]["completion_tokens"] < ACME_MAX_TOKENS
    assert ours.status_code == 400
    assert ours.json()["error"]["code"] == "context_length_exceeded"
    truncated = targets.platform.post(CHAT_PATH, json={**body, "truncate_prompt_tokens": 1024})
    assert truncated.status_code == 200, truncated.text


def test_more_messages_than_a_request_holds_are_refused(targets: Any) -> None:
    """vLLM's server renders and tokenises any number of messages; the platform refuses more
    than MAX_MESSAGES, which its frontend would read and render for however short each is."""
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(4097)]
    body = {**BODY, "messages": many, "max_tokens": 1}
    ours, theirs = _both(targets, body)
    assert theirs.status_code in (200, 400), theirs.text  # served, or past its context
    if theirs.status_code == 400:
        assert "context" in theirs.text or "maximum" in theirs.text, theirs.text
    assert ours.status_code == 400
    error = ours.json()["error"]
    assert (error["code"], error["param"]) == ("array_above_max_length", "messages")
    assert str(MAX_MESSAGES) in error["message"]
    # As many as it holds are read, and answered as vLLM answers them.
    fewer = targets.platform.post(CHAT_PATH, json={**body, "messages": many[:MAX_MESSAGES]})
    assert fewer.json()["error"]["code"] == "context_length_exceeded", fewer.text


def test_prompt_logprobs_past_the_bound_are_refused(targets: Any) -> None:
    """vLLM's server lists a prompt's log probabilities on every completions choice, however
    many that makes; the platform refuses an answer of more than MAX_PROMPT_LOGPROBS of them,
    which its frontend would build on the event loop every stream shares."""
    body = {
        "model": ALIAS,
        "prompt": "word " * 700,
        "max_tokens": 1,
        "temperature": 1.0,  # no seed: a seeded chunked prefill stops vLLM's CPU engine
        "n": 20,
        "prompt_logprobs": 20,
    }
    ours = targets.platform.post("/v1/completions", json=body)
    theirs = targets.vllm.post("/v1/completions", json=body)
    assert theirs.status_code == 200, theirs.text
    assert len(theirs.json()["choices"]) == 20
    assert ours.status_code == 400, ours.text
    error = ours.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "prompt_logprobs")
    assert str(MAX_PROMPT_LOGPROBS) in error["message"]
    # One choice of the same prompt is within it.
    one = targets.platform.post("/v1/completions", json={**body, "n": 1})
    assert one.status_code == 200, one.text
    assert len(one.json()["choices"][0]["prompt_logprobs"]) == one.json()["usage"]["prompt_tokens"]


def test_legacy_functions_are_tools(targets: Any) -> None:
    body = {
        **BODY,
        "max_tokens": 64,
        "messages": ASK,
        "functions": FUNCTIONS,
        "function_call": {"name": "get_time"},
    }
    ours, theirs = _both(targets, body)
    assert ours.status_code == theirs.status_code == 200
    [call] = ours.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    assert theirs.json()["choices"][0]["message"].get("tool_calls") in (None, [])


def test_a_legacy_function_call_sent_back_is_a_tool_call_and_its_result(targets: Any) -> None:
    """The conversation an older function-calling client sends after a call: vLLM's server
    drops the assistant's `function_call` and writes the `function` message under that role;
    the platform writes them as the tool call and the tool's answer its template knows."""
    called = {"name": "get_time", "arguments": '{"zone": "utc"}'}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "function_call": called},
        {"role": "function", "name": "get_time", "content": "12:00"},
    ]
    body = {**BODY, "messages": messages, "functions": FUNCTIONS, "return_prompt_text": True}
    ours, theirs = _both(targets, body)
    assert ours.status_code == theirs.status_code == 200, ours.text
    prompt, their_prompt = ours.json()["prompt_text"], theirs.json()["prompt_text"]
    assert '"name": "get_time"' in prompt and "<tool_response>\n12:00" in prompt
    assert '"get_time"' not in their_prompt.split("<|im_start|>assistant")[1]
    assert "<|im_start|>function\n12:00" in their_prompt


def test_an_unknown_field_is_refused(targets: Any) -> None:
    ours, theirs = _both(targets, {**BODY, "some_new_option": True})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    error = ours.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", "some_new_option")
    # Inside an object too: a stream option neither OpenAI nor vLLM defines.
    options = {"include_usage": True, "every_n_tokens": 4}
    ours, theirs = _both(targets, {**BODY, "stream": True, "stream_options": options})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "stream_options.every_n_tokens"


def test_a_switch_the_engine_ignores_is_refused(targets: Any) -> None:
    switch = {"structured_outputs": {"choice": ["yes", "no"], "disable_any_whitespace": True}}
    ours, theirs = _both(targets, {**BODY, **switch})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "structured_outputs.disable_any_whitespace"


def test_a_responses_prompt_carries_no_special_tokens_beyond_its_template(targets: Any) -> None:
    body = {"model": ALIAS, "input": "hello", "max_output_tokens": 2, "temperature": 0}
    body["store"] = False
    ours = targets.platform.post("/v1/responses", json=body)
    theirs = targets.vllm.post("/v1/responses", json=body)
    assert ours.status_code == theirs.status_code == 200
    chat = targets.vllm.post(CHAT_PATH, json={**BODY, "max_tokens": 2})
    prompt = chat.json()["usage"]["prompt_tokens"]
    assert ours.json()["usage"]["input_tokens"] == prompt  # as vLLM's own chat renders it
    assert theirs.json()["usage"]["input_tokens"] == prompt + 1  # the tokenizer's BOS on top


def test_responses_top_logprobs_without_the_include_is_refused(targets: Any) -> None:
    body = {"model": ALIAS, "input": "hello", "max_output_tokens": 2, "temperature": 0}
    body.update(store=False, top_logprobs=2)
    ours = targets.platform.post("/v1/responses", json=body)
    theirs = targets.vllm.post("/v1/responses", json=body)
    assert theirs.status_code == 200  # and no log probabilities anywhere
    assert not any(
        part.get("logprobs") for item in theirs.json()["output"] for part in item["content"]
    )
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "top_logprobs"


def test_repetition_detection_past_its_bounds_is_refused(targets: Any) -> None:
    rule = {"max_pattern_size": 33, "min_count": 3}
    ours, theirs = _both(targets, {**BODY, "repetition_detection": rule})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "repetition_detection.max_pattern_size"


def test_a_responses_streams_text_done_event_lists_every_log_probability(targets: Any) -> None:
    body = {"model": ALIAS, "input": "hello", "max_output_tokens": 4, "temperature": 0}
    body.update(store=False, stream=True, include=["message.output_text.logprobs"])

    def events(client: httpx.Client) -> dict[str, dict[str, Any]]:
        with client.stream("POST", "/v1/responses", json=body) as answer:
            assert answer.status_code == 200
            lines = [json.loads(x[6:]) for x in answer.iter_lines() if x.startswith("data: ")]
        return {event["type"]: event for event in lines}

    ours, theirs = events(targets.platform), events(targets.vllm)
    assert theirs["response.output_text.done"]["logprobs"] == []  # vLLM's: the part has them
    final = ours.get("response.incomplete") or ours["response.completed"]
    listed = ours["response.output_text.done"]["logprobs"]
    assert len(listed) == final["response"]["usage"]["output_tokens"] > 0
    assert listed == [
        {"token": lp["token"], "logprob": lp["logprob"], "top_logprobs": []}
        for lp in final["response"]["output"][0]["content"][0]["logprobs"]
    ]


def test_a_count_of_alternatives_beside_logprob_token_ids_is_refused(targets: Any) -> None:
    # vLLM's server lists the sampled token and the ids whatever the count says.
    chat = {**BODY, "logprobs": True, "top_logprobs": 3, "logprob_token_ids": [5, 6]}
    ours, theirs = _both(targets, chat)
    assert theirs.status_code == 200
    tops = theirs.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert {top["token"] for top in tops} >= {"!", '"'}  # the ids', not the 3 likeliest
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "top_logprobs"
    completion = {"model": ALIAS, "prompt": "hello", "max_tokens": 2, "temperature": 0}
    completion.update(logprobs=3, logprob_token_ids=[5, 6])
    ours = targets.platform.post("/v1/completions", json=completion)
    theirs = targets.vllm.post("/v1/completions", json=completion)
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "logprobs"
    # With echo the count is the prompt positions' alternatives: both serve it alike.
    completion["echo"] = True
    ours = targets.platform.post("/v1/completions", json=completion)
    theirs = targets.vllm.post("/v1/completions", json=completion)
    assert ours.status_code == theirs.status_code == 200
    assert ours.json()["choices"][0]["logprobs"] == theirs.json()["choices"][0]["logprobs"]


def test_a_sampling_field_beam_search_drops_is_refused(targets: Any) -> None:
    # vLLM's beam search takes n, max_tokens, temperature, ignore_eos, length_penalty and the
    # output switches; its server answers a top_p (or a stop, a seed...) as if it were absent.
    beam = {**BODY, "n": 2, "use_beam_search": True}
    ours, theirs = _both(targets, {**beam, "top_p": 0.5})
    plain_theirs = targets.vllm.post(CHAT_PATH, json=beam)
    assert theirs.status_code == plain_theirs.status_code == 200
    texts = [choice["message"]["content"] for choice in theirs.json()["choices"]]
    assert texts == [choice["message"]["content"] for choice in plain_theirs.json()["choices"]]
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "top_p"
    # Without beam search nothing ranks beams: vLLM drops a length_penalty, the platform says so.
    ours, theirs = _both(targets, {**BODY, "length_penalty": 0.5})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["param"] == "length_penalty"


def test_a_beam_searchs_cached_tokens_are_zero(targets: Any) -> None:
    beam = {**BODY, "n": 2, "use_beam_search": True}
    ours, theirs = _both(targets, beam)
    assert ours.status_code == theirs.status_code == 200
    assert theirs.json()["usage"].get("prompt_tokens_details") is None
    assert ours.json()["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": 0,
    }


def test_a_batch_answer_details_its_usage(targets: Any, thinking_targets: Any) -> None:
    """vLLM's batch chat leaves out the usage's details; the platform counts each conversation's
    cached (and a reasoning model's thinking) tokens as vLLM's chat server counts them alone."""
    batch: dict[str, Any] = {**BODY, "messages": [LONG, LONG, HELLO]}
    for _ in range(2):  # the second finds the long prefix in both engines' caches
        ours = _batch_and_alone(targets, batch, "prompt_tokens_details")
    assert ours["prompt_tokens_details"]["cached_tokens"] == ours["alone"]["cached_tokens"] > 0
    thinking = {**BODY, **THINK, "model": THINKING, "messages": [HELLO, ASK]}
    ours = _batch_and_alone(thinking_targets, thinking, "completion_tokens_details")
    counted = ours["completion_tokens_details"]["reasoning_tokens"]
    assert counted == ours["alone"]["reasoning_tokens"] > 0


def _batch_and_alone(targets: Any, batch: dict[str, Any], details: str) -> dict[str, Any]:
    """The platform's batch usage, with `alone`: the details vLLM's chat server gives each
    conversation sent alone, added up (its batch server gives none)."""
    ours = targets.platform.post(BATCH_PATH, json=batch)
    theirs = targets.vllm.post(BATCH_PATH, json=batch)
    assert ours.status_code == theirs.status_code == 200
    assert theirs.json()["usage"].get(details) is None
    alone: dict[str, int] = {}
    for conversation in batch["messages"]:
        answer = targets.vllm.post(CHAT_PATH, json={**batch, "messages": conversation}).json()
        for key, value in answer["usage"][details].items():
            alone[key] = alone.get(key, 0) + (value or 0)
    return {**ours.json()["usage"], "alone": alone}


def test_a_batch_refuses_what_its_answer_has_no_place_for(targets: Any) -> None:
    """vLLM's batch chat drops tools and prompt log probabilities without a word, and answers a
    stream with its last tokens alone as a whole answer; the platform refuses each."""
    for field, value in [
        ("stream", True),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("prompt_logprobs", 1),
        ("return_prompt_text", True),
    ]:
        body = {**BODY, "messages": [HELLO], field: value}
        ours = targets.platform.post(BATCH_PATH, json=body)
        theirs = targets.vllm.post(BATCH_PATH, json=body)
        assert theirs.status_code == 200, field
        assert theirs.json().get("prompt_logprobs") is None
        assert ours.status_code == 400, field
        assert ours.json()["error"]["param"] == field
    # The stream vLLM's server answers: one token of the four, as a whole chat completion.
    streamed = targets.vllm.post(BATCH_PATH, json={**BODY, "messages": [HELLO], "stream": True})
    assert streamed.json()["usage"]["completion_tokens"] < BODY["max_tokens"]


# --- Anthropic's Messages API (/v1/messages) ---

MESSAGES_PATH = "/v1/messages"
MESSAGE = {"model": ALIAS, "messages": HELLO, "temperature": 0, "max_tokens": 4}


def _both_messages(
    targets: Any, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[httpx.Response, httpx.Response]:
    return (
        targets.platform.post(MESSAGES_PATH, json=body, headers=headers),
        targets.vllm.post(MESSAGES_PATH, json=body, headers=headers),
    )


def test_a_messages_id_is_the_request_id(targets: Any) -> None:
    ours, theirs = _both_messages(targets, MESSAGE)
    assert ours.json()["id"] == f"msg_{ours.headers['x-request-id']}"
    assert theirs.json()["id"].startswith("chatcmpl-")


def test_every_messages_refusal_is_in_anthropics_shape(targets: Any) -> None:
    ours, theirs = _both_messages(targets, {**MESSAGE, "max_tokens": 0})
    assert ours.status_code == theirs.status_code == 400
    # vLLM's server answers a body its request model refuses in OpenAI's shape.
    assert "type" not in theirs.json() and theirs.json()["error"]["code"] == 400
    assert ours.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": ours.json()["error"]["message"],
            "code": "invalid_value",
            "param": "max_tokens",
        },
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"thinking": {"type": "adaptive", "display": "updates"}},
        {"system": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]},
        {"container": "c"},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "thinking", "thinking": "x"}],
                        }
                    ],
                }
            ]
        },
    ],
    ids=[
        "thinking-display-updates",
        "non-text-system-block",
        "unknown-field",
        "tool-result-thinking",
    ],
)
def test_a_messages_field_that_would_be_dropped_is_refused(
    targets: Any, fields: dict[str, Any]
) -> None:
    ours, theirs = _both_messages(targets, {**MESSAGE, **fields})
    assert theirs.status_code == 200
    assert ours.status_code == 400
    assert ours.json()["error"]["code"] in ("unsupported_parameter", "invalid_value")


def test_omitted_thinking_comes_without_its_text(thinking_targets: Any) -> None:
    body = {
        **MESSAGE,
        "model": THINKING,
        "max_tokens": 16,
        "thinking": {"type": "adaptive", "display": "omitted"},
    }
    ours, theirs = _both_messages(thinking_targets, body)
    assert ours.status_code == theirs.status_code == 200
    # vLLM's server drops `display` and shows the thinking; the platform answers as
    # Anthropic's API does: the block and its signature, no text, its tokens still counted.
    [their_thinking] = [b for b in theirs.json()["content"] if b["type"] == "thinking"]
    [our_thinking] = [b for b in ours.json()["content"] if b["type"] == "thinking"]
    assert their_thinking["thinking"] and our_thinking["thinking"] == ""
    assert our_thinking["signature"]
    assert ours.json()["usage"]["output_tokens"] == theirs.json()["usage"]["output_tokens"]


def test_an_idempotency_key_on_messages_replays_the_first_answer(targets: Any) -> None:
    # vLLM's server ignores the header and runs the message again; the platform answers the
    # first message again, as on chat.
    headers = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    ours, theirs = _both_messages(targets, MESSAGE, headers=headers)
    assert ours.status_code == theirs.status_code == 200
    again, _ = _both_messages(targets, MESSAGE, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == ours.json()


def test_an_assistant_message_keeps_every_output_text_part(targets: Any) -> None:
    def turns(*texts: str) -> list[dict[str, Any]]:
        parts = [{"type": "output_text", "text": text, "annotations": []} for text in texts]
        answer = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
        return [HELLO[0], {**answer, "content": parts}, {"role": "user", "content": "again"}]

    def vllms(*texts: str) -> int:
        body = {"model": ALIAS, "input": turns(*texts), "max_output_tokens": 1}
        answer = targets.vllm.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["input_tokens"])

    def ours(*texts: str) -> int:
        body = {"model": ALIAS, "input": turns(*texts)}
        counted = targets.platform.post("/v1/responses/input_tokens", json=body)
        assert counted.status_code == 200, counted.text
        return int(counted.json()["input_tokens"])

    special = len(
        targets.vllm.post(
            "/tokenize", json={"model": ALIAS, "prompt": "", "add_special_tokens": True}
        ).json()["tokens"]
    )
    # vLLM's server reads an output message's first part only: the second changes nothing.
    assert vllms("one", "two") == vllms("one")
    assert ours("one") == vllms("one") - special  # its BOS: the row on the prompt
    assert ours("one", "two") > ours("one")


def test_tokenize_refuses_what_a_chat_request_refuses_or_would_drop(targets: Any) -> None:
    refused: dict[str, dict[str, Any]] = {
        "prompt": {"prompt": "hi", "messages": HELLO},
        "messages[0].role": {"messages": [{"role": "robot", "content": "hi"}]},
        "tools": {"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]},
    }
    for param, fields in refused.items():
        body = {"model": ALIAS, **fields}
        theirs = targets.vllm.post("/tokenize", json=body)
        assert theirs.status_code == 200, theirs.text
        ours = targets.platform.post("/tokenize", json=body)
        assert ours.status_code == 400, ours.text
        assert ours.json()["error"]["param"] == param


def test_content_parts_that_are_all_plain_strings_are_read_as_text_parts(targets: Any) -> None:
    strings = [{"role": "user", "content": ["hel", "lo"]}]
    objects = [{"role": "user", "content": [{"type": "text", "text": t} for t in ("hel", "lo")]}]
    for path, extra in (("/tokenize", {}), (CHAT_PATH, {"max_tokens": 1})):
        body = {"model": ALIAS, "messages": strings, **extra}
        assert targets.vllm.post(path, json=body).status_code == 400
    ours = targets.platform.post("/tokenize", json={"model": ALIAS, "messages": strings})
    assert ours.status_code == 200, ours.text
    theirs = targets.vllm.post("/tokenize", json={"model": ALIAS, "messages": objects})
    assert ours.json()["tokens"] == theirs.json()["tokens"]
    ours, theirs = (
        target.post(CHAT_PATH, json={**BODY, "messages": messages, "max_tokens": 1})
        for target, messages in ((targets.platform, strings), (targets.vllm, objects))
    )
    assert ours.status_code == 200, ours.text
    assert ours.json()["usage"]["prompt_tokens"] == theirs.json()["usage"]["prompt_tokens"]


def test_detokenize_refuses_a_token_past_the_vocabulary(targets: Any) -> None:
    body = {"model": ALIAS, "tokens": [2430, 1 << 30]}
    theirs = targets.vllm.post("/detokenize", json=body)
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["prompt"] == "user"  # the known token's text, the other dropped
    ours = targets.platform.post("/detokenize", json=body)
    assert ours.status_code == 400, ours.text
    assert ours.json()["error"]["param"] == "tokens[1]"
