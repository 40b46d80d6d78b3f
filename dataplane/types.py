"""Typed, versioned messages between frontends, workers and the ingester (msgpack on the wire)."""

from __future__ import annotations

import enum
from typing import TypeVar

import msgspec

WIRE_VERSION = 1


class Structured(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A constraint on the output that the engine's structured decoding enforces; one is set.

    The frontend checked it compiles. `json` is a JSON schema as text.
    """

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    whitespace_pattern: str | None = None
    # vLLM's structural tag (JSON text): what a tool parser constrains tool calls with.
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False


class Sampling(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How the engine samples: vLLM's SamplingParams, as the frontend validated them."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = []
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1  # choices per prompt
    repetition_penalty: float = 1.0
    # vLLM's repetition_detection: (max_pattern_size, min_pattern_size, min_count); None: off.
    repetition_detection: tuple[int, int, int] | None = None
    min_p: float = 0.0
    stop_token_ids: list[int] = []
    bad_words: list[str] = []
    logit_bias: dict[int, float] = {}
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Log probabilities of each sampled token and of this many alternatives; None: none.
    logprobs: int | None = None
    # vLLM's logprob_token_ids: the tokens each position lists beside the sampled one, in
    # place of the `logprobs` likeliest (which is then 0, or counts only an echo's prompt).
    logprob_token_ids: list[int] = []
    # The same for every prompt token (vLLM's `prompt_logprobs`, or `echo`); None: none.
    prompt_logprobs: int | None = None
    # The prompt's log probabilities open the text's (completions' `echo` with `logprobs`);
    # otherwise they go only where vLLM's `prompt_logprobs` field puts them.
    prompt_in_logprobs: bool = False
    structured: Structured | None = None
    # The only token ids the output may hold; None: any.
    allowed_token_ids: list[int] | None = None
    # Log probabilities name each token 'token_id:<id>' instead of its text (vLLM's
    # return_tokens_as_token_ids); the engine does not see it.
    logprob_tokens_as_ids: bool = False
    # Each delta carries the ids of its tokens (vLLM's return_token_ids).
    output_token_ids: bool = False
    # Each choice's first delta carries its prompt's token ids: an answer that lists them
    # (return_token_ids, echo) can be rebuilt from the reply stream alone (a replay).
    prompt_ids_in_reply: bool = False
    # vLLM's beam search: `n` beams; finished ones rank by log probability over their length
    # to the power `length_penalty`. It uses max_tokens, temperature, ignore_eos,
    # include_stop_str_in_output and skip_special_tokens, and nothing else above.
    beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's thinking_token_budget: the engine ends a reasoning model's thinking after this
    # many tokens (its reasoning parser's end marker, forced); None: no bound.
    thinking_token_budget: int | None = None


class Tools(msgspec.Struct, frozen=True, kw_only=True):
    """A chat request's tools: the worker parses the model's output into tool calls.

    `tools` and `choice` are the request's `tools` and `tool_choice` as JSON text (a named
    choice is an object); `parser` is the tool parser of the model version's manifest
    (vLLM's names: hermes, llama3_json, mistral, ...).
    """

    parser: str
    tools: str
    choice: str = '"auto"'
    parallel: bool | None = None


class Reasoning(msgspec.Struct, frozen=True, kw_only=True):
    """A chat request to a reasoning model: the worker splits its thinking from its answer.

    `parser` is the reasoning parser of the model version's manifest (vLLM's names: qwen3,
    deepseek_r1, ...); `template_kwargs` the chat template's variables the prompt was
    rendered with, as JSON text (Qwen3's parser reads `enable_thinking` from them);
    `include` false leaves the thinking out of the answer (vLLM's include_reasoning).
    """

    parser: str
    template_kwargs: str = "{}"
    include: bool = True
    # A stream's running usage (vLLM's continuous_usage_stats): each delta counts the thinking
    # tokens it took, which costs a count over the choice's tokens per delta.
    running: bool = False


class Resumed(msgspec.Struct, frozen=True, kw_only=True):
    """What a running request had produced when its worker handed it on (a preempted worker
    draining): the next worker feeds these tokens back as prompt and carries on from there."""

    token_ids: list[int]
    started_at: float
    first_token_at: float | None = None


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a worker needs to run one request; the prompt is already token ids."""

    v: int = WIRE_VERSION
    request_id: str
    tenant_id: int
    api_key_id: int
    deployment: str
    model_version: str
    endpoint: str
    prompt_token_ids: list[int]
    sampling: Sampling
    priority: str = "interactive"  # or "batch"; interactive always goes first
    weight: float = 1.0  # the tenant's share of fair dispatch
    enqueued_at: float
    deadline: float
    reply_ttl: int = 0  # seconds to keep the reply stream; 0: the platform's default
    # A LoRA adapter version (its digest) the base model's worker applies; "" for none.
    adapter: str = ""
    # A copy for a candidate version: nobody reads its output and it is not billed.
    shadow: bool = False
    user: str = ""  # the client's `user` tag, kept on the usage record
    # False when nobody reads the output token by token (a non-streaming or batch request):
    # the worker then writes its text in a few large events instead of one per flush.
    stream: bool = True
    # An embeddings request: prompt_token_ids holds its inputs end to end, these long each.
    input_lengths: list[int] = []
    # An embeddings request's vLLM `use_activation`: False sends its vectors as the model
    # pools them, not normalised to unit length where the model's files ask for that.
    use_activation: bool = True
    # W3C trace context: the trace and the frontend's span, the worker's parent.
    trace_id: str = ""
    parent_span_id: str = ""
    # A chat request with tools whose output the worker parses into tool calls.
    tools: Tools | None = None
    # A chat request to a reasoning model, whose thinking the worker splits from its answer.
    reasoning: Reasoning | None = None
    # Set when a stopping worker handed the running request on (see Resumed).
    resumed: Resumed | None = None
    # The alias the client named, when it could not take the request and its fallback did.
    fallback_from: str = ""
    # The client's cache_salt: its requests share cached prompt prefixes only with requests
    # of the same tenant and salt (see prefix_salt).
    cache_salt: str = ""
    # The max_tokens the client asked for, when admission capped `sampling.max_tokens` below
    # it so that the request finishes before its deadline (its tenant opted in); 0: not capped.
    max_tokens_requested: int = 0

    def inputs(self) -> list[list[int]]:
        """The token ids of each input of an embeddings request or of a completions request
        with several prompts (one input when `input_lengths` is empty)."""
        if not self.input_lengths:
            return [self.prompt_token_ids]
        out, start = [], 0
        for length in self.input_lengths:
            out.append(self.prompt_token_ids[start : start + length])
            start += length
        return out

    @property
    def choices(self) -> int:
        """How many choices the request answers: n per prompt."""
        return max(len(self.input_lengths), 1) * self.sampling.n

    @property
    def prefix_salt(self) -> str:
        """The salt of the engine's prefix cache for this job: its tenant, then its cache_salt.

        vLLM reuses a cached prompt prefix only for a request with the same salt, so no tenant's
        request is ever served from (or can time) another tenant's cached prompts. The forms
        "<tenant>" and "<tenant>:<salt>" never meet: a client's salt is never empty.
        """
        if self.cache_salt:
            return f"{self.tenant_id}:{self.cache_salt}"
        return str(self.tenant_id)

    @property
    def resumed_tokens(self) -> int:
        """Completion tokens produced (and sent) before the request was handed on."""
        return len(self.resumed.token_ids) if self.resumed is not None else 0

    @property
    def reserved_tokens(self) -> int:
        """Prompt + every choice's max_tokens: what admission reserves and dispatch charges."""
        return len(self.prompt_token_ids) + self.sampling.max_tokens * self.choices


class Status(enum.StrEnum):
    """How a request ended; every value means finished."""

    OK = "ok"
    CANCELLED = "cancelled"
    ERROR = "error"
    WORKER_LOST = "worker_lost"
    TIMEOUT = "timeout"


class Started(msgspec.Struct, frozen=True, tag="started"):
    at: float


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One of the likeliest tokens at a position: its text, log probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """A sampled (or prompt) token's log probability and its likeliest alternatives.

    As vLLM's server shapes them: `logprob` None for a prompt's first token (it has none).
    """

    token: str
    logprob: float | None
    bytes: list[int] | None = None
    top: list[TopLogprob] = []


class RankedLogprob(msgspec.Struct, frozen=True, array_like=True):
    """A token at one prompt position as vLLM's `prompt_logprobs` lists it: its id, log
    probability, rank among the vocabulary (1: the likeliest) and text."""

    token_id: int
    logprob: float
    rank: int | None = None
    decoded: str | None = None


class ToolCallDelta(msgspec.Struct, frozen=True, array_like=True):
    """A piece of a tool call as OpenAI streams it: id and name first, then the arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class Delta(msgspec.Struct, frozen=True, tag="delta", omit_defaults=True):
    """New output of one choice: text, the tokens it took, and what the request asked for.

    `index` is the choice (n > 1, or several prompts: prompt * n + choice). `tool_calls`:
    the output parsed into tool calls (text then holds only the content beside them).
    `prompt_logprobs`: the prompt's tokens, sent once before any output (`echo`).
    `prompt_ranked`: the same positions as vLLM's `prompt_logprobs` field lists them (the
    prompt's token and the likeliest ones, with ids and ranks; None for the first token), sent
    once, for an answer that is not streamed. `prompt_token_ids`: the choice's prompt, on its
    first delta, when the request's sampling asks for it (`prompt_ids_in_reply`).
    """

    text: str
    tokens: int
    index: int = 0
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCallDelta] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    # The ids of the tokens this delta took, when the request asked for them.
    token_ids: list[int] | None = None
    prompt_ranked: list[list[RankedLogprob] | None] | None = None
    prompt_token_ids: list[int] | None = None
    # A reasoning model's thinking, split from `text` by its reasoning parser.
    reasoning: str = ""
    # Of `tokens`, those that were thinking (counted only for a running usage: Reasoning).
    thinking_tokens: int = 0

    def joins(self, later: Delta) -> bool:
        """Whether a later delta can be merged into this one (the same choice's output)."""
        return (
            later.index == self.index
            and later.prompt_logprobs is None
            and later.prompt_ranked is None
            and later.prompt_token_ids is None
        )

    def then(self, later: Delta) -> Delta:
        """This delta and a later one of the same choice, as one (see `joins`)."""
        return Delta(
            text=self.text + later.text,
            tokens=self.tokens + later.tokens,
            index=self.index,
            logprobs=_joined(self.logprobs, later.logprobs),
            tool_calls=_calls_joined(self.tool_calls, later.tool_calls),
            prompt_logprobs=self.prompt_logprobs,
            token_ids=_joined(self.token_ids, later.token_ids),
            prompt_ranked=self.prompt_ranked,
            prompt_token_ids=self.prompt_token_ids,
            reasoning=self.reasoning + later.reasoning,
            thinking_tokens=self.thinking_tokens + later.thinking_tokens,
        )


T = TypeVar("T")


def _joined(first: list[T] | None, then: list[T] | None) -> list[T] | None:
    """Two lists one after the other; None where neither is there."""
    if first is None or then is None:
        return first if then is None else then
    return first + then


def _calls_joined(
    first: list[ToolCallDelta] | None, then: list[ToolCallDelta] | None
) -> list[ToolCallDelta] | None:
    """Tool-call pieces one after the other; a call's consecutive pieces become one."""
    if first is None or then is None:
        return first if then is None else then
    calls = list(first)
    for piece in then:
        last = calls[-1] if calls else None
        if last is not None and last.index == piece.index and piece.id is None:
            calls[-1] = ToolCallDelta(
                index=last.index,
                id=last.id,
                name=last.name if piece.name is None else (last.name or "") + piece.name,
                arguments=last.arguments + piece.arguments,
            )
        else:
            calls.append(piece)
    return calls


class Embeddings(msgspec.Struct, frozen=True, tag="embeddings"):
    """The vectors of an embeddings request: float32, little-endian, one row per input."""

    data: bytes
    dimensions: int


class Finished(msgspec.Struct, frozen=True, tag="finished", omit_defaults=True):
    """The request ended well. `finish_reason` is choice 0's; `finish_reasons` every choice's
    (empty: one choice). Tokens count every prompt and every choice; `cached_tokens` are the
    prompt tokens the engine's prefix cache served."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reasons: list[str] = []
    # Of the completion tokens, those a reasoning model spent thinking (every choice's);
    # None: the version has no reasoning parser.
    reasoning_tokens: int | None = None
    # vLLM's stop_reason of every choice, in index order: the stop string or stop token id
    # that ended it (None: its end of sequence or its length); empty: none ended so.
    stop_reasons: list[str | int | None] = []
    # Prompt tokens the engine computed and wrote to its prefix cache for this request.
    cache_created_tokens: int = 0
    # Choice 0's stop string under the name the release before `stop_reasons` wrote and read
    # it by: written beside them for that release's frontends, and read where a worker of
    # that release left `stop_reasons` out (a rolling upgrade, either way round).
    stop_string: str | None = msgspec.field(default=None, name="stop_sequence")

    def reasons(self) -> list[str]:
        """The finish reason of every choice, in index order."""
        return self.finish_reasons or [self.finish_reason]

    def stop_reason(self, index: int) -> str | int | None:
        """The stop string or token id that ended a choice (None: neither did)."""
        if index < len(self.stop_reasons):
            return self.stop_reasons[index]
        return self.stop_string if index == 0 and not self.stop_reasons else None

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended choice 0, if one did (Anthropic's `stop_sequence`)."""
        stop = self.stop_reason(0)
        return stop if isinstance(stop, str) else None


class Failed(msgspec.Struct, frozen=True, tag="error"):
    code: str
    message: str
    prompt_tokens: int
    completion_tokens: int


Event = Started | Delta | Embeddings | Finished | Failed
TERMINAL = (Finished, Failed)


class UsageEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One per accepted request, whatever its outcome; the ingester makes it a UsageRecord."""

    v: int = WIRE_VERSION
    request_id: str
    tenant_id: int
    api_key_id: int
    deployment: str
    model_version: str
    endpoint: str
    status: Status
    finish_reason: str = ""
    error_code: str = ""
    prompt_tokens: int
    completion_tokens: int
    enqueued_at: float
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float
    shadow: bool = False
    user: str = ""
    priority: str = "interactive"
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache
    cache_created_tokens: int = 0  # prompt tokens computed and written to the prefix cache
    reasoning_tokens: int = 0  # completion tokens a reasoning model spent thinking
    trace_id: str = ""
    # Answered from the tenant's response cache, billed at this share of the full price.
    response_cache: bool = False
    bill_percent: int = 100
    fallback_from: str = ""  # the alias the client named, when its fallback answered
    capped_max_tokens: int = 0  # the max_tokens admission capped the request to; 0: none


job_encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(Job)
event_decoder = msgspec.msgpack.Decoder(Event)
usage_decoder = msgspec.msgpack.Decoder(UsageEvent)


def encode(message: msgspec.Struct) -> bytes:
    return job_encoder.encode(message)


def usage_for(
    job: Job,
    *,
    status: Status,
    finished_at: float,
    started_at: float | None = None,
    first_token_at: float | None = None,
    completion_tokens: int | None = None,
    finish_reason: str = "",
    error_code: str = "",
    cached_tokens: int = 0,
    prompt_tokens: int | None = None,
    cache_created_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> UsageEvent:
    """Build the usage event of a job; its prompt counts in full unless told otherwise.

    Without a count of completion tokens, those produced before the job was handed on (none
    for most jobs) are billed: a resumed job ended in the queue still made them.
    """
    return UsageEvent(
        request_id=job.request_id,
        tenant_id=job.tenant_id,
        api_key_id=job.api_key_id,
        deployment=job.deployment,
        model_version=job.model_version,
        endpoint=job.endpoint,
        status=status,
        finish_reason=finish_reason,
        error_code=error_code,
        prompt_tokens=len(job.prompt_token_ids) if prompt_tokens is None else prompt_tokens,
        completion_tokens=job.resumed_tokens if completion_tokens is None else completion_tokens,
        enqueued_at=job.enqueued_at,
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=finished_at,
        shadow=job.shadow,
        user=job.user,
        priority=job.priority,
        cached_tokens=cached_tokens,
        cache_created_tokens=cache_created_tokens,
        reasoning_tokens=reasoning_tokens,
        trace_id=job.trace_id,
        fallback_from=job.fallback_from,
        capped_max_tokens=job.sampling.max_tokens if job.max_tokens_requested else 0,
    )
