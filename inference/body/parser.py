"""Parse and validate OpenAI request bodies into typed requests; errors name the field."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from config.json_body import BodyProblem, json_document
from dataplane.types import Structured
from inference.base.errors import ApiError, invalid
from inference.body.fields import (
    CHAT,
    COMPLETIONS,
    GENERATION_FIELDS,
    MAX_BEAMS,
    MAX_CHOICES,
    SERVICE_TIERS,
    fields_read,
    unsupported_refuse,
)
from inference.body.inputs import MODEL
from inference.body.tools import ToolUse, compiled_for, tools_parse
from inference.body.types import type_error

T = TypeVar("T")

# The endpoints' names, which callers read with the request types here.
__all__ = ["CHAT", "COMPLETIONS"]


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: str
    model: str
    # Chat: every message as the template reads it (role, content text, name, tool_calls,
    # tool_call_id). Completions: `prompts` holds each prompt, `prompt` the first.
    messages: list[dict[str, Any]] | None
    prompt: str | list[int] | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: list[str]
    ignore_eos: bool
    min_tokens: int
    presence_penalty: float
    frequency_penalty: float
    stream: bool
    include_usage: bool
    user: str | None
    priority: str = "interactive"
    timeout: float | None = None
    prompts: tuple[str | list[int], ...] = ()
    n: int = 1
    repetition_penalty: float = 1.0
    # vLLM's repetition_detection: (max_pattern_size, min_pattern_size, min_count); None: off.
    repetition_detection: tuple[int, int, int] | None = None
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    bad_words: tuple[str, ...] = ()
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Chat: logprobs true gives top_logprobs alternatives; completions: logprobs is the count.
    logprobs: int | None = None
    # vLLM's logprob_token_ids: each generated position lists the sampled token and exactly
    # these tokens, in place of the likeliest alternatives (logprobs is set with them).
    logprob_token_ids: tuple[int, ...] | None = None
    echo: bool = False
    structured: Structured | None = None
    tools: ToolUse | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # vLLM's cache_salt: prefix-cache hits only among the tenant's requests with this salt.
    cache_salt: str | None = None
    # vLLM's allowed_token_ids: the only tokens the output may hold (None: any).
    allowed_token_ids: tuple[int, ...] | None = None
    # Whether tokenising a text prompt adds the special tokens (BOS): vLLM's default is true on
    # completions, false on chat (its template writes them).
    add_special_tokens: bool | None = None
    # vLLM's chat_template_kwargs: variables for the chat template (Qwen3's enable_thinking).
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's documents: objects of strings the chat template may list (RAG); None: none.
    documents: tuple[dict[str, str], ...] | None = None
    # vLLM's return_tokens_as_token_ids: logprobs name tokens 'token_id:<id>'.
    tokens_as_ids: bool = False
    # vLLM's return_token_ids: the answer carries the prompt's and the output's token ids.
    return_token_ids: bool = False
    # vLLM's return_prompt_text (chat): the answer carries the rendered chat template.
    return_prompt_text: bool = False
    # vLLM's prompt_logprobs: each prompt token's logprob and rank, and this many of the
    # likeliest tokens at its position (None: not asked for).
    prompt_logprobs: int | None = None
    # vLLM's prompt truncation: keep this many tokens of each prompt (-1: as many as fit),
    # cut from `truncation_side` ("left" keeps the last; None: the tokenizer's side).
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    # vLLM's beam search: n beams, ranked at the end by log probability over length to the
    # power length_penalty.
    beam_search: bool = False
    length_penalty: float = 1.0
    # A reasoning model's: whether the answer carries its thinking (vLLM's include_reasoning),
    # and how many tokens the thinking may take (thinking_token_budget; None: no bound).
    include_reasoning: bool = True
    thinking_token_budget: int | None = None
    # vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries
    # its choice's usage so far.
    continuous_usage: bool = False
    # vLLM's /v1/chat/completions/batch: every conversation, each answered as one choice (its
    # index); `messages` is the first. Empty for any other request.
    conversations: tuple[list[dict[str, Any]], ...] = ()
    # The Responses API's truncation "auto": the conversation's oldest turns are dropped until
    # its prompt fits (inference.pipeline.tokenization.turns_fitted).
    truncate_turns: bool = False
    # Completions' echo with max_tokens 0 (how OpenAI's older API and vLLM's server score a
    # prompt): the engine makes one token (max_tokens is 1), which the answer leaves out of
    # its text and logprobs and counts in its usage, as vLLM's server does.
    prompt_only: bool = False

    @property
    def answered_with_prompt_ids(self) -> bool:
        """Whether the answer needs its prompts' token ids: to return them (return_token_ids),
        to echo them, or to count them in a stream's running usage."""
        return self.return_token_ids or self.echo or self.continuous_usage

    def chats(self) -> tuple[list[dict[str, Any]], ...]:
        """A chat request's conversations: a batch's, or its one (none for completions)."""
        if self.conversations:
            return self.conversations
        return () if self.messages is None else (self.messages,)

    def with_chats(self, chats: list[list[dict[str, Any]]]) -> GenerationRequest:
        """The request with its conversations replaced (a content policy's redaction)."""
        if self.conversations:
            return dataclasses.replace(self, messages=chats[0], conversations=tuple(chats))
        return dataclasses.replace(self, messages=chats[0])


def body_problem(problem: BodyProblem) -> ApiError:
    """Return the 400 of a body that breaks the JSON limits (config.json_body)."""
    return ApiError(400, problem.code, problem.message, param=problem.param)


def body_parse(raw: bytes) -> dict[str, Any]:
    """Return the JSON object of a request body or raise a 400 saying what is wrong.

    The body meets the limits of every JSON body (config.json_body): no lone surrogate
    anywhere, at most 32 levels deep, finite numbers within 64 bits.
    """
    if not raw.strip():
        raise ApiError(400, "invalid_json", "The request body is empty; send a JSON object.")
    try:
        body = json_document(raw)
    except BodyProblem as problem:
        raise body_problem(problem) from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return body


def generation_parse(
    body: dict[str, Any], *, endpoint: str, tenant_id: int | None = None
) -> GenerationRequest:
    """Return the typed request of a chat or completions body, or raise a 400.

    Every field is read through its declaration in GENERATION_FIELDS (the same one the
    OpenAPI document publishes); what is left here are the rules between fields. `tenant_id`,
    whose request it is, keeps the schemas it compiles apart from other tenants'
    (inference.body.tools.compiled_for; None: the caller's scope).
    """
    if tenant_id is None:
        return _fields_read(body, endpoint=endpoint)
    with compiled_for(tenant_id):
        return _fields_read(body, endpoint=endpoint)


# The fields a chat or completions request keeps as the body sends them, under the same
# name, in the order they are read (after the fields the rules between fields look at).
_AS_SENT = (
    "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "min_tokens",
    "presence_penalty", "frequency_penalty", "stream", "user", "timeout", "repetition_penalty",
    "repetition_detection", "min_p", "stop_token_ids", "bad_words", "logit_bias",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
)  # fmt: skip
# Read after tools and structured output: the engine's options, and the template's.
_OPTIONS = (
    "cache_salt", "allowed_token_ids", "add_special_tokens", "chat_template_kwargs",
    "reasoning_effort", "documents", "return_tokens_as_token_ids", "truncate_prompt_tokens",
    "truncation_side", "return_token_ids", "return_prompt_text", "use_beam_search",
    "length_penalty", "include_reasoning", "thinking_token_budget",
)  # fmt: skip
# Of those, what shapes a chat's template or answer alone: a completion does not read them.
_CHAT_OPTIONS = frozenset(
    ("chat_template_kwargs", "reasoning_effort", "documents", "return_prompt_text",
     "include_reasoning")
)  # fmt: skip
_COMPLETION_OPTIONS = tuple(name for name in _OPTIONS if name not in _CHAT_OPTIONS)


def _fields_read(body: dict[str, Any], *, endpoint: str) -> GenerationRequest:
    """Read a body's fields through their declarations, then check the rules between them.

    The fields are read in passes, each rule between fields checked as soon as the fields
    it looks at are read, so a body wrong in several ways is refused for the first of them.
    """
    model = MODEL.read(body, "model")
    unsupported_refuse(body, GENERATION_FIELDS, endpoint=endpoint)
    chat = endpoint == CHAT
    prompt_only = _prompt_only(body, chat=chat)
    if prompt_only:
        body = {**body, "max_tokens": 1}
    shape = fields_read(
        body,
        GENERATION_FIELDS,
        ("max_tokens", "max_completion_tokens", "add_generation_prompt", "continue_final_message")
        if chat
        else ("max_tokens", "prompt"),
    )
    max_tokens = (
        (shape["max_completion_tokens"] or shape["max_tokens"]) if chat else shape["max_tokens"]
    )
    prompts: tuple[str | list[int], ...] = () if chat else shape["prompt"]
    add_generation_prompt = shape["add_generation_prompt"] if chat else True
    continue_final_message = shape["continue_final_message"] if chat else False
    if add_generation_prompt and continue_final_message:
        raise invalid(
            "continue_final_message",
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true.",
        )
    n = GENERATION_FIELDS["n"].read(body, "n")
    if n * max(len(prompts), 1) > MAX_CHOICES:
        # Every choice reserves max_tokens: one request answers at most OpenAI's n limit.
        message = f"n × prompts is at most {MAX_CHOICES}, got {n} × {len(prompts)}."
        raise invalid("n", message)
    flow = fields_read(body, GENERATION_FIELDS, ("service_tier", "prompt_logprobs"))
    if flow["prompt_logprobs"] and GENERATION_FIELDS["stream"].read(body, "stream"):
        # As vLLM's server: a stream's chunks have no place for them (0 asks for nothing).
        raise invalid("prompt_logprobs", "'prompt_logprobs' are not available when streaming.")
    echo, stream_options = fields_read(body, GENERATION_FIELDS, ("echo", "stream_options")).values()
    logprobs = _chat_logprobs(body) if chat else _completion_logprobs(body)
    logprob_token_ids = _logprob_token_ids(body, logprobs, chat=chat, echo=echo)
    messages = GENERATION_FIELDS["messages"].read(body, "messages") if chat else None
    sent = fields_read(body, GENERATION_FIELDS, _AS_SENT)
    structured = _structured(body)
    tools = tools_parse(body) if chat else None
    sent["stop_token_ids"] = tuple(sent["stop_token_ids"])
    sent["bad_words"] = tuple(sent["bad_words"])
    options = fields_read(body, GENERATION_FIELDS, _OPTIONS if chat else _COMPLETION_OPTIONS)
    tier = flow["service_tier"]
    request = GenerationRequest(
        endpoint=endpoint,
        model=model,
        messages=messages,
        prompt=prompts[0] if len(prompts) == 1 else None,
        prompts=prompts,
        max_tokens=max_tokens,
        **sent,
        include_usage=stream_options[0],
        continuous_usage=stream_options[1],
        priority=SERVICE_TIERS[tier] if tier is not None else "interactive",
        n=n,
        logprobs=logprobs,
        logprob_token_ids=logprob_token_ids,
        echo=echo,
        structured=structured,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        cache_salt=options["cache_salt"],
        allowed_token_ids=_tuple_or_none(options["allowed_token_ids"]),
        add_special_tokens=options["add_special_tokens"],
        chat_template_kwargs=(
            template_kwargs_with_effort(
                options["chat_template_kwargs"], options["reasoning_effort"]
            )
            if chat
            else None
        ),
        documents=_tuple_or_none(options["documents"]) if chat else None,
        tokens_as_ids=options["return_tokens_as_token_ids"],
        truncate_prompt_tokens=options["truncate_prompt_tokens"],
        truncation_side=options["truncation_side"],
        return_token_ids=options["return_token_ids"],
        return_prompt_text=bool(options["return_prompt_text"]) if chat else False,
        prompt_logprobs=flow["prompt_logprobs"],
        beam_search=bool(options["use_beam_search"]),
        length_penalty=options["length_penalty"],
        include_reasoning=options["include_reasoning"] if chat else True,
        thinking_token_budget=_budget(options["thinking_token_budget"]),
        prompt_only=prompt_only,
    )
    _beam_search_check(request, body)
    return request


def _prompt_only(body: dict[str, Any], *, chat: bool) -> bool:
    """Whether a completions body asks for its prompt alone: echo with max_tokens 0."""
    zero = body.get("max_tokens")
    if chat or body.get("echo") is not True or zero != 0 or isinstance(zero, bool):
        return False
    if body.get("logprob_token_ids"):
        # As vLLM's server refuses it: no output token to list those ids at.
        raise invalid(
            "logprob_token_ids",
            "'logprob_token_ids' needs output tokens: not with echo and max_tokens 0.",
        )
    return True


# What vLLM's beam search does not use: its BeamSearchParams take the beam width (n),
# max_tokens, temperature, ignore_eos, length_penalty, include_stop_str_in_output and
# skip_special_tokens, and the rest of a request's sampling would be dropped. Each entry says
# whether the request asked for something with the field.
_BEAM_UNUSED: dict[str, Callable[[GenerationRequest], bool]] = {
    "top_p": lambda r: r.top_p not in (None, 1.0),
    "top_k": lambda r: r.top_k not in (None, 0, -1),
    "min_p": lambda r: r.min_p != 0.0,
    "seed": lambda r: r.seed is not None,
    "stop": lambda r: bool(r.stop),
    "stop_token_ids": lambda r: bool(r.stop_token_ids),
    "min_tokens": lambda r: r.min_tokens != 0,
    "presence_penalty": lambda r: r.presence_penalty != 0.0,
    "frequency_penalty": lambda r: r.frequency_penalty != 0.0,
    "repetition_penalty": lambda r: r.repetition_penalty != 1.0,
    "repetition_detection": lambda r: r.repetition_detection is not None,
    "logit_bias": lambda r: bool(r.logit_bias),
    "bad_words": lambda r: bool(r.bad_words),
    "allowed_token_ids": lambda r: r.allowed_token_ids is not None,
    "logprobs": lambda r: r.logprobs is not None,
    "prompt_logprobs": lambda r: r.prompt_logprobs is not None,
    "echo": lambda r: r.echo,
    "response_format": lambda r: r.structured is not None,  # or structured_outputs
    "tools": lambda r: r.tools is not None,  # or the legacy functions
    "spaces_between_special_tokens": lambda r: not r.spaces_between_special_tokens,
}


def _budget(value: int | None) -> int | None:
    """A thinking budget as the engine takes it: -1 (no bound) is none."""
    return None if value == -1 else value


def template_kwargs_with_effort(
    kwargs: dict[str, Any] | None, effort: str | None
) -> dict[str, Any] | None:
    """The chat template's variables with a reasoning effort, as vLLM's server merges them:
    the effort wins over a `reasoning_effort` in the kwargs, and sets `enable_thinking` (off
    for "none") only where the kwargs leave it out."""
    if effort is None:
        return kwargs
    merged = {"enable_thinking": effort != "none", **(kwargs or {})}
    merged["reasoning_effort"] = effort
    return merged


def _beam_search_check(request: GenerationRequest, body: dict[str, Any]) -> None:
    """Refuse what beam search would drop, and length_penalty where nothing ranks beams."""
    if not request.beam_search:
        if request.length_penalty != 1.0:
            raise ApiError(
                400,
                "unsupported_parameter",
                "'length_penalty' ranks the beams of a beam search; send use_beam_search: true.",
                param="length_penalty",
            )
        return
    if request.stream and request.endpoint == COMPLETIONS:
        # As vLLM's server answers (its chat streams a beam search's answer, its completions not).
        raise invalid("stream", "Streaming is not currently supported with beam search.")
    if request.n > MAX_BEAMS:
        # Each step asks the engine for twice as many alternatives as beams (max_logprobs).
        raise invalid("n", f"Beam search keeps at most {MAX_BEAMS} beams (n), got {request.n}.")
    for field, asked in _BEAM_UNUSED.items():
        if asked(request):
            if field == "response_format" and body.get(field) is None:
                field = "structured_outputs"
            elif field == "tools" and body.get(field) is None:
                field = "functions"
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'{field}' is not used by beam search; leave it out with use_beam_search.",
                param=field,
            )


def _tuple_or_none(values: list[T] | None) -> tuple[T, ...] | None:
    return None if values is None else tuple(values)


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's logprobs: a boolean, with top_logprobs (0-20) alternatives per token."""
    wanted = GENERATION_FIELDS["logprobs"].read(body, "logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise type_error("logprobs", "a boolean", wanted)
    top = GENERATION_FIELDS["top_logprobs"].read(body, "top_logprobs")
    if top and not wanted:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.")
    return (top or 0) if wanted else None


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions' logprobs: how many alternatives each token comes with (0-20)."""
    count = GENERATION_FIELDS["logprobs"].read(body, "logprobs")
    if isinstance(count, bool):
        raise type_error("logprobs", "an integer", count)
    return count


def _logprob_token_ids(
    body: dict[str, Any], logprobs: int | None, *, chat: bool, echo: bool
) -> tuple[int, ...] | None:
    """vLLM's logprob_token_ids, which need logprobs asked for.

    They take the place of the likeliest alternatives at each generated position, so a count
    of alternatives beside them would ask for something that does not come: chat's
    top_logprobs, and completions' logprobs but for an echo, whose prompt positions it counts.
    """
    ids = GENERATION_FIELDS["logprob_token_ids"].read(body, "logprob_token_ids")
    if ids is None:
        return None
    if logprobs is None:
        needed = "'logprobs' set to true" if chat else "'logprobs' set"
        raise invalid("logprob_token_ids", f"When using 'logprob_token_ids', {needed}.")
    if logprobs and (chat or not echo):
        field = "top_logprobs" if chat else "logprobs"
        raise invalid(
            field,
            f"'{field}' asks for the likeliest alternatives, which 'logprob_token_ids' "
            "replaces: each position lists the sampled token and those ids. Send 0.",
        )
    return tuple(ids)


def _structured(body: dict[str, Any]) -> Structured | None:
    """The request's output constraint: response_format or vLLM's structured_outputs."""
    fmt = GENERATION_FIELDS["response_format"].read(body, "response_format")
    extra = GENERATION_FIELDS["structured_outputs"].read(body, "structured_outputs")
    if fmt is not None and extra is not None:
        raise invalid(
            "structured_outputs", "Send either 'response_format' or 'structured_outputs', not both."
        )
    return fmt or extra


EMBEDDINGS = "embeddings"


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[str] | list[list[int]]  # texts, or inputs already as token ids
    encoding_format: str
    dimensions: int | None
    user: str | None
    priority: str = "interactive"
    timeout: float | None = None
    # As on generation: keep this many tokens of each input (-1: the context).
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    # vLLM's: the number type and byte order of base64 vectors.
    embed_dtype: str = "float32"
    endianness: str = "native"
    # vLLM's use_activation: False leaves vectors as the model pools them (not normalised).
    use_activation: bool = True

    @property
    def tokenized(self) -> bool:
        return bool(self.inputs) and isinstance(self.inputs[0], list)
