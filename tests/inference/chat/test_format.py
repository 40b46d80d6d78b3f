"""Answers shaped as OpenAI's (and vLLM's server) shape them: choices, tool calls, logprobs."""

from __future__ import annotations

import json

import msgspec

from dataplane.types import (
    Delta,
    Finished,
    RankedLogprob,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from inference.body.fields import CHAT, COMPLETIONS
from inference.chat.format import Formatter, Shape


def _formatter(endpoint: str, **shape: object) -> Formatter:
    return Formatter(
        endpoint=endpoint,
        request_id="r1",
        model="m@v",
        created=1,
        fingerprint="rh-v",
        shape=Shape(**shape),  # type: ignore[arg-type]
    )


def _entry(token: str, logprob: float, *alternatives: tuple[str, float]) -> TokenLogprob:
    tops = [TopLogprob(token=t, logprob=p, bytes=list(t.encode())) for t, p in alternatives]
    return TokenLogprob(token=token, logprob=logprob, bytes=list(token.encode()), top=tops)


def _events(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data:")]


def test_a_non_streaming_answer_holds_every_choice_with_its_finish_and_cached_tokens():
    formatter = _formatter(CHAT, n=2)
    formatter.add(Delta(text="a", tokens=1, index=1))
    formatter.add(Delta(text="b", tokens=1, index=0))
    formatter.add(Delta(text="c", tokens=1, index=1))
    finished = Finished(
        finish_reason="stop",
        prompt_tokens=7,
        completion_tokens=3,
        cached_tokens=4,
        finish_reasons=["stop", "length"],
        cache_created_tokens=3,
    )
    body = json.loads(formatter.complete(finished))
    assert [c["message"]["content"] for c in body["choices"]] == ["b", "ac"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 4, "created_cache_tokens": 3},
    }
    # vLLM's completions server counts the cached tokens alone.
    completion = _formatter(COMPLETIONS)
    completion.add(Delta(text="b", tokens=1))
    usage = json.loads(completion.complete(finished))["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 4}


def test_tool_call_pieces_make_whole_calls_and_content_is_null_beside_them():
    formatter = _formatter(CHAT)
    formatter.add(Delta(text="", tokens=2, tool_calls=[ToolCallDelta(index=0, id="c1", name="f")]))
    formatter.add(Delta(text="", tokens=2, tool_calls=[ToolCallDelta(index=0, arguments='{"a"')]))
    formatter.add(Delta(text="", tokens=1, tool_calls=[ToolCallDelta(index=0, arguments=": 1}")]))
    body = json.loads(formatter.complete(Finished("tool_calls", 3, 5)))
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]


def test_a_forced_tool_call_has_empty_content_as_vllm_answers():
    formatter = _formatter(CHAT, forced_tools=True)
    formatter.add(Delta(text="", tokens=2, tool_calls=[ToolCallDelta(index=0, id="c", name="f")]))
    body = json.loads(formatter.complete(Finished("stop", 3, 2)))
    assert body["choices"][0]["message"]["content"] == ""


def test_a_stream_sends_the_role_first_then_tool_call_pieces_by_index():
    formatter = _formatter(CHAT)
    first = formatter.chunk(Delta(text="", tokens=0), include_usage=False)
    piece = ToolCallDelta(index=0, id="c1", name="f", arguments="")
    call = formatter.chunk(Delta(text="", tokens=1, tool_calls=[piece]), include_usage=False)
    nothing = formatter.chunk(Delta(text="", tokens=1), include_usage=False)
    assert first is not None and call is not None and nothing is None
    [opening] = _events(first)
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    [calling] = _events(call)
    assert calling["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    ]


def test_chat_logprobs_keep_the_first_top_logprobs_alternatives():
    formatter = _formatter(CHAT, logprobs=1)
    entry = _entry("a", -0.5, ("a", -0.5), ("b", -1.5))
    formatter.add(Delta(text="a", tokens=1, logprobs=[entry]))
    body = json.loads(formatter.complete(Finished("length", 1, 1)))
    [token] = body["choices"][0]["logprobs"]["content"]
    assert token["token"] == "a" and token["logprob"] == -0.5 and token["bytes"] == [97]
    assert token["top_logprobs"] == [{"token": "a", "logprob": -0.5, "bytes": [97]}]


def test_completion_logprobs_carry_offsets_and_the_prompt_with_echo():
    formatter = _formatter(COMPLETIONS, logprobs=1, echo=("hi",))
    prompt = [TokenLogprob(token="h", logprob=None), _entry("i", -2.0, ("i", -2.0))]
    formatter.add(Delta(text="", tokens=0, prompt_logprobs=prompt))
    formatter.add(Delta(text=" yo", tokens=1, logprobs=[_entry(" yo", -0.1, ("x", -3.0))]))
    body = json.loads(formatter.complete(Finished("length", 2, 1)))
    choice = body["choices"][0]
    assert choice["text"] == "hi yo"
    assert choice["logprobs"] == {
        "text_offset": [0, 1, 2],
        "token_logprobs": [None, -2.0, -0.1],
        "tokens": ["h", "i", " yo"],
        "top_logprobs": [None, {"i": -2.0}, {"x": -3.0}],
    }


_RANKED = [None, [RankedLogprob(5, -1.5, 3, "b"), RankedLogprob(9, -0.25, 1, "c")]]
_RANKED_BODY = [
    None,
    {
        "5": {"logprob": -1.5, "rank": 3, "decoded_token": "b"},
        "9": {"logprob": -0.25, "rank": 1, "decoded_token": "c"},
    },
]


def test_prompt_logprobs_go_on_each_completion_choice():
    """Each prompt's first choice brings them; every choice of that prompt lists them."""
    formatter = _formatter(COMPLETIONS, n=2, prompts=2)
    other = [None, None, [RankedLogprob(1, -0.5, 1, "a")]]
    formatter.add(Delta(text="x", tokens=1, index=0, prompt_ranked=_RANKED))
    formatter.add(Delta(text="y", tokens=1, index=1))
    formatter.add(Delta(text="z", tokens=1, index=2, prompt_ranked=other))
    formatter.add(Delta(text="w", tokens=1, index=3))
    body = json.loads(formatter.complete(Finished("length", 2, 4)))
    other_body = [None, None, {"1": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}}]
    assert [c["prompt_logprobs"] for c in body["choices"]] == [
        _RANKED_BODY,
        _RANKED_BODY,
        other_body,
        other_body,
    ]


def test_prompt_logprobs_go_on_a_chat_body_once():
    formatter = _formatter(CHAT)
    formatter.add(Delta(text="x", tokens=1, prompt_ranked=_RANKED))
    formatter.add(Delta(text="y", tokens=1))
    body = json.loads(formatter.complete(Finished("length", 2, 2)))
    assert body["prompt_logprobs"] == _RANKED_BODY
    assert "prompt_logprobs" not in body["choices"][0]


def test_an_answer_without_prompt_logprobs_has_no_such_field():
    formatter = _formatter(COMPLETIONS)
    formatter.add(Delta(text="x", tokens=1))
    body = json.loads(formatter.complete(Finished("length", 2, 1)))
    assert "prompt_logprobs" not in body and "prompt_logprobs" not in body["choices"][0]


def test_a_stream_of_several_choices_ends_each_with_its_own_reason_then_usage():
    formatter = _formatter(COMPLETIONS, n=2)
    finished = Finished("stop", 4, 2, cached_tokens=0, finish_reasons=["stop", "length"])
    chunks = formatter.finish_chunks(finished, include_usage=True)
    events = [event for chunk in chunks for event in _events(chunk)]
    assert [(e["choices"][0]["index"], e["choices"][0]["finish_reason"]) for e in events[:2]] == [
        (0, "stop"),
        (1, "length"),
    ]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2


def test_with_continuous_usage_every_chunk_carries_its_choices_usage_so_far():
    formatter = _formatter(COMPLETIONS, n=2, continuous_usage=True, prompt_token_ids=([1, 2, 3],))
    sent = [
        formatter.chunk(Delta(text="a b", tokens=2, index=0), include_usage=True),
        formatter.chunk(Delta(text="x", tokens=1, index=1), include_usage=True),
        formatter.chunk(Delta(text=" c", tokens=1, index=0), include_usage=True),
    ]
    finished = Finished("length", 3, 4, finish_reasons=["length", "stop"])
    sent += formatter.finish_chunks(finished, include_usage=True)
    events = [event for chunk in sent if chunk for event in _events(chunk)]
    running = [(e["choices"][0]["index"], e["usage"]) for e in events if e["choices"]]
    assert [(i, u["prompt_tokens"], u["completion_tokens"]) for i, u in running] == [
        (0, 3, 2),
        (1, 3, 1),
        (0, 3, 3),
        (0, 3, 3),  # the choice's last chunk, with its finish_reason
        (1, 3, 1),
    ]
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for _, u in running)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    # Without it a chunk's usage is null until the last, as OpenAI's API writes it.
    plain = _formatter(CHAT).chunk(Delta(text="a", tokens=1), include_usage=True)
    assert plain is not None and _events(plain)[0]["usage"] is None


def test_each_choice_names_the_stop_string_or_token_that_ended_it_as_vllm_does():
    finished = Finished("stop", 4, 3, finish_reasons=["stop", "stop", "length"])
    ended = msgspec.structs.replace(finished, stop_reasons=["QUOT", 7, None])
    for endpoint in (CHAT, COMPLETIONS):
        body = json.loads(_formatter(endpoint, n=3).complete(ended))
        assert [c["stop_reason"] for c in body["choices"]] == ["QUOT", 7, None]
        chunks = _formatter(endpoint, n=3).finish_chunks(ended, include_usage=False)
        last = [event["choices"][0] for chunk in chunks for event in _events(chunk)]
        assert [c["stop_reason"] for c in last] == ["QUOT", 7, None]
    # An end by its end of sequence or its length: null on every choice.
    body = json.loads(_formatter(CHAT, n=3).complete(finished))
    assert [c["stop_reason"] for c in body["choices"]] == [None, None, None]
    assert ended.stop_sequence == "QUOT" and finished.stop_sequence is None


def test_the_rendered_prompt_goes_on_a_chat_body_and_each_choices_first_chunk():
    rendered = "<|user|>hello<|assistant|>"
    whole = _formatter(CHAT, prompt_text=rendered)
    whole.add(Delta(text="hi", tokens=1))
    body = json.loads(
        whole.complete(Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=1))
    )
    assert body["prompt_text"] == rendered
    streamed = _formatter(CHAT, n=2, prompt_text=rendered)
    chunks = [
        streamed.chunk(Delta(text="a", tokens=1, index=0), include_usage=False),
        streamed.chunk(Delta(text="b", tokens=1, index=1), include_usage=False),
        streamed.chunk(Delta(text="c", tokens=1, index=0), include_usage=False),
    ]
    events = [event for chunk in chunks if chunk is not None for event in _events(chunk)]
    assert [e.get("prompt_text") for e in events] == [rendered, rendered, None]
    plain = _formatter(CHAT)
    plain.add(Delta(text="hi", tokens=1))
    finished = Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=1)
    assert "prompt_text" not in json.loads(plain.complete(finished))
