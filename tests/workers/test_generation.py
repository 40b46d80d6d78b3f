"""The generative worker's side of API parity: choices, several prompts, logprobs, tools.

The engine is a stand-in that yields scripted steps (the boundary with vLLM); everything from
its steps to the events on the outbox is the real code, tool parsing included (vLLM's own
hermes parser on literal text, with the demo model's tokenizer).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import redis.asyncio as aredis
from vllm.logprobs import Logprob

from dataplane.types import (
    Delta,
    Failed,
    Finished,
    Job,
    RankedLogprob,
    Reasoning,
    Sampling,
    Started,
    Structured,
    TokenLogprob,
    ToolCallDelta,
    Tools,
    TopLogprob,
)
from workers import generative
from workers.engine import AdapterRef, EngineError, Step, _Steps, sampling_params
from workers.generative import GenerativeWorker, _Holdback
from workers.tooling import ranked_shaped

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(demo_model_dir))


def _job(**kw: Any) -> Job:
    now = time.time()
    sampling = kw.pop("sampling", Sampling(max_tokens=8))
    return Job(
        request_id=uuid.uuid4().hex,
        tenant_id=1,
        api_key_id=1,
        deployment="d",
        model_version="v",
        endpoint=kw.pop("endpoint", "completions"),
        prompt_token_ids=kw.pop("prompt_token_ids", [1, 2, 3]),
        sampling=sampling,
        enqueued_at=now,
        deadline=now + 60,
        **kw,
    )


class _Engine:
    """Yields each request's scripted steps; `fail` names a request that raises after them."""

    prefix_caching = False

    def __init__(
        self, script: dict[int, list[Step]], tokenizer: Any = None, fail: int | None = None
    ) -> None:
        self.script = script
        self._tokenizer = tokenizer
        self.fail = fail
        self.calls: list[tuple[str, list[int], Sampling]] = []
        self.cancelled: list[str] = []
        self.ranked: list[bool] = []  # each call's prompt_ranked
        self.thinking: list[Any] = []  # each call's reasoning model's request
        self.priorities: list[int] = []  # each call's engine priority

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        adapter: AdapterRef | None = None,
        cache_salt: str = "",
        prompt_ranked: bool = True,
        thinking: Any = None,
        priority: int = 0,
    ) -> AsyncIterator[Step]:
        prompt = len(self.calls)
        self.priorities.append(priority)
        self.calls.append((request_id, prompt_token_ids, sampling))
        self.ranked.append(prompt_ranked)
        self.thinking.append(thinking)
        try:
            for step in self.script[prompt]:
                await asyncio.sleep(0.001)
                yield step
            if self.fail == prompt:
                raise RuntimeError("injected")
            if self.fail is not None:
                await asyncio.sleep(10)  # the other prompts wait to be ended by the failure
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise

    def tokenizer(self) -> Any:
        return self._tokenizer

    def model_config(self) -> Any:
        return None

    async def health(self) -> None:
        return None

    def kv_cache_usage(self) -> float | None:
        return 0.0


def _worker(engine: _Engine) -> GenerativeWorker:
    return GenerativeWorker(
        deployment="d",
        engine=engine,  # type: ignore[arg-type]
        client=aredis.Redis(),  # never reached: the test reads the outbox
        worker_id="w",
        capacity=4,
        lease_seconds=10,
    )


async def _served(engine: _Engine, job: Job) -> list[Any]:
    worker = _worker(engine)
    await worker._serve(job)
    return [event for _, event, *_ in worker._outbox.take()]


def _step(text: str, index: int = 0, reason: str | None = None, **kw: Any) -> Step:
    ids = tuple(range(len(text.split()))) if text else ()
    return Step(
        text=text,
        tokens=len(ids),
        finish_reason=reason,
        prompt_tokens=kw.pop("prompt_tokens", 3),
        index=index,
        token_ids=ids,
        **kw,
    )


def _by_choice(events: list[Any]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for event in events:
        if isinstance(event, Delta):
            texts[event.index] = texts.get(event.index, "") + event.text
    return texts


# --- SamplingParams ---


def test_every_sampling_option_reaches_vllms_sampling_params():
    params = sampling_params(
        Sampling(
            max_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=5,
            seed=11,
            stop=["x"],
            ignore_eos=True,
            min_tokens=2,
            presence_penalty=0.1,
            frequency_penalty=0.2,
            n=3,
            repetition_penalty=1.1,
            min_p=0.05,
            stop_token_ids=[9],
            bad_words=["bad"],
            logit_bias={4: -2.0},
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            include_stop_str_in_output=True,
            logprobs=2,
            prompt_logprobs=1,
            allowed_token_ids=[4, 9],
        )
    )
    from vllm.sampling_params import RequestOutputKind

    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (7, 0.5, 0.9, 5)
    assert (params.seed, params.stop, params.ignore_eos, params.min_tokens) == (11, ["x"], True, 2)
    assert (params.presence_penalty, params.frequency_penalty) == (0.1, 0.2)
    assert (params.n, params.repetition_penalty, params.min_p) == (3, 1.1, 0.05)
    assert params.stop_token_ids == [9] and params.bad_words == ["bad"]
    assert params.logit_bias == {4: -2.0} and params.allowed_token_ids == [4, 9]
    assert params.skip_special_tokens is False
    assert params.spaces_between_special_tokens is False
    assert params.include_stop_str_in_output is True
    assert (params.logprobs, params.prompt_logprobs) == (2, 1)
    assert params.structured_outputs is None
    assert params.output_kind == RequestOutputKind.DELTA


def test_defaults_leave_vllms_defaults():
    params = sampling_params(Sampling(max_tokens=4))
    assert (params.n, params.top_k, params.logprobs, params.prompt_logprobs) == (1, 0, None, None)
    assert params.allowed_token_ids is None
    assert params.stop_token_ids == [] and params.logit_bias is None
    assert params.skip_special_tokens is True


@pytest.mark.parametrize(
    ("structured", "field", "value"),
    [
        (Structured(json='{"type": "object"}'), "json", {"type": "object"}),
        (Structured(json_object=True), "json_object", True),
        (Structured(regex="[a-z]+"), "regex", "[a-z]+"),
        (Structured(choice=["yes", "no"]), "choice", ["yes", "no"]),
        (Structured(grammar='root ::= "a"'), "grammar", 'root ::= "a"'),
        (Structured(structural_tag='{"type": "x"}'), "structural_tag", '{"type": "x"}'),
    ],
)
def test_a_structured_constraint_becomes_vllms(structured, field, value):
    params = sampling_params(Sampling(max_tokens=4, structured=structured))
    assert getattr(params.structured_outputs, field) == value


def test_a_salt_keeps_a_tenants_compiled_grammar_apart_and_matches_the_same():
    """The engine caches compiled grammars by text: each tenant's text differs, not its grammar."""
    import xgrammar

    schema = '{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}'
    ebnf = 'root ::= "go " ("north" | "south")'

    def sent(salt: str) -> tuple[str, str]:
        params = sampling_params(Sampling(max_tokens=4, structured=Structured(json=schema)),
                                 salt=salt).structured_outputs  # fmt: skip
        grammar = sampling_params(Sampling(max_tokens=4, structured=Structured(grammar=ebnf)),
                                  salt=salt).structured_outputs.grammar  # fmt: skip
        return json.dumps(params.json), grammar

    unsalted, one, other = sent(""), sent("1"), sent("2")
    assert unsalted == (json.dumps(json.loads(schema)), ebnf)
    assert len({unsalted[0], one[0], other[0]}) == 3
    assert len({unsalted[1], one[1], other[1]}) == 3
    assert sent("1") == one  # the same tenant's requests share theirs
    plain = str(xgrammar.Grammar.from_json_schema(unsalted[0]))
    assert str(xgrammar.Grammar.from_json_schema(one[0])) == plain
    assert str(xgrammar.Grammar.from_ebnf(one[1])) == str(xgrammar.Grammar.from_ebnf(ebnf))
    # A choice list goes as the grammar vLLM compiles it to, marked.
    from vllm.v1.structured_output.utils import choice_as_grammar

    choices = ["red", 'gr"een']
    chosen = sampling_params(Sampling(max_tokens=4, structured=Structured(choice=choices)),
                             salt="1").structured_outputs  # fmt: skip
    assert chosen.choice is None and chosen.grammar.startswith("# cache:")
    assert str(xgrammar.Grammar.from_ebnf(chosen.grammar)) == str(
        xgrammar.Grammar.from_ebnf(choice_as_grammar(choices))
    )
    unsalted_choice = sampling_params(Sampling(max_tokens=4, structured=Structured(choice=choices)))
    assert unsalted_choice.structured_outputs.choice == choices
    # A client's own comment stays, the mark after it.
    noted = json.dumps({"$comment": "mine", "type": "string"})
    params = sampling_params(Sampling(max_tokens=4, structured=Structured(json=noted)), salt="1")
    assert params.structured_outputs.json["$comment"].startswith("mine cache:")


def test_vllms_default_structured_output_backend_gets_the_marks():
    from vllm.config import StructuredOutputsConfig

    from workers.engine import GRAMMAR_MARKED_BACKENDS

    assert StructuredOutputsConfig().backend in GRAMMAR_MARKED_BACKENDS


def test_structured_switches_go_along():
    structured = Structured(
        regex="a+", whitespace_pattern=" ?", disable_any_whitespace=True,
        disable_additional_properties=True,
    )  # fmt: skip
    params = sampling_params(Sampling(max_tokens=4, structured=structured)).structured_outputs
    assert params.whitespace_pattern == " ?"
    assert params.disable_any_whitespace and params.disable_additional_properties


# --- engine outputs to steps ---


def _completion(
    index: int, text: str, ids: list[int], reason: str | None = None, lps=None, stop=None
):
    return SimpleNamespace(
        index=index, text=text, token_ids=ids, finish_reason=reason, logprobs=lps, stop_reason=stop
    )


def _output(
    *completions: Any, prompt_logprobs: Any = None, cached: int = 0, created: int = 0
) -> Any:
    return SimpleNamespace(
        outputs=list(completions),
        prompt_token_ids=[5, 6],
        prompt_logprobs=prompt_logprobs,
        num_cached_tokens=cached,
        num_cache_creation_tokens=created,
    )


def test_every_completion_of_an_engine_output_is_a_step_of_its_own(tokenizer):
    steps = _Steps([5, 6], tokenizer)
    first = steps.of(_output(_completion(0, "a", [7]), _completion(1, "b", [8]), cached=2))
    assert [(s.index, s.text, s.token_ids, s.tokens) for s in first] == [
        (0, "a", (7,), 1),
        (1, "b", (8,), 1),
    ]
    assert all(s.prompt_tokens == 2 and s.cached_tokens == 2 for s in first)
    ended = steps.of(_output(_completion(1, "c", [9], "length")))
    assert [(s.index, s.finish_reason) for s in ended] == [(1, "length")]
    # vLLM repeats no finished completion; were it to, the step would count its tokens twice.
    again = steps.of(_output(_completion(1, "", []), _completion(0, "", [])))
    assert [s.index for s in again] == [0]


def test_a_step_says_which_stop_string_ended_it_and_what_it_wrote_to_the_cache(tokenizer):
    steps = _Steps([5, 6], tokenizer)
    (by_string,) = steps.of(_output(_completion(0, "a", [7], "stop", stop="Done"), created=16))
    assert by_string.stop_string == "Done" and by_string.cache_created_tokens == 16
    # A stop token's id, or the end of sequence (None), is not a stop string.
    (by_token,) = _Steps([5], tokenizer).of(_output(_completion(0, "a", [7], "stop", stop=2)))
    assert by_token.stop_string is None and by_token.cache_created_tokens == 0
    assert (by_string.stop_reason, by_token.stop_reason) == ("Done", 2)


def test_an_engine_error_fails_the_request(tokenizer):
    with pytest.raises(EngineError):
        _Steps([5], tokenizer).of(_output(_completion(0, "", [], "error")))


def test_logprobs_are_shaped_as_vllms_chat_server_shapes_them(tokenizer):
    decoded = tokenizer.decode([8])
    step_lps = {
        7: Logprob(logprob=-0.5, rank=1, decoded_token="a"),
        8: Logprob(logprob=float("-inf"), rank=2, decoded_token=None),
    }
    prompt_lps = [None, {6: Logprob(logprob=-1.25, rank=1, decoded_token="é")}]
    steps = _Steps([5, 6], tokenizer)
    out = _output(_completion(0, "a", [7], lps=[step_lps]), prompt_logprobs=prompt_lps)
    (step,) = steps.of(out)
    assert step.logprobs == [
        TokenLogprob(
            token="a",
            logprob=-0.5,
            bytes=[97],
            top=[
                TopLogprob(token="a", logprob=-0.5, bytes=[97]),
                TopLogprob(token=decoded, logprob=-9999.0, bytes=list(decoded.encode())),
            ],
        )
    ]
    first = tokenizer.decode([5])
    assert step.prompt_logprobs == [
        TokenLogprob(token=first, logprob=None, bytes=list(first.encode())),
        TokenLogprob(
            token="é",
            logprob=-1.25,
            bytes=[195, 169],
            top=[TopLogprob(token="é", logprob=-1.25, bytes=[195, 169])],
        ),
    ]
    # And as vLLM's prompt_logprobs field lists them: by id, with rank and text.
    assert step.prompt_ranked == [
        None,
        [RankedLogprob(token_id=6, logprob=-1.25, rank=1, decoded="é")],
    ]
    # The prompt's logprobs come with each completion's first step only.
    (later,) = steps.of(_output(_completion(0, "a", [7], lps=[step_lps])))
    assert later.prompt_logprobs is None and later.prompt_ranked is None


def test_a_prompt_not_echoed_is_scored_only_as_vllms_prompt_logprobs_list_it(tokenizer):
    prompt_lps = [None, {6: Logprob(logprob=-1.25, rank=1, decoded_token="é")}]
    steps = _Steps([5, 6], tokenizer, echoed=False)
    (step,) = steps.of(_output(_completion(0, "a", [7]), prompt_logprobs=prompt_lps))
    assert step.prompt_logprobs is None
    assert step.prompt_ranked == [None, [RankedLogprob(6, -1.25, 1, "é")]]


def test_a_stream_echoing_its_prompts_logprobs_skips_the_ranked_shape(tokenizer):
    # A stream's chunks have no prompt_logprobs field: shaping it would be dropped work.
    prompt_lps = [None, {6: Logprob(logprob=-1.25, rank=1, decoded_token="é")}]
    steps = _Steps([5, 6], tokenizer, ranked=False)
    (step,) = steps.of(_output(_completion(0, "a", [7]), prompt_logprobs=prompt_lps))
    assert step.prompt_ranked is None
    assert [each.logprob for each in step.prompt_logprobs or []] == [None, -1.25]
    (later,) = steps.of(_output(_completion(0, "b", [8]), prompt_logprobs=prompt_lps))
    assert later.prompt_logprobs is None and later.prompt_ranked is None


def test_ranked_prompt_logprobs_keep_the_engines_order_and_floor():
    position = {
        9: Logprob(logprob=float("-inf"), rank=4000, decoded_token="x"),
        3: Logprob(logprob=-0.1, rank=1, decoded_token=None),
    }
    assert ranked_shaped([None, position]) == [
        None,
        [
            RankedLogprob(token_id=9, logprob=-9999.0, rank=4000, decoded="x"),
            RankedLogprob(token_id=3, logprob=-0.1, rank=1, decoded=None),
        ],
    ]


def test_tokens_named_by_id_keep_the_chosen_tokens_own_bytes(tokenizer):
    """vLLM's return_tokens_as_token_ids: every token is 'token_id:<id>'; bytes as vLLM gives."""
    step_lps = {
        7: Logprob(logprob=-0.5, rank=1, decoded_token="a"),
        8: Logprob(logprob=-2.0, rank=2, decoded_token="b"),
    }
    steps = _Steps([5, 6], tokenizer, as_ids=True)
    out = _output(_completion(0, "a", [7], lps=[step_lps]), prompt_logprobs=[None, None])
    (step,) = steps.of(out)
    assert step.logprobs == [
        TokenLogprob(
            token="token_id:7",
            logprob=-0.5,
            bytes=[97],  # the chosen token's text, as in vLLM's answer
            top=[
                TopLogprob(token="token_id:7", logprob=-0.5, bytes=list(b"token_id:7")),
                TopLogprob(token="token_id:8", logprob=-2.0, bytes=list(b"token_id:8")),
            ],
        )
    ]
    assert [p.token for p in step.prompt_logprobs or []] == ["token_id:5", "token_id:6"]


def test_a_token_without_its_own_entry_is_decoded_without_a_probability(tokenizer):
    (step,) = _Steps([5], tokenizer).of(_output(_completion(0, "x", [7], lps=[None])))
    assert step.logprobs is not None
    assert step.logprobs[0].logprob is None and step.logprobs[0].top == []
    assert step.logprobs[0].token == tokenizer.decode([7])


# --- choices, holdback, several prompts ---


async def test_choices_are_multiplexed_by_index_and_each_finish_reason_kept():
    job = _job(sampling=Sampling(max_tokens=8, n=2))
    engine = _Engine(
        {
            0: [
                _step("a b", 0, cached_tokens=2),
                _step("x", 1),
                _step("c", 0, "stop"),
                _step("y z", 1, "length"),
            ]
        }
    )
    events = await _served(engine, job)
    assert isinstance(events[0], Started)
    assert _by_choice(events) == {0: "a bc", 1: "xy z"}
    assert events[-1] == Finished(
        finish_reason="stop",
        prompt_tokens=3,
        completion_tokens=6,
        cached_tokens=2,
        finish_reasons=["stop", "length"],
    )


async def test_the_end_names_the_stop_string_or_token_that_ended_each_choice():
    engine = _Engine(
        {0: [_step("a", 0, "stop", stop_reason="Done"), _step("b", 1, "stop", stop_reason=7)]}
    )
    events = await _served(engine, _job(sampling=Sampling(max_tokens=8, n=2)))
    assert events[-1].stop_reasons == ["Done", 7] and events[-1].stop_sequence == "Done"
    assert events[-1].stop_string == "Done"  # under its old name too, for older frontends
    # Ended by their end of sequence or length: no list.
    plain = await _served(_Engine({0: [_step("a", 0, "stop")]}), _job())
    assert plain[-1].stop_reasons == [] and plain[-1].stop_reason(0) is None


async def test_one_choice_finishes_without_a_list_of_reasons():
    events = await _served(_Engine({0: [_step("a", 0, "length")]}), _job())
    assert events[-1] == Finished(finish_reason="length", prompt_tokens=3, completion_tokens=1)


def test_the_holdback_keeps_one_pending_delta_per_choice(monkeypatch):
    held = _Holdback()
    assert held.add(Delta(text="a", tokens=1, index=0)) == []
    assert held.add(Delta(text="x", tokens=1, index=1)) == []
    assert held.add(Delta(text="b", tokens=1, index=0)) == []
    monkeypatch.setattr(generative, "_HOLD_SECONDS", 0.0)
    assert held.add(Delta(text="y", tokens=1, index=1)) == [
        Delta(text="ab", tokens=2, index=0),
        Delta(text="xy", tokens=2, index=1),
    ]
    assert held.take() == []


async def test_a_non_streaming_request_writes_one_delta_per_choice():
    job = _job(sampling=Sampling(max_tokens=8, n=2), stream=False)
    engine = _Engine(
        {0: [_step("a", 0), _step("x", 1), _step("b", 0, "stop"), _step("y", 1, "stop")]}
    )
    events = await _served(engine, job)
    assert [e for e in events if isinstance(e, Delta)] == [
        Delta(text="ab", tokens=2, index=0),
        Delta(text="xy", tokens=2, index=1),
    ]


async def test_a_beam_searchs_first_token_is_when_the_engine_made_it_not_when_it_answered():
    # A beam search answers once, at its end; its step says when its first token was made.
    made = time.time() - 5.0
    job = _job(sampling=Sampling(max_tokens=8, n=2, beam_search=True), stream=False)
    engine = _Engine(
        {0: [_step("a b", 0, "length", first_token_at=made), _step("c d", 1, "length")]}
    )
    worker = _worker(engine)
    await worker._serve(job)
    [usage] = [usage for _, _, usage, _ in worker._outbox.take() if usage is not None]
    assert usage.first_token_at == made
    assert usage.finished_at > made + 4


async def test_several_prompts_run_as_engine_requests_of_their_own():
    job = _job(
        prompt_token_ids=[1, 2, 3, 4, 5],
        input_lengths=[2, 3],
        sampling=Sampling(max_tokens=8, n=2),
    )
    engine = _Engine(
        {
            0: [
                _step("a", 0, prompt_tokens=2, cached_tokens=1),
                _step("b", 1, "stop", prompt_tokens=2),
            ],
            1: [
                _step("c d", 1, "length", prompt_tokens=3, cached_tokens=2),
                _step("e", 0, "stop", prompt_tokens=3),
            ],
        }
    )
    events = await _served(engine, job)
    assert [(rid, ids) for rid, ids, _ in engine.calls] == [
        (f"{job.request_id}-0", [1, 2]),
        (f"{job.request_id}-1", [3, 4, 5]),
    ]
    assert _by_choice(events) == {0: "a", 1: "b", 2: "e", 3: "c d"}
    assert events[-1] == Finished(
        finish_reason="stop",
        prompt_tokens=5,
        completion_tokens=5,
        cached_tokens=3,
        finish_reasons=["stop", "stop", "stop", "length"],
    )


async def test_a_failing_prompt_ends_every_prompt_and_bills_what_they_produced():
    job = _job(prompt_token_ids=[1, 2, 3], input_lengths=[1, 2])
    first = [_step("a", prompt_tokens=1), _step("b", prompt_tokens=1)]
    engine = _Engine({0: first, 1: [_step("c d", prompt_tokens=2)]}, fail=0)
    events = await _served(engine, job)
    assert engine.cancelled == [f"{job.request_id}-1"]
    assert isinstance(events[-1], Failed) and events[-1].code == "engine_error"
    assert events[-1].completion_tokens == 4 and events[-1].prompt_tokens == 3


async def test_prompt_logprobs_and_logprobs_reach_the_choice():
    lp = [TokenLogprob(token="a", logprob=-1.0)]
    prompt = [TokenLogprob(token="p", logprob=None)]
    ranked = [None, [RankedLogprob(token_id=4, logprob=-2.0, rank=7, decoded="q")]]
    step = _step("a", 0, "stop", logprobs=lp, prompt_logprobs=prompt, prompt_ranked=ranked)
    engine = _Engine({0: [step]})
    events = await _served(engine, _job(stream=False))
    (delta,) = [e for e in events if isinstance(e, Delta)]
    assert delta.logprobs == lp and delta.prompt_logprobs == prompt
    assert delta.prompt_ranked == ranked
    assert engine.ranked == [True]


async def test_a_prompts_ranked_logprobs_ride_with_its_first_choice_only():
    ranked = [None, [RankedLogprob(token_id=4, logprob=-2.0, rank=7, decoded="q")]]
    steps = [_step("a", i, "stop", prompt_ranked=ranked) for i in (0, 1)]
    job = _job(stream=False, sampling=Sampling(max_tokens=8, n=2, temperature=1.0))
    events = await _served(_Engine({0: steps}), job)
    deltas = {e.index: e for e in events if isinstance(e, Delta)}
    assert deltas[0].prompt_ranked == ranked and deltas[1].prompt_ranked is None


async def test_a_stream_carries_no_ranked_prompt_logprobs():
    """vLLM's prompt_logprobs field is in whole answers only: a stream's deltas leave it out."""
    ranked = [None, [RankedLogprob(token_id=4, logprob=-2.0, rank=7, decoded="q")]]
    step = _step("a", 0, "stop", prompt_logprobs=[TokenLogprob("p", None)], prompt_ranked=ranked)
    engine = _Engine({0: [step]})
    events = await _served(engine, _job(stream=True))
    (delta,) = [e for e in events if isinstance(e, Delta)]
    assert delta.prompt_logprobs is not None and delta.prompt_ranked is None
    assert engine.ranked == [False]  # and the engine is not asked to shape them


# --- tools ---


def _tool_job(choice: Any = "auto", *, stream: bool, n: int = 1, parallel: bool | None = None):
    return _job(
        endpoint="chat",
        stream=stream,
        sampling=Sampling(max_tokens=64, n=n),
        tools=Tools(
            parser="hermes", tools=json.dumps(WEATHER), choice=json.dumps(choice),
            parallel=parallel,
        ),
    )  # fmt: skip


def _calls(events: list[Any], index: int = 0) -> list[ToolCallDelta]:
    calls: list[ToolCallDelta] = []
    for event in events:
        if isinstance(event, Delta) and event.index == index and event.tool_calls:
            calls += event.tool_calls
    return calls


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _ending(pieces: list[str], reason: str = "stop") -> list[Step]:
    """A step per piece, the last one finishing the choice."""
    last = len(pieces) - 1
    return [_step(p, reason=reason if i == last else None) for i, p in enumerate(pieces)]


async def test_a_non_streaming_answer_is_parsed_into_tool_calls_at_its_end(tokenizer):
    pieces = _pieces("Let me look. " + CALL)
    steps = [
        _step(p, reason="stop" if i == len(pieces) - 1 else None) for i, p in enumerate(pieces)
    ]
    engine = _Engine({0: steps}, tokenizer)
    events = await _served(engine, _tool_job(stream=False))
    deltas = [e for e in events if isinstance(e, Delta)]
    assert deltas[-1].text == "Let me look. "
    (call,) = _calls(events)
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.id and call.id.startswith("chatcmpl-tool-")
    assert sum(d.tokens for d in deltas) == sum(s.tokens for s in steps)
    assert events[-1].finish_reason == "tool_calls"
    # The parser asked for special tokens to be kept (tool-call tags can be special).
    assert engine.calls[0][2].skip_special_tokens is False


async def test_a_streamed_answer_streams_tool_call_pieces(tokenizer):
    pieces = _pieces("Sure. " + CALL)
    steps = [
        _step(p, reason="stop" if i == len(pieces) - 1 else None) for i, p in enumerate(pieces)
    ]
    events = await _served(_Engine({0: steps}, tokenizer), _tool_job(stream=True))
    assert _by_choice(events)[0] == "Sure. "
    calls = _calls(events)
    assert calls[0].name == "get_weather" and calls[0].id
    assert json.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}
    assert events[-1].finish_reason == "tool_calls"


async def test_plain_text_with_tools_stays_content_and_stops(tokenizer):
    for stream in (True, False):
        steps = [_step("It is "), _step("sunny.", reason="stop")]
        events = await _served(_Engine({0: steps}, tokenizer), _tool_job(stream=stream))
        assert _by_choice(events)[0] == "It is sunny." and _calls(events) == []
        assert events[-1].finish_reason == "stop"


async def test_a_call_cut_by_length_keeps_the_length_reason_when_streamed(tokenizer):
    steps = [_step(CALL[:40]), _step(CALL[40:], reason="length")]
    streamed = await _served(_Engine({0: steps}, tokenizer), _tool_job(stream=True))
    assert streamed[-1].finish_reason == "length"
    # vLLM's whole answer says tool_calls whenever auto parsing found one.
    whole = await _served(_Engine({0: steps}, tokenizer), _tool_job(stream=False))
    assert whole[-1].finish_reason == "tool_calls"


async def test_required_and_named_choices_get_vllms_constraint_and_reasons(tokenizer):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, reason in (("required", "tool_calls"), (named, "stop")):
        engine = _Engine({0: [_step(CALL, reason="stop")]}, tokenizer)
        events = await _served(engine, _tool_job(choice, stream=False))
        structured = engine.calls[0][2].structured
        assert structured is not None and structured.structural_tag is not None
        assert "get_weather" in structured.structural_tag
        (call,) = _calls(events)
        assert call.name == "get_weather"
        assert events[-1].finish_reason == reason


async def test_no_parallel_calls_keeps_the_first(tokenizer):
    two = CALL + CALL.replace("Paris", "Oslo")
    for stream in (False, True):
        events = await _served(
            _Engine({0: [_step(p) for p in _pieces(two)] + [_step("", reason="stop")]}, tokenizer),
            _tool_job(stream=stream, parallel=False),
        )
        assert {c.index for c in _calls(events)} == {0}
        assert "Oslo" not in "".join(c.arguments for c in _calls(events))


async def test_each_choice_has_its_own_parser(tokenizer):
    steps = [
        _step(CALL[:30], 0),
        _step("Plain", 1),
        _step(CALL[30:], 0, "stop"),
        _step(" text.", 1, "stop"),
    ]
    events = await _served(_Engine({0: steps}, tokenizer), _tool_job(stream=True, n=2))
    assert _calls(events, 1) == [] and _by_choice(events)[1] == "Plain text."
    assert _calls(events, 0)[0].name == "get_weather"
    assert events[-1].finish_reasons == ["tool_calls", "stop"]


class _Flags:
    """An outbox that records which deltas went out at once (urgent)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Delta, bool]] = []

    def put(self, job: Any, event: Any, usage: Any = None, *, urgent: bool = False) -> None:
        if isinstance(event, Delta):
            self.sent.append((event, urgent))


def test_the_first_visible_piece_goes_at_once_when_a_parser_held_the_first_tokens(tokenizer):
    job = _tool_job(stream=True)
    outbox = _Flags()
    run = generative._Generation(job, outbox)  # type: ignore[arg-type]
    assert job.tools is not None
    run.use_parsing(generative.OutputParsing(job.tools, tokenizer=tokenizer, stream=True))
    for piece in _pieces(CALL):
        run.step(_step(piece))
    urgent = [(bool(d.text or d.tool_calls), flag) for d, flag in outbox.sent]
    first_visible = next(i for i, (visible, _) in enumerate(urgent) if visible)
    assert first_visible > 0  # the parser held the first tokens back
    assert urgent[0][1] and urgent[first_visible][1]
    assert not any(flag for _, flag in urgent[first_visible + 1 :])


# --- handing a run on (a preempted worker draining) ---


async def _stopped_by_the_drain(worker: GenerativeWorker, job: Job) -> None:
    """Run a job until it is under way, then stop it as a drain whose time ran out does."""
    task = asyncio.create_task(worker._serve(job))
    worker.active[job.request_id] = (job, task)
    await asyncio.sleep(0.05)
    worker._stopped.add(job.request_id)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_run_carried_on_continues_after_the_tokens_already_produced():
    from dataplane.types import Resumed

    resumed = Resumed(token_ids=[40, 41, 42], started_at=100.0, first_token_at=100.5)
    job = _job(sampling=Sampling(max_tokens=8, min_tokens=5), resumed=resumed)
    # The engine sees the earlier tokens as prompt: 3 + 3.
    engine = _Engine({0: [_step("d e", prompt_tokens=6), _step("f", reason="length",
                                                                prompt_tokens=6)]})  # fmt: skip
    events = await _served(engine, job)
    [(_, prompt, sampling)] = engine.calls
    assert prompt == [1, 2, 3, 40, 41, 42]
    assert (sampling.max_tokens, sampling.min_tokens) == (5, 2)
    assert not any(isinstance(e, Started) for e in events)  # the first worker sent it
    assert _by_choice(events) == {0: "d ef"}
    end = events[-1]
    assert isinstance(end, Finished)
    # Billed once for everything: the first worker's 3 tokens and these 3; the prompt as asked.
    assert (end.prompt_tokens, end.completion_tokens) == (3, 6)


async def test_a_run_the_drain_stops_is_handed_on_with_what_it_produced():
    engine = _Engine({})
    worker = _worker(engine)
    job = _job(sampling=Sampling(max_tokens=100))
    blocked = asyncio.Event()

    async def slow_generate(**kw: Any) -> AsyncIterator[Step]:
        yield _step("a b")
        yield _step("c")
        await blocked.wait()  # still running when the drain runs out
        yield _step("never")

    engine.generate = slow_generate  # type: ignore[method-assign]
    await _stopped_by_the_drain(worker, job)
    [handed] = worker._handed_on
    assert handed.resumed is not None and handed.resumed.token_ids == [0, 1, 0]
    assert handed.resumed_tokens == 3 and job.request_id not in worker.active
    events = [event for _, event, *_ in worker._outbox.take()]
    # Its output so far goes out; no end: the next worker ends it.
    assert _by_choice(events) == {0: "a bc"}
    assert not any(isinstance(e, Finished | Failed) for e in events)


async def test_a_run_another_worker_cannot_carry_on_ends_as_worker_lost():
    worker = _worker(_Engine({}))
    job = _job(sampling=Sampling(max_tokens=100, stop=["\n"]))  # a stop string could straddle

    async def slow_generate(**kw: Any) -> AsyncIterator[Step]:
        yield _step("a b")
        await asyncio.Event().wait()
        yield _step("never")

    worker.generator.generate = slow_generate  # type: ignore[method-assign]
    await _stopped_by_the_drain(worker, job)
    assert worker._handed_on == []
    events = [event for _, event, *_ in worker._outbox.take()]
    end = events[-1]
    assert isinstance(end, Failed) and end.code == "worker_lost" and end.completion_tokens == 2


def test_the_engines_own_refusals_are_known_on_older_vllm_releases(monkeypatch):
    """vLLM 0.26 (the last release on torch 2.11, which some GPU images carry) has no
    VLLMClientError: its validation error is what the worker turns into a refusal there."""
    from vllm import exceptions

    from workers.engine import _client_errors

    if hasattr(exceptions, "VLLMClientError"):  # the pinned release; 0.26 has none
        assert _client_errors() == (exceptions.VLLMClientError,)
        monkeypatch.delattr(exceptions, "VLLMClientError")
    assert _client_errors() == (exceptions.VLLMValidationError,)


def test_tool_parsers_are_built_on_older_vllm_releases(monkeypatch):
    """vLLM 0.26's ParserManager.get_parser takes no tokenizer (later releases check the
    parser against it); the worker passes one only where the signature has it."""
    from vllm.parser import ParserManager

    from workers import tooling

    asked: list[dict[str, object]] = []

    def get_parser(*, tool_parser_name, enable_auto_tools, is_harmony):  # 0.26's signature
        asked.append({"name": tool_parser_name, "auto": enable_auto_tools})
        return "parser class"

    monkeypatch.setattr(ParserManager, "get_parser", staticmethod(get_parser))
    monkeypatch.setattr(tooling, "_parser_classes", {})
    built = tooling._parser_class("hermes", None, tokenizer=object(), model_config=None)
    assert built == "parser class"
    assert asked == [{"name": "hermes", "auto": True}]


def test_repetition_detection_reaches_the_engine_as_vllms_params():
    from vllm.sampling_params import RepetitionDetectionParams

    params = sampling_params(Sampling(max_tokens=8, repetition_detection=(8, 2, 3)))
    assert params.repetition_detection == RepetitionDetectionParams(
        max_pattern_size=8, min_pattern_size=2, min_count=3
    )
    assert sampling_params(Sampling(max_tokens=8)).repetition_detection is None


# --- a reasoning model's thinking (vLLM's qwen3 parser, which reads <think> as text) ---


def _thinking_job(*, stream: bool, include: bool = True, **kw: Any) -> Job:
    return _job(
        endpoint="chat",
        stream=stream,
        sampling=Sampling(max_tokens=64, logprobs=kw.pop("logprobs", None)),
        reasoning=Reasoning(
            parser="qwen3", template_kwargs='{"enable_thinking": true}', include=include
        ),
        **kw,
    )


def _real_steps(tokenizer: Any, text: str) -> list[Step]:
    """A step per token of `text` as the demo tokenizer encodes it, the last one stopping."""
    return _grouped_steps(
        tokenizer, [[t] for t in tokenizer.encode(text, add_special_tokens=False)]
    )


def _grouped_steps(tokenizer: Any, groups: list[list[int]]) -> list[Step]:
    """A step per group of token ids (as the engine hands over several when its reader lags),
    the last one stopping."""
    return [
        Step(
            text=tokenizer.decode(group, skip_special_tokens=True),
            tokens=len(group),
            finish_reason="stop" if i == len(groups) - 1 else None,
            prompt_tokens=3,
            token_ids=tuple(group),
        )
        for i, group in enumerate(groups)
    ]


THOUGHT = "They greet me, so I greet back.</think>Hello there."


async def test_a_reasoning_models_thinking_is_split_from_its_answer(tokenizer):
    for stream in (False, True):
        engine = _Engine({0: _real_steps(tokenizer, THOUGHT)}, tokenizer)
        events = await _served(engine, _thinking_job(stream=stream))
        deltas = [e for e in events if isinstance(e, Delta)]
        assert "".join(d.reasoning for d in deltas) == "They greet me, so I greet back."
        assert "".join(d.text for d in deltas) == "Hello there."
        end = events[-1]
        assert isinstance(end, Finished)
        thinking_ids = tokenizer.encode("They greet me, so I greet back.", add_special_tokens=False)
        assert end.reasoning_tokens is not None
        assert 0 < end.reasoning_tokens <= end.completion_tokens
        assert end.reasoning_tokens >= len(thinking_ids)
        # The engine heard the request's thinking: its template's variables for its parser.
        assert engine.thinking[0].template_kwargs == {"enable_thinking": True}


async def test_a_running_usage_counts_each_deltas_thinking_tokens(tokenizer):
    job = _thinking_job(stream=True)
    assert job.reasoning is not None
    running = msgspec.structs.replace(
        job, reasoning=msgspec.structs.replace(job.reasoning, running=True)
    )
    for asked, counted in ((job, False), (running, True)):
        events = await _served(_Engine({0: _real_steps(tokenizer, THOUGHT)}, tokenizer), asked)
        deltas = [e for e in events if isinstance(e, Delta)]
        thought = sum(d.thinking_tokens for d in deltas)
        # Every thinking token counted once, across the deltas; none unless asked for.
        assert thought == (events[-1].reasoning_tokens if counted else 0)


async def test_hidden_thinking_leaves_no_trace_in_the_answer(tokenizer):
    steps = _real_steps(tokenizer, THOUGHT)
    with_logprobs = [
        Step(
            text=step.text,
            tokens=step.tokens,
            finish_reason=step.finish_reason,
            prompt_tokens=step.prompt_tokens,
            token_ids=step.token_ids,
            logprobs=[TokenLogprob(token=step.text, logprob=-1.0)],
        )
        for step in steps
    ]
    job = _thinking_job(stream=True, include=False, logprobs=0)
    events = await _served(_Engine({0: with_logprobs}, tokenizer), job)
    deltas = [e for e in events if isinstance(e, Delta)]
    assert "".join(d.reasoning for d in deltas) == ""
    assert "".join(d.text for d in deltas) == "Hello there."
    assert all(d.logprobs is None and d.token_ids is None for d in deltas)
    assert sum(d.tokens for d in deltas) == len(steps)  # every token still billed


async def test_a_request_to_a_model_that_does_not_reason_has_no_thinking_count(tokenizer):
    events = await _served(_Engine({0: _real_steps(tokenizer, THOUGHT)}, tokenizer), _job())
    end = events[-1]
    assert isinstance(end, Finished) and end.reasoning_tokens is None
    assert "".join(e.text for e in events if isinstance(e, Delta)) == THOUGHT


async def test_the_billed_thinking_count_is_the_same_however_tokens_were_grouped(tokenizer):
    # vLLM's streaming parser counts one thought fewer when the last one arrives in the same
    # step as the end token (the engine groups steps when its reader falls behind).
    thought = tokenizer.encode("Here it is.", add_special_tokens=False)
    end_token = tokenizer.eos_token_id
    one_by_one = [[token] for token in [*thought, end_token]]
    grouped = [[token] for token in thought[:-1]] + [[thought[-1], end_token]]
    counts = []
    for groups in (one_by_one, grouped):
        events = await _served(
            _Engine({0: _grouped_steps(tokenizer, groups)}, tokenizer), _thinking_job(stream=True)
        )
        assert isinstance(events[-1], Finished)
        counts.append(events[-1].reasoning_tokens)
    assert counts == [len(thought), len(thought)]
