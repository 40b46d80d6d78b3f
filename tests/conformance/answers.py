"""An answer reduced to what two OpenAI-compatible servers must agree on, and the comparison.

A whole response and a reassembled stream reduce to the same `Answer`: per choice its text,
tool calls (name and parsed arguments; ids differ by design), finish reason and logprobs, plus
the usage. Ids, `created`, `model`, `system_fingerprint` and headers are left out: they differ
on purpose (docs/conformance.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import httpx

LOGPROB_TOLERANCE = 1e-4

# Per prompt position (None for the first): (token id, logprob, rank, text), in the answer's order.
PromptLogprobs = list[list[tuple[str, float, int | None, str | None]] | None]


def _prompt_logprobs(raw: list[dict[str, Any] | None] | None) -> PromptLogprobs | None:
    if raw is None:
        return None
    return [
        None
        if position is None
        else [(i, e["logprob"], e.get("rank"), e.get("decoded_token")) for i, e in position.items()]
        for position in raw
    ]


@dataclass
class Choice:
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    # (token, logprob, top alternatives as (token, logprob) pairs); None: not asked for.
    logprobs: list[tuple[str, float | None, list[tuple[str, float]]]] | None = None
    text_offset: list[int] | None = None
    # return_token_ids: the output's ids, and (completions) the prompt's; None: absent.
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    # vLLM's prompt_logprobs (completions: on each choice); None: absent.
    prompt_logprobs: PromptLogprobs | None = None
    # A reasoning model's thinking (chat's `reasoning`); None: absent or null.
    reasoning: str | None = None
    # Chat: the role the answer is in (a stream's first delta names it); None: completions.
    role: str | None = None
    # vLLM's stop_reason: the stop string or token id that ended the choice (its last chunk's).
    stop_reason: str | int | None = None
    # A stream's running usage (continuous_usage_stats): the prompt, completion and (a
    # reasoning model's) thinking tokens of the choice's last chunk that carried it, and
    # whether its completion tokens never fell.
    running: tuple[int, int, int | None] | None = None
    running_rose: bool = True


@dataclass
class Answer:
    status: int
    choices: dict[int, Choice] = field(default_factory=dict)
    usage: dict[str, int] | None = None
    # prompt_tokens_details: the cached tokens, and on chat those the request wrote to the cache
    cache: dict[str, int] | None = None
    error: str = ""  # a refusal's code and message, to show in a difference
    stream_error: str = ""  # an error event inside a stream that began with 200
    prompt_token_ids: list[int] | None = None  # chat's return_token_ids, on the body
    prompt_logprobs: PromptLogprobs | None = None  # chat's prompt_logprobs, on the body
    prompt_text: str | None = None  # chat's return_prompt_text: the rendered template


def _arguments(text: str) -> Any:
    """Parsed tool-call arguments; text that is not JSON (a cut-off call) compares as text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _usage(body: dict[str, Any] | None) -> tuple[dict[str, int] | None, dict[str, int] | None]:
    if not body:
        return None, None
    usage = {k: body[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    completion = body.get("completion_tokens_details") or {}
    if "reasoning_tokens" in completion:  # a reasoning model's
        usage["reasoning_tokens"] = completion["reasoning_tokens"]
    # vLLM's server writes the details it has no figure for as null: absent, as the platform
    # leaves them.
    details = body.get("prompt_tokens_details")
    if details is None:
        return usage, None
    return usage, {key: value for key, value in details.items() if value is not None}


def chat_logprobs(entries: list[dict[str, Any]]) -> list[tuple[str, float | None, list]]:
    return [
        (
            entry["token"],
            entry["logprob"],
            [(top["token"], top["logprob"]) for top in entry.get("top_logprobs") or []],
        )
        for entry in entries
    ]


def _completion_logprobs(logprobs: dict[str, Any]) -> list[tuple[str, float | None, list]]:
    tops = logprobs.get("top_logprobs") or [None] * len(logprobs["tokens"])
    return [
        (token, logprob, sorted((top or {}).items()))
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], tops, strict=True
        )
    ]


def _refused(response: httpx.Response) -> Answer:
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {"message": response.text[:200]}
    return Answer(status=response.status_code, error=f"{error.get('code')}: {error.get('message')}")


def answer_of(response: httpx.Response, *, chat: bool) -> Answer:
    """Reduce a whole (non-streaming) response."""
    if response.status_code != 200:
        return _refused(response)
    body = response.json()
    answer = Answer(status=200)
    answer.usage, answer.cache = _usage(body.get("usage"))
    answer.prompt_token_ids = body.get("prompt_token_ids")
    answer.prompt_text = body.get("prompt_text")
    answer.prompt_logprobs = _prompt_logprobs(body.get("prompt_logprobs"))
    for raw in body["choices"]:
        choice = Choice(
            finish_reason=raw.get("finish_reason"),
            stop_reason=raw.get("stop_reason"),
            token_ids=raw.get("token_ids"),
            prompt_token_ids=raw.get("prompt_token_ids"),
            prompt_logprobs=_prompt_logprobs(raw.get("prompt_logprobs")),
        )
        logprobs = raw.get("logprobs")
        if chat:
            message = raw["message"]
            choice.role = message.get("role")
            choice.text = message.get("content")
            choice.reasoning = message.get("reasoning")
            choice.tool_calls = [
                {
                    "type": call.get("type"),
                    "name": call["function"]["name"],
                    "arguments": _arguments(call["function"]["arguments"]),
                }
                for call in message.get("tool_calls") or []
            ]
            if logprobs is not None:
                choice.logprobs = chat_logprobs(logprobs.get("content") or [])
        else:
            choice.text = raw["text"]
            if logprobs is not None:
                choice.logprobs = _completion_logprobs(logprobs)
                choice.text_offset = list(logprobs.get("text_offset") or [])
        answer.choices[raw["index"]] = choice
    return answer


def stream_answer_of(response: httpx.Response, *, chat: bool) -> Answer:
    """Reassemble a stream: text, tool-call pieces and logprobs per choice, and usage."""
    if response.status_code != 200:
        response.read()
        return _refused(response)
    answer = Answer(status=200)
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        if "error" in chunk:
            error = chunk["error"]
            answer.stream_error = f"{error.get('code')}: {error.get('message')}"
            continue
        if chunk.get("usage"):
            answer.usage, answer.cache = _usage(chunk["usage"])
        if chunk.get("prompt_token_ids") is not None:
            answer.prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("prompt_text") is not None:
            answer.prompt_text = chunk["prompt_text"]
        for raw in chunk.get("choices") or []:
            choice = answer.choices.setdefault(raw["index"], Choice(text=""))
            running = chunk.get("usage")
            if running:
                details = running.get("completion_tokens_details") or {}
                now = (
                    running["prompt_tokens"],
                    running["completion_tokens"],
                    details.get("reasoning_tokens"),
                )
                if choice.running is not None and now[1] < choice.running[1]:
                    choice.running_rose = False
                choice.running = now
            if raw.get("token_ids") is not None:
                choice.token_ids = (choice.token_ids or []) + raw["token_ids"]
            if raw.get("prompt_token_ids") is not None:
                choice.prompt_token_ids = raw["prompt_token_ids"]
            if raw.get("finish_reason") is not None:
                choice.finish_reason = raw["finish_reason"]
                choice.stop_reason = raw.get("stop_reason")
            logprobs = raw.get("logprobs")
            if chat:
                delta = raw.get("delta") or {}
                choice.role = delta.get("role") or choice.role
                choice.text = (choice.text or "") + (delta.get("content") or "")
                if delta.get("reasoning"):
                    choice.reasoning = (choice.reasoning or "") + delta["reasoning"]
                for piece in delta.get("tool_calls") or []:
                    call = calls.setdefault(raw["index"], {}).setdefault(
                        piece["index"], {"type": None, "name": "", "arguments": ""}
                    )
                    call["type"] = piece.get("type") or call["type"]
                    function = piece.get("function") or {}
                    call["name"] += function.get("name") or ""
                    call["arguments"] += function.get("arguments") or ""
                if logprobs is not None:
                    more = chat_logprobs(logprobs.get("content") or [])
                    choice.logprobs = (choice.logprobs or []) + more
            else:
                choice.text = (choice.text or "") + raw.get("text", "")
                if logprobs is not None:
                    choice.logprobs = (choice.logprobs or []) + _completion_logprobs(logprobs)
                    offsets = list(logprobs.get("text_offset") or [])
                    choice.text_offset = (choice.text_offset or []) + offsets
    for index, by_call in calls.items():
        answer.choices[index].tool_calls = [
            {**call, "arguments": _arguments(call["arguments"])}
            for _, call in sorted(by_call.items())
        ]
    return answer


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= LOGPROB_TOLERANCE


Logprobs = list[tuple[str, float | None, list[tuple[str, float]]]]


def logprob_differences(where: str, ours: Logprobs, theirs: Logprobs) -> list[str]:
    if len(ours) != len(theirs):
        return [f"{where}: {len(ours)} logprob entries vs vLLM's {len(theirs)}"]
    for position, ((token, logprob, top), (v_token, v_logprob, v_top)) in enumerate(
        zip(ours, theirs, strict=True)
    ):
        if token != v_token or not _close(logprob, v_logprob):
            mine, vllm = f"{token!r} {logprob}", f"{v_token!r} {v_logprob}"
            return [f"{where} token {position}: {mine} vs vLLM's {vllm}"]
        same_top = len(top) == len(v_top) and all(
            t == vt and _close(lp, vlp) for (t, lp), (vt, vlp) in zip(top, v_top, strict=True)
        )
        if not same_top:
            return [f"{where} token {position} top: {top} vs vLLM's {v_top}"]
    return []


def _prompt_logprob_differences(
    where: str, ours: PromptLogprobs | None, theirs: PromptLogprobs | None
) -> list[str]:
    """The same positions, each with the same tokens in the same order, ranks and texts, and
    log probabilities within the tolerance."""
    if ours is None or theirs is None:
        if ours is theirs:
            return []
        return [f"{where} prompt_logprobs {_presence(ours)} vs vLLM's {_presence(theirs)}"]
    if len(ours) != len(theirs):
        return [f"{where} {len(ours)} prompt_logprobs positions vs vLLM's {len(theirs)}"]
    for position, (mine, vllm) in enumerate(zip(ours, theirs, strict=True)):
        same = (mine is None) == (vllm is None) and (
            mine is None
            or vllm is None
            or (
                [(i, rank, text) for i, _, rank, text in mine]
                == [(i, rank, text) for i, _, rank, text in vllm]
                and all(_close(a[1], b[1]) for a, b in zip(mine, vllm, strict=True))
            )
        )
        if not same:
            return [f"{where} prompt_logprobs[{position}] {mine} vs vLLM's {vllm}"]
    return []


def _presence(value: object) -> str:
    return "absent" if value is None else "present"


def differences(ours: Answer, theirs: Answer) -> list[str]:
    """What the platform's answer (ours) says differently from vLLM's (theirs); empty: none."""
    if ours.status != theirs.status:
        return [
            f"status {ours.status} ({ours.error or 'ok'}) vs vLLM's {theirs.status} "
            f"({theirs.error or 'ok'})"
        ]
    if bool(ours.stream_error) != bool(theirs.stream_error):
        return [
            f"stream error {ours.stream_error or 'none'!r} vs vLLM's "
            f"{theirs.stream_error or 'none'!r}"
        ]
    if ours.status != 200:
        return []
    found: list[str] = []
    if sorted(ours.choices) != sorted(theirs.choices):
        return [f"choice indexes {sorted(ours.choices)} vs vLLM's {sorted(theirs.choices)}"]
    for index in sorted(theirs.choices):
        mine, vllm = ours.choices[index], theirs.choices[index]
        where = f"choice {index}"
        if mine.text != vllm.text:
            found.append(f"{where} text {mine.text!r} vs vLLM's {vllm.text!r}")
        if (mine.running, mine.running_rose) != (vllm.running, vllm.running_rose):
            found.append(
                f"{where} running usage {mine.running} (rising: {mine.running_rose}) vs "
                f"vLLM's {vllm.running} (rising: {vllm.running_rose})"
            )
        if mine.stop_reason != vllm.stop_reason:
            found.append(f"{where} stop_reason {mine.stop_reason!r} vs vLLM's {vllm.stop_reason!r}")
        if mine.role != vllm.role:
            found.append(f"{where} role {mine.role!r} vs vLLM's {vllm.role!r}")
        if mine.reasoning != vllm.reasoning:
            found.append(f"{where} reasoning {mine.reasoning!r} vs vLLM's {vllm.reasoning!r}")
        if mine.tool_calls != vllm.tool_calls:
            found.append(f"{where} tool calls {mine.tool_calls} vs vLLM's {vllm.tool_calls}")
        if mine.finish_reason != vllm.finish_reason:
            found.append(f"{where} finish {mine.finish_reason!r} vs vLLM's {vllm.finish_reason!r}")
        if (mine.logprobs is None) != (vllm.logprobs is None):
            found.append(
                f"{where} logprobs {'present' if mine.logprobs is not None else 'absent'}"
                f" vs vLLM's {'present' if vllm.logprobs is not None else 'absent'}"
            )
        elif mine.logprobs is not None and vllm.logprobs is not None:
            found += logprob_differences(f"{where} logprobs", mine.logprobs, vllm.logprobs)
        if mine.text_offset != vllm.text_offset:
            found.append(f"{where} text_offset {mine.text_offset} vs vLLM's {vllm.text_offset}")
        for name in ("token_ids", "prompt_token_ids"):
            if getattr(mine, name) != getattr(vllm, name):
                found.append(
                    f"{where} {name} {getattr(mine, name)} vs vLLM's {getattr(vllm, name)}"
                )
        found += _prompt_logprob_differences(where, mine.prompt_logprobs, vllm.prompt_logprobs)
    if ours.prompt_token_ids != theirs.prompt_token_ids:
        mine_ids, vllm_ids = ours.prompt_token_ids, theirs.prompt_token_ids
        found.append(f"prompt_token_ids {mine_ids} vs vLLM's {vllm_ids}")
    if ours.prompt_text != theirs.prompt_text:
        found.append(f"prompt_text {ours.prompt_text!r} vs vLLM's {theirs.prompt_text!r}")
    found += _prompt_logprob_differences("body", ours.prompt_logprobs, theirs.prompt_logprobs)
    if ours.usage != theirs.usage:
        found.append(f"usage {ours.usage} vs vLLM's {theirs.usage}")
    return found
