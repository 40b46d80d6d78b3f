"""The Responses API through the official openai SDK, on the real stack.

Create (whole and streamed), retrieve, chain turns with previous_response_id, a function tool
round trip, json_schema output, delete, input items a page at a time, and another tenant's
ids answered as absent. The demo model is trained to close JSON and tool calls, so a forced
tool choice or a JSON schema ends on its own, well inside max_output_tokens.
"""

from __future__ import annotations

import json
import math
import re
import signal
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from tests.conftest import ALIAS, ENCODER, _free_port, _http_ok, _spawn, _wait_for, roomy_key

TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "strict": True,
}

VERDICT: Any = {
    "format": {
        "type": "json_schema",
        "name": "verdict",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        "strict": True,
    }
}


@pytest.fixture
def sdk(stack, world):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)


@pytest.fixture
def other(stack, world):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.globex_key, max_retries=0)


def _ask(sdk, **fields):
    return sdk.responses.create(model=ALIAS, max_output_tokens=8, temperature=0, **fields)


def test_a_response_is_created_stored_and_retrieved(sdk, world, usage_of):
    raw = sdk.responses.with_raw_response.create(
        model=ALIAS,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=6,
        temperature=0,
        metadata={"team": "yard"},
    )
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed"  # the demo model greets back and ends its turn
    assert response.incomplete_details is None
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text and response.output_text
    assert 0 < response.usage.output_tokens < 6
    assert response.usage.input_tokens > 0
    assert response.metadata == {"team": "yard"} and response.instructions == "Be brief."
    kept = sdk.responses.retrieve(response.id)
    assert kept.model_dump() == response.model_dump()
    [record] = usage_of(raw.headers["x-request-id"])
    assert record.completion_tokens == response.usage.output_tokens
    assert record.prompt_tokens == response.usage.input_tokens
    assert record.endpoint == "responses"  # the console's request view names the API


@pytest.fixture(scope="module")
def unended(demo_model_dir: Path) -> dict[str, Any]:
    """A logit_bias away from the turn's end token, for a response cut by max_output_tokens.

    The demo model is trained where the tests run, and what it answers a prompt may differ by
    machine (another processor's float arithmetic trains other weights): such a test does not
    leave it to the model to run that long. Unlike ignore_eos, no end token comes among the
    answer's log probabilities.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))
    return {"logit_bias": {str(tokenizer.token_to_id("<|im_end|>")): -100}}


def test_a_streamed_response_sends_openais_events_in_order(sdk, unended):
    # The SDK's stream helper wants `response.completed`; a response cut by
    # max_output_tokens ends with `response.incomplete` (as OpenAI's do), so read the events.
    events = list(
        sdk.responses.create(
            model=ALIAS,
            input="Count.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
            extra_body=unended,
        )
    )
    final = events[-1].response
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and final.usage.output_tokens == 8
    assert sdk.responses.retrieve(final.id).output_text == deltas


def test_the_output_texts_logprobs_come_whole_streamed_and_stored_as_the_sdk_reads_them(
    sdk, unended
):
    asked = {"include": ["message.output_text.logprobs"], "top_logprobs": 2, "extra_body": unended}
    whole = _ask(sdk, input="Count.", **asked)
    (part,) = whole.output[0].content
    assert len(part.logprobs) == whole.usage.output_tokens == 8
    assert "".join(lp.token for lp in part.logprobs) == whole.output_text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)
    assert whole.top_logprobs == 2
    events = list(
        sdk.responses.create(
            model=ALIAS, input="Count.", max_output_tokens=8, temperature=0, stream=True, **asked
        )
    )
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    final = events[-1].response
    assert [lp.token for lp in streamed] == [lp.token for lp in done.logprobs]
    assert [(lp.token, lp.logprob) for lp in final.output[0].content[0].logprobs] == [
        (lp.token, lp.logprob) for lp in part.logprobs
    ]
    kept = sdk.responses.retrieve(final.id).output[0].content[0].logprobs
    assert [lp.token for lp in kept] == [lp.token for lp in part.logprobs]


def test_three_chained_turns_carry_the_history(sdk):
    first = _ask(sdk, input="My name is Ada.")
    second = _ask(sdk, input="What is my name?", previous_response_id=first.id)
    third = _ask(sdk, input="Say it again.", previous_response_id=second.id)
    # Each turn's prompt holds the turns before it: their input and their answer.
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    assert third.previous_response_id == second.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_function_tool_round_trip(sdk):
    called = sdk.responses.create(
        model=ALIAS,
        input="What time is it in Paris?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=48,
        temperature=0,
    )
    [call] = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_time" and call.call_id
    assert json.loads(call.arguments)["zone"] in ("utc", "cet")  # the engine kept the schema
    answered = sdk.responses.create(
        model=ALIAS,
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}],
        tools=[TOOL],
        max_output_tokens=8,
        temperature=0,
    )
    assert answered.output[0].type == "message" and answered.output_text
    assert answered.usage.input_tokens > called.usage.input_tokens


def test_a_json_schema_format_is_kept(sdk):
    response = sdk.responses.create(
        model=ALIAS,
        input="Rate it.",
        text=VERDICT,
        max_output_tokens=24,
        temperature=0,
    )
    assert json.loads(response.output_text)["answer"] in ("yes", "no")
    assert response.status == "completed"
    assert response.text.format.type == "json_schema"


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


def test_the_sdks_parse_gives_the_answer_as_a_pydantic_model(sdk):
    response = sdk.responses.parse(
        model=ALIAS,
        input="Is a queue a list?",
        text_format=Verdict,
        max_output_tokens=32,
        temperature=0,
    )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Verdict)
    assert response.output_parsed == Verdict.model_validate_json(response.output_text)


def test_a_json_object_format_gives_a_json_object(sdk):
    response = sdk.responses.create(
        model=ALIAS,
        input="hello",
        text={"format": {"type": "json_object"}},
        temperature=0,
        max_output_tokens=64,
    )
    assert response.status == "completed"
    assert isinstance(json.loads(response.output_text), dict)


def test_a_repeated_long_prompt_reports_its_cached_tokens(sdk, usage_of):
    instructions = f"Session {time.time_ns()}. You answer briefly. " + "Keep it short. " * 80

    def ask() -> Any:
        return sdk.responses.with_raw_response.create(
            model=ALIAS, input="hello", instructions=instructions, max_output_tokens=2,
            temperature=0,
        )  # fmt: skip

    first, second = ask(), ask()
    usage = second.parse().usage
    cached = usage.input_tokens_details.cached_tokens
    # The prefix cache serves whole blocks, and never the last prompt token.
    assert 0 < cached < usage.input_tokens
    earlier = first.parse().usage.input_tokens_details
    assert earlier.cached_tokens < cached
    # What the second found cached, the first computed and wrote to the cache (vLLM's
    # cache_write_tokens, beyond OpenAI's fields); the second wrote none of those again.
    assert earlier.cache_write_tokens >= cached - earlier.cached_tokens
    assert usage.input_tokens_details.cache_write_tokens <= usage.input_tokens - cached
    [record] = usage_of(second.headers["x-request-id"])
    assert (record.prompt_tokens, record.cached_tokens) == (usage.input_tokens, cached)


def test_delete_then_retrieve_is_a_404(sdk):
    response = _ask(sdk, input="Forget me.")
    deleted = sdk.responses.delete(response.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        _ask(sdk, input="And now?", previous_response_id=response.id)


def test_input_items_come_a_page_at_a_time(sdk):
    response = _ask(
        sdk,
        input=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ],
    )
    newest_first = sdk.responses.input_items.list(response.id, limit=3)
    assert [item.content[0].text for item in newest_first.data] == ["three", "two", "one"]
    assert newest_first.has_more
    rest = sdk.responses.input_items.list(response.id, limit=3, after=newest_first.last_id)
    assert [item.content[0].text for item in rest.data] == ["Be brief."] and not rest.has_more
    everything = list(sdk.responses.input_items.list(response.id, limit=1, order="asc"))
    assert [item.content[0].text for item in everything] == ["Be brief.", "one", "two", "three"]


def test_another_tenants_response_is_absent_and_unchanged(sdk, other):
    response = _ask(sdk, input="Mine.")
    background = sdk.responses.create(
        model=ALIAS, input="Mine too.", background=True, max_output_tokens=8
    )
    with pytest.raises(openai.NotFoundError):
        other.responses.cancel(background.id)
    with pytest.raises(openai.NotFoundError):
        list(other.responses.retrieve(background.id, stream=True))
    assert _until(sdk, background.id, "completed", "incomplete").status != "cancelled"
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as chained:
        _ask(other, input="Yours?", previous_response_id=response.id)
    assert chained.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as counted:
        other.responses.input_tokens.count(
            model=ALIAS, input="Yours?", previous_response_id=response.id
        )
    assert counted.value.param == "previous_response_id"
    assert sdk.responses.retrieve(response.id).output_text == response.output_text


def test_store_false_is_not_kept(sdk):
    response = _ask(sdk, input="Do not keep this.", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "hi", "background": True, "store": False}, "store"),
        ({"input": "hi", "truncation": "sideways"}, "truncation"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "reasoning": {"effort": "high", "summary": "auto"}}, "reasoning.summary"),
        ({"input": "hi", "reasoning": {"effort": "loud"}}, "reasoning.effort"),
        ({"input": "hi", "include": ["reasoning.encrypted_content"]}, "include[0]"),
        ({"input": "hi", "top_logprobs": 3}, "top_logprobs"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": "hi", "colour": "red"}, "colour"),
        ({}, "input"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(stack, world, fields, param):
    response = httpx.post(
        f"{stack.base_url}/v1/responses",
        json={"model": ALIAS, **fields},
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_streamed_function_call_sends_its_arguments_in_pieces(sdk):
    events = list(
        sdk.responses.create(
            model=ALIAS,
            input="What time is it in Paris?",
            tools=[TOOL],
            tool_choice={"type": "function", "name": "get_time"},
            max_output_tokens=48,
            temperature=0,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = events[-3]
    assert done.name == "get_time" and pieces == done.arguments
    assert json.loads(done.arguments)["zone"] in ("utc", "cet")
    [call] = events[-1].response.output
    assert call.arguments == done.arguments and call.status == "completed"


# --- background responses ---------------------------------------------------------------------

LONG: dict[str, Any] = {"max_output_tokens": 160, "extra_body": {"ignore_eos": True}}


def _until(sdk, response_id: str, *statuses: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        response = sdk.responses.retrieve(response_id)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def test_a_background_response_is_queued_then_polled_to_its_end(sdk, usage_of):
    raw = sdk.responses.with_raw_response.create(
        model=ALIAS, input="Take your time.", background=True, temperature=0, **LONG
    )
    accepted = raw.parse()
    assert accepted.status == "queued" and accepted.background is True
    done = _until(sdk, accepted.id, "completed", "incomplete", "failed")
    assert done.status == "incomplete" and done.usage.output_tokens == 160
    [record] = usage_of(raw.headers["x-request-id"])
    assert record.completion_tokens == 160  # one usage record, as for chat
    assert record.priority == "interactive"  # interactive work, not the batch class
    events = list(sdk.responses.retrieve(accepted.id, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == done.output_text


def test_a_background_response_is_cancelled(sdk, usage_of):
    raw = sdk.responses.with_raw_response.create(
        model=ALIAS, input="Go on and on.", background=True, max_output_tokens=200,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    accepted = raw.parse()
    cancelled = sdk.responses.cancel(accepted.id)  # queued, or a few tokens in
    assert cancelled.status == "cancelled"
    assert sdk.responses.retrieve(accepted.id).status == "cancelled"
    assert sdk.responses.cancel(accepted.id).status == "cancelled"  # once ended, as it is
    [record] = usage_of(raw.headers["x-request-id"])
    assert record.status == "cancelled" and record.completion_tokens < 200


def test_only_a_background_response_is_cancelled_or_streamed_again(sdk):
    response = _ask(sdk, input="Not in the background.")
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(response.id)
    with pytest.raises(openai.BadRequestError):
        list(sdk.responses.retrieve(response.id, stream=True))


@pytest.fixture
def second_frontend(stack, tmp_path):
    port = _free_port()
    frontend = _spawn(
        "frontend-responses",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(frontend, lambda: _http_ok(f"{base_url}/healthz"), timeout=120)
        yield frontend, base_url
    finally:
        if frontend.popen.poll() is None:
            frontend.popen.kill()
        frontend.popen.wait(timeout=30)


def test_a_background_response_outlives_the_frontend_that_accepted_it(
    sdk, stack, world, second_frontend, usage_of
):
    frontend, base_url = second_frontend
    doomed = openai.OpenAI(base_url=f"{base_url}/v1", api_key=world.acme_key, max_retries=0)
    finished = _ask(doomed, input="Kept in the store.")  # a response that ended there
    raw = doomed.responses.with_raw_response.create(
        model=ALIAS, input="Outlive it.", background=True, temperature=0, **LONG
    )
    accepted = raw.parse()
    # Running (on a fast machine it may have ended already: then its end is in the store).
    assert _until(sdk, accepted.id, "in_progress", "incomplete").status != "queued"
    # The worker's loop holds the rest of the tokens while the frontend dies (no goodbye: its
    # follower dies with it), so nothing of the end reaches the store from there.
    worker = stack.worker.popen
    worker.send_signal(signal.SIGSTOP)
    try:
        frontend.popen.send_signal(signal.SIGKILL)
        frontend.popen.wait(timeout=30)
    finally:
        worker.send_signal(signal.SIGCONT)
    # Nothing its frontend stored is lost with it.
    assert sdk.responses.retrieve(finished.id).output_text == finished.output_text
    # Another frontend reads where it stands, and ends it in the store once it has ended.
    done = _until(sdk, accepted.id, "completed", "incomplete", "failed")
    assert done.status == "incomplete" and done.usage.output_tokens == 160
    [record] = usage_of(raw.headers["x-request-id"])
    assert record.completion_tokens == 160
    # Its stream resumes on this frontend: every event after the one asked for, once.
    events = list(sdk.responses.retrieve(accepted.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in events] == list(range(4, 4 + len(events)))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == done.output_text


def test_the_sweep_ends_an_orphan_nobody_polls(
    sdk, stack, world, second_frontend, usage_of, django_db_blocker
):
    from inference.models import StoredResponse
    from inference.tasks import responses_orphans_finish

    frontend, base_url = second_frontend
    doomed = openai.OpenAI(base_url=f"{base_url}/v1", api_key=world.acme_key, max_retries=0)
    worker = stack.worker.popen
    worker.send_signal(signal.SIGSTOP)  # it claims nothing until the frontend is gone
    try:
        raw = doomed.responses.with_raw_response.create(
            model=ALIAS, input="Nobody asks.", background=True, temperature=0, **LONG
        )
        frontend.popen.send_signal(signal.SIGKILL)
        frontend.popen.wait(timeout=30)
    finally:
        worker.send_signal(signal.SIGCONT)
    accepted = raw.parse()
    [record] = usage_of(raw.headers["x-request-id"])  # the request ran to its end
    with django_db_blocker.unblock():
        row = StoredResponse.objects.get(pk=accepted.id)
        assert row.status == "queued"  # nothing ended it: its frontend died first
        assert responses_orphans_finish(older_than=0) >= 1
        row.refresh_from_db()
        assert row.status == "incomplete"
    done = sdk.responses.retrieve(accepted.id)
    assert done.usage.output_tokens == record.completion_tokens == 160


# --- the same answer as chat completions --------------------------------------------------------


@pytest.mark.parametrize("seed", [None, 7])
def test_plain_text_is_chats_text(sdk, seed):
    sampling: dict = {"temperature": 0} if seed is None else {"temperature": 0.9}
    extra = {} if seed is None else {"seed": seed}
    chat = sdk.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}],
        max_tokens=12,
        extra_body=extra,
        **sampling,
    )
    response = sdk.responses.create(
        model=ALIAS,
        instructions="Be brief.",
        input="Hi.",
        max_output_tokens=12,
        extra_body=extra,
        **sampling,
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_function_calls_are_chats_calls(sdk, stream):
    chat = sdk.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "What time is it in Paris?"}],
        tools=[
            {
                "type": "function",
                "function": {k: TOOL[k] for k in ("name", "description", "parameters", "strict")},
            }
        ],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
    )
    request = {
        "model": ALIAS,
        "input": "What time is it in Paris?",
        "tools": [TOOL],
        "tool_choice": "required",
        "max_output_tokens": 48,
        "temperature": 0,
    }
    if stream:
        response = list(sdk.responses.create(stream=True, **request))[-1].response
    else:
        response = sdk.responses.create(**request)
    calls = [item for item in response.output if item.type == "function_call"]
    expected = chat.choices[0].message.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in expected
    ]
    assert response.usage.output_tokens == chat.usage.completion_tokens


@pytest.mark.parametrize("store", [True, False])
def test_a_retry_with_its_idempotency_key_gets_the_first_response(sdk, usage_of, store):
    key = f"resp-retry-{store}-{time.time_ns()}"
    fields = {"input": "Once only.", "store": store}
    first = sdk.responses.with_raw_response.create(
        model=ALIAS,
        max_output_tokens=8,
        temperature=0.9,
        extra_headers={"Idempotency-Key": key},
        **fields,
    )
    again = sdk.responses.with_raw_response.create(
        model=ALIAS,
        max_output_tokens=8,
        temperature=0.9,
        extra_headers={"Idempotency-Key": key},
        **fields,
    )
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["x-request-id"] == first.headers["x-request-id"]
    assert again.parse().id == first.parse().id
    assert again.parse().output_text == first.parse().output_text
    assert len(usage_of(first.headers["x-request-id"])) == 1  # ran, and was billed, once
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.responses.create(
            model=ALIAS,
            max_output_tokens=8,
            input="Something else.",
            extra_headers={"Idempotency-Key": key},
        )


def test_truncation_auto_drops_the_oldest_turns_until_the_conversation_fits(sdk):
    chatter = " ".join(f"word{i}" for i in range(120))
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {chatter}"}
        for i in range(40)
    ]
    turns.append({"role": "user", "content": "And the last question?"})
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(sdk, input=turns)
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.param == "input"
    response = _ask(sdk, input=turns, instructions="Be brief.", truncation="auto")
    # Answered, whether the model finished within 8 tokens or not: what matters is the cut.
    assert response.status in ("completed", "incomplete") and response.truncation == "auto"
    assert 0 < response.usage.input_tokens + 8 <= 2048  # it fits the tiny model's context
    # What was kept is the newest part: the instructions, then the turns up to the question.
    assert response.usage.input_tokens > 500


def _renders(stack: Any) -> dict[str, float]:
    """How many conversations the frontend's chat templates rendered so far, by where."""
    found = {"loop": 0.0, "thread": 0.0}
    for family in text_string_to_metric_families(httpx.get(f"{stack.base_url}/metrics").text):
        for sample in family.samples:
            if sample.name == "roundhouse_prompt_renders_total":
                found[sample.labels["on"]] += sample.value
    return found


def test_truncating_many_short_turns_renders_a_few_times_off_the_event_loop(stack, sdk):
    """1,200 one-letter turns once froze every tenant's requests for seconds: truncation
    dropped one turn and rendered the rest again, on the event loop, until they fit. The cut is
    now searched for in a few renders, on the preprocessing threads."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(1200)]
    bound = 2 * math.log2(len(turns)) + 4  # the search's renders, and the prompt's own
    before = _renders(stack)
    response = _ask(sdk, input=turns, truncation="auto")
    assert response.status in ("completed", "incomplete")
    assert 0 < response.usage.input_tokens + 8 <= 2048
    after = _renders(stack)
    assert after["loop"] == before["loop"]
    assert 0 < after["thread"] - before["thread"] <= bound
    counted = sdk.responses.input_tokens.count(model=ALIAS, input=turns, truncation="auto")
    # A count keeps room for one output token, the response kept room for its eight.
    assert response.usage.input_tokens <= counted.input_tokens < 2048
    again = _renders(stack)
    assert again["loop"] == after["loop"] and 0 < again["thread"] - after["thread"] <= bound


def test_a_count_is_the_input_tokens_of_the_response_the_same_fields_create(sdk):
    fields: dict[str, Any] = {"input": "My name is Ada.", "instructions": "Be brief."}
    first = _ask(sdk, **fields)
    counted = sdk.responses.input_tokens.count(model=ALIAS, **fields)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == first.usage.input_tokens
    # A chained turn counts the turns before it, as its response's prompt holds them.
    chained: dict[str, Any] = {"input": "What is my name?", "previous_response_id": first.id}
    second_count = sdk.responses.input_tokens.count(model=ALIAS, **chained)
    assert second_count.input_tokens == _ask(sdk, **chained).usage.input_tokens
    # Tools are written into the prompt by the template.
    tooled = sdk.responses.input_tokens.count(model=ALIAS, tools=[TOOL], **fields)
    called = _ask(sdk, tools=[TOOL], tool_choice="required", **fields)
    assert tooled.input_tokens == called.usage.input_tokens > counted.input_tokens


def test_a_count_with_truncation_auto_counts_what_fits_the_context(sdk):
    chatter = " ".join(f"word{i}" for i in range(120))
    turns = [{"role": "user", "content": f"{i}: {chatter}"} for i in range(40)]
    whole = sdk.responses.input_tokens.count(model=ALIAS, input=turns)
    assert whole.input_tokens > 2048  # past the tiny model's context: counted all the same
    kept = sdk.responses.input_tokens.count(model=ALIAS, input=turns, truncation="auto")
    assert 500 < kept.input_tokens <= 2048


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"input": "hi", "max_output_tokens": 8}, 400, "max_output_tokens"),
        ({"input": "hi", "stream": True}, 400, "stream"),
        ({"input": "hi", "conversation": "conv_none"}, 404, "conversation"),
        ({"input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role"),
        ({}, 400, "input"),
        ({"input": "hi", "model": "no-such-model"}, 404, "model"),
        ({"input": "hi", "previous_response_id": "resp_none"}, 404, "previous_response_id"),
    ],
)
def test_a_bad_count_is_refused_naming_the_field(stack, world, fields, status, param):
    response = httpx.post(
        f"{stack.base_url}/v1/responses/input_tokens",
        json={"model": ALIAS, **fields},
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_an_embedding_model_has_no_responses_to_count(stack, world, encoder):
    response = httpx.post(
        f"{stack.base_url}/v1/responses/input_tokens",
        json={"model": ENCODER, "input": "hi"},
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("wrong_endpoint_for_model", "model")


def test_a_background_response_that_ends_on_its_own_is_completed(sdk):
    accepted = sdk.responses.create(
        model=ALIAS,
        input="Rate it.",
        background=True,
        temperature=0,
        max_output_tokens=48,
        text=VERDICT,
    )
    done = _until(sdk, accepted.id, "completed", "incomplete", "failed")
    assert done.status == "completed" and done.completed_at is not None
    assert json.loads(done.output_text)["answer"] in ("yes", "no")


def test_the_tenants_safety_pack_stops_a_response_live(sdk, stack, world, django_db_blocker):
    from tests.e2e.test_safety import _tenant_with_pack

    asked: dict[str, Any] = {
        "input": "Tell me about the yard",
        "max_output_tokens": 96,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    full = sdk.responses.create(model=ALIAS, **asked).output_text
    words = [m for m in re.finditer(r"\b[A-Za-z]{4,}\b", full) if m.start() >= 24]
    assert words, full
    term = next(m.group() for m in words if full.lower().find(m.group().lower()) == m.start())
    with django_db_blocker.unblock():
        _, key = _tenant_with_pack("responses-guarded", deny_terms=[term])
    guarded = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    events = list(guarded.responses.create(model=ALIAS, stream=True, **asked))
    stopped = events[-1].response
    assert events[-1].type == "response.incomplete"
    assert stopped.incomplete_details.reason == "content_filter"
    assert term.lower() not in stopped.output_text.lower() and full.startswith(stopped.output_text)
    # In the background the same pack reads the same text: the stored answer is filtered too.
    accepted = guarded.responses.create(model=ALIAS, background=True, **asked)
    done = _until(guarded, accepted.id, "completed", "incomplete", "failed")
    assert done.incomplete_details.reason == "content_filter"
    assert term.lower() not in done.output_text.lower()


def test_budgets_and_deadlines_refuse_a_response_as_they_refuse_chat(stack, world, usage_of):
    def both(key: str, headers: dict[str, str], **fields: Any) -> list[httpx.Response]:
        auth = {"Authorization": f"Bearer {key}", **headers}
        chat = {"messages": [{"role": "user", "content": "Once"}], "max_tokens": 160}
        responses = {"input": "Once", "max_output_tokens": 160}
        return [
            httpx.post(
                f"{stack.base_url}{path}",
                json={"model": ALIAS, **body, **fields},
                headers=auth,
                timeout=60,
            )
            for path, body in (("/v1/chat/completions", chat), ("/v1/responses", responses))
        ]

    # A tenant with no budget left: refused before admission, the same way.
    broke = both(world.limited_keys["umbrella"], {})
    assert broke[0].status_code == broke[1].status_code == 429
    assert broke[0].json()["error"]["code"] == broke[1].json()["error"]["code"]
    # A client's deadline that passes mid-generation ends both, billed for what was made.
    late = both(world.globex_key, {"x-request-timeout": "0.05"}, ignore_eos=True)
    assert late[0].status_code == late[1].status_code == 503
    assert late[1].json()["error"]["code"] == "deadline_exceeded"
    [record] = usage_of(late[1].headers["x-request-id"])
    assert record.status == "timeout" and record.endpoint == "responses"


def test_the_consoles_request_view_names_the_responses_api(sdk, world, usage_of, django_db_blocker):
    from django.test import Client

    raw = sdk.responses.with_raw_response.create(model=ALIAS, input="Seen?", max_output_tokens=4)
    [record] = usage_of(raw.headers["x-request-id"])
    with django_db_blocker.unblock():
        admin = Client()
        admin.force_login(world.alice)
        page = admin.get("/console/t/acme/requests").content.decode()
    row = next(line for line in page.splitlines() if record.request_id[:13] in line)
    assert "<td>responses</td>" in row


def test_reads_of_responses_and_requests_count_against_the_requests_per_minute(
    stack, django_db_blocker
):
    with django_db_blocker.unblock():
        key = roomy_key("read-counted", requests_per_minute=2)
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        created = client.post(
            "/v1/responses",
            json={"model": ALIAS, "input": "Hi", "max_output_tokens": 2},
            headers=auth,
        )
        assert created.status_code == 200, created.text
        response_id, rid = created.json()["id"], created.headers["x-request-id"]
        assert client.get(f"/v1/responses/{response_id}", headers=auth).status_code == 200
        # The tenant's two requests this minute are spent: every keyed call now gets its 429,
        # reads included, before it reads anything.
        for method, path in (
            ("GET", f"/v1/responses/{response_id}"),
            ("GET", f"/v1/responses/{response_id}/input_items"),
            ("POST", f"/v1/responses/{response_id}/cancel"),
            ("DELETE", f"/v1/responses/{response_id}"),
            ("GET", f"/v1/requests/{rid}/stream"),
            ("POST", f"/v1/requests/{rid}/cancel"),
            ("GET", "/v1/models"),
            ("GET", f"/v1/models/{ALIAS}"),
        ):
            refused = client.request(method, path, headers=auth)
            assert refused.status_code == 429, (method, path, refused.text)
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert int(refused.headers["Retry-After"]) >= 1
