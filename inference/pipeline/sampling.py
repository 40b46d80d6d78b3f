"""What a request asks of the engine: its sampling parameters and the tool calls to parse.

Both are checked against the route and the tenant here, on the frontend, so a request the
engine would refuse is a 400 before anything is reserved.
"""

from __future__ import annotations

import json

from dataplane.types import Reasoning, Sampling, Tools
from inference.base.errors import ApiError
from inference.body.fields import CHAT
from inference.body.parser import GenerationRequest
from inference.pipeline.auth import Principal
from models_registry.selectors import Route

GREEDY_TEMPERATURE = 1e-5  # below it vLLM samples greedily
# The most log probabilities an answer's prompt_logprobs may list (positions x (alternatives
# + 1) x the choices that each list their prompt's): about 16 MB of JSON, which a frontend
# builds on its event loop. An 8k-token prompt with 20 alternatives fits; 128 choices of a
# long prompt would be hundreds of megabytes, and would stall every stream on that frontend.
MAX_PROMPT_LOGPROBS = 2**18


def sampling_build(
    *, request: GenerationRequest, route: Route, principal: Principal, prompt_tokens: int
) -> Sampling:
    """Return the sampling parameters of a request after enforcing token and context limits.

    `prompt_tokens` is the longest prompt's length (a completions request may send several).
    """
    prompt_param = "messages" if request.endpoint == CHAT else "prompt"
    if prompt_tokens == 0:
        # The engine refuses an empty prompt; the client hears why, not a 503.
        message = f"The {prompt_param} is empty: it has no tokens."
        raise ApiError(400, "invalid_value", message, param=prompt_param)
    context = min(route.context_length, principal.max_context_tokens)
    if prompt_tokens >= context:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, your "
            f"{prompt_param} resulted in {prompt_tokens} tokens.",
            param=prompt_param,
        )
    cap = principal.max_tokens_per_request
    if request.max_tokens is not None and request.max_tokens > cap:
        raise ApiError(
            400,
            "max_tokens_exceeded",
            f"max_tokens is {request.max_tokens}, but this tenant allows at most {cap}.",
            param="max_tokens",
        )
    max_tokens = request.max_tokens or min(cap, context - prompt_tokens)
    if request.truncate_prompt_tokens is not None:
        # A client that has its prompt truncated asks for the request to fit: as vLLM's server
        # does then, the output gets what the context has left after the prompt kept.
        max_tokens = min(max_tokens, context - prompt_tokens)
    if prompt_tokens + max_tokens > context:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_param}, "
            f"{max_tokens} in the completion). Reduce the {prompt_param} or max_tokens.",
            param="max_tokens",
        )
    if request.min_tokens > max_tokens:
        raise ApiError(
            400, "invalid_value", "'min_tokens' cannot exceed max_tokens.", param="min_tokens"
        )
    defaults = route.sampling_defaults
    temperature = (
        request.temperature
        if request.temperature is not None
        else float(defaults.get("temperature", 1.0))
    )
    if request.n > 1 and temperature < GREEDY_TEMPERATURE and not request.beam_search:
        # Greedy choices would all be the same text: vLLM refuses it, so does the platform.
        message = f"n must be 1 when using greedy sampling, got {request.n}."
        raise ApiError(400, "invalid_value", message, param="n")
    prompt_logprobs = prompt_logprobs_asked(request)
    if prompt_logprobs is not None:
        _prompt_logprobs_bound(request, prompt_logprobs, prompt_tokens)
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=request.top_p if request.top_p is not None else float(defaults.get("top_p", 1.0)),
        top_k=request.top_k if request.top_k is not None else int(defaults.get("top_k", 0)),
        seed=request.seed,
        stop=request.stop,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        n=request.n,
        repetition_penalty=request.repetition_penalty,
        repetition_detection=request.repetition_detection,
        min_p=request.min_p,
        stop_token_ids=list(request.stop_token_ids),
        bad_words=list(request.bad_words),
        logit_bias=dict(request.logit_bias or {}),
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        logprobs=request.logprobs,
        logprob_token_ids=list(request.logprob_token_ids or ()),
        prompt_logprobs=prompt_logprobs,
        prompt_in_logprobs=_echoes_logprobs(request),
        structured=request.structured,
        allowed_token_ids=(
            None if request.allowed_token_ids is None else list(request.allowed_token_ids)
        ),
        logprob_tokens_as_ids=request.tokens_as_ids,
        output_token_ids=request.return_token_ids,
        beam_search=request.beam_search,
        length_penalty=request.length_penalty,
        thinking_token_budget=request.thinking_token_budget,
    )


def prompt_logprobs_asked(request: GenerationRequest) -> int | None:
    """How many of the likeliest tokens each prompt token comes with, as vLLM's server asks its
    engine: what the request says, else with `echo` what its logprobs say (chat's
    top_logprobs, 0 when not asked).

    The engine then scores the whole prompt, so it reads none of it from the prefix cache.
    """
    if request.prompt_logprobs is not None or not request.echo:
        return request.prompt_logprobs
    if request.conversations:
        return None  # a batch's answer has no place for them (vLLM's server drops them)
    if request.endpoint == CHAT:
        return request.logprobs or 0
    return request.logprobs


def _echoes_logprobs(request: GenerationRequest) -> bool:
    """Whether the prompt's log probabilities open the text's (completions' echo with logprobs)."""
    return request.echo and request.endpoint != CHAT and request.logprobs is not None


def _prompt_logprobs_bound(request: GenerationRequest, alternatives: int, longest: int) -> None:
    """Refuse prompt_logprobs whose answer would list more than MAX_PROMPT_LOGPROBS entries.

    Chat lists them once on the body; completions on every choice, and an echo's logprobs
    repeat them. `longest` is the longest prompt's length.
    """
    copies = 1 if request.endpoint == CHAT else request.n * max(len(request.prompts), 1)
    if _echoes_logprobs(request):
        copies *= 2
    entries = longest * (alternatives + 1) * copies
    if entries > MAX_PROMPT_LOGPROBS:
        field = "prompt_logprobs" if request.prompt_logprobs is not None else "logprobs"
        raise ApiError(
            400,
            "invalid_value",
            f"The answer would list {entries} prompt log probabilities ({longest} prompt "
            f"tokens × {alternatives + 1} × {copies} choices), more than the "
            f"{MAX_PROMPT_LOGPROBS} one answer carries: ask for fewer alternatives, fewer "
            "choices or a shorter prompt.",
            param=field,
        )


def reasoning_build(request: GenerationRequest, route: Route) -> Reasoning | None:
    """What the worker needs to split a reasoning model's thinking from its answer; None for
    a version without a reasoning parser, which refuses what only such a model can do."""
    if not route.reasoning_parser:
        if request.thinking_token_budget is not None:
            raise _no_reasoning(request, "thinking_token_budget")
        if not request.include_reasoning:
            raise _no_reasoning(request, "include_reasoning")
        return None
    if request.endpoint != CHAT:
        return None  # a completion is the model's raw text: nothing to split
    return Reasoning(
        parser=route.reasoning_parser,
        template_kwargs=json.dumps(request.chat_template_kwargs or {}),
        include=request.include_reasoning,
        running=request.continuous_usage,
    )


def _no_reasoning(request: GenerationRequest, field: str) -> ApiError:
    return ApiError(
        400,
        "unsupported_parameter",
        f"'{request.model}' has no reasoning parser in its manifest: it does not think apart "
        f"from its answer, so '{field}' cannot apply; leave it out.",
        param=field,
    )


def tools_build(request: GenerationRequest, route: Route) -> Tools | None:
    """What the worker needs to parse tool calls out of the output; None when none can come."""
    use = request.tools
    if use is None or (use.choice == "none" and not use.named):
        return None
    if not route.tool_parser:
        raise ApiError(
            400,
            "unsupported_parameter",
            f"'{request.model}' has no tool parser in its manifest, so it cannot call tools; "
            "leave 'tool_choice' out or send \"none\".",
            param="tools",
        )
    return Tools(
        parser=route.tool_parser,
        tools=json.dumps(use.tools),
        choice=use.choice_json,
        parallel=use.parallel,
    )
