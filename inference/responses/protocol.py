"""The Responses API (`/v1/responses`) on the chat path.

A Responses request becomes a chat request (its input items, the stored turns before it and
its instructions become messages; `text.format` the response format; function tools chat's
tools), runs like any chat request (quotas, queues, deadlines, safety, usage), and its events
become the Responses API's: one `Response` object, or a stream of semantic events each with a
`sequence_number`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from config.json_body import shown
from inference.base.errors import ApiError, invalid, unrecognized
from inference.body.fields import CHAT
from inference.body.inputs import MAX_MESSAGES, messages_count_check
from inference.body.parser import GenerationRequest, generation_parse
from inference.pipeline.tokenization import kept_from, turn_starts
from inference.responses.store import Kept

_json = msgspec.json.Encoder()

# The body's fields: honoured, or refused with what to send instead. Anything else is an
# unknown field (400 unsupported_parameter), as on the other endpoints.
HONOURED = frozenset(
    {
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
        "tools", "tool_choice", "parallel_tool_calls", "text", "metadata", "user",
        "safety_identifier", "store", "previous_response_id", "stream", "truncation",
        "background", "service_tier", "include", "top_logprobs", "max_tool_calls",
        "reasoning", "conversation",
    }
)  # fmt: skip
# What `include` may name: the output text's log probabilities (the rest of OpenAI's names
# are of what this platform does not produce: built-in tools' results, images, encrypted
# reasoning; a reasoning model's thinking comes as a reasoning item in the clear).
OUTPUT_LOGPROBS = "message.output_text.logprobs"
# vLLM's sampling extras its own Responses server takes: they go to chat as they are.
PASSED_TO_CHAT = (
    "logit_bias", "seed", "stop", "stop_token_ids", "top_k", "min_p", "ignore_eos",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "skip_special_tokens",
    "include_stop_str_in_output", "cache_salt", "prompt_cache_key", "include_reasoning",
)  # fmt: skip
# Refused unless left out or set to what asks for nothing.
REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {
    "prompt": (None,),
    "stream_options": (None, {}),
}
# `POST /v1/responses/input_tokens`: the fields of OpenAI's count body, each read as a create
# reads it; the rest of a create's fields have no bearing on a count and are refused by name.
COUNTED = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "text", "reasoning", "truncation", "previous_response_id", "conversation",
    }
)  # fmt: skip
COUNT_REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {"personality": (None,)}
MAX_METADATA_KEYS = 16
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
# Chat's names of the fields a Responses request names otherwise (for errors).
_PARAMS = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
    "logprobs": "include",
    "reasoning_effort": "reasoning.effort",
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses request, read: its chat request and what its answer repeats."""

    response_id: str
    chat: GenerationRequest
    input_items: list[dict[str, Any]]  # this turn's, with ids: what input_items lists
    store: bool
    background: bool
    previous_response_id: str | None
    echo: dict[str, Any]  # the request's settings the response object repeats


def _texts_of(content: Any, where: str, *, output: bool) -> list[str]:
    """A message's content as the texts of its parts: a string is one part."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise invalid(where, f"'{where}' must be a string or a list of content parts.")
    kinds = ("output_text", "refusal") if output else ("input_text",)
    texts = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds and not (output and kind == "input_text"):
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'{at}.type' must be {' or '.join(repr(k) for k in kinds)}; "
                f"got {shown(str(kind))}.",
                param=f"{at}.type",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise invalid(f"{at}.text", f"'{at}.text' must be a string.")
        texts.append(text)
    return texts


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}", f"'{where}.{name}' must be a string.")
    return value


def input_items_read(raw: Any, *, response_id: str, field: str = "input") -> list[dict[str, Any]]:
    """The input's items in their full shape, each with an id (a string is one user message).

    `field`: the body's name for them, in errors (a conversation's are `items`).
    """
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise invalid(field, f"'{field}' must be a string or a non-empty list of input items.")
    messages_count_check(len(raw), field)
    items = []
    for i, item in enumerate(raw):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, f"'{where}' must be an object.")
        kind = item.get("type", "message")
        item_id = item.get("id") if isinstance(item.get("id"), str) else None
        default_id = f"{response_id}_in{i}".replace("resp_", "item_", 1)
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in ROLES:
                raise invalid(
                    f"{where}.role",
                    f"'{where}.role' must be one of {', '.join(ROLES)}; got {shown(str(role))}.",
                )
            output = role == "assistant"
            texts = _texts_of(item.get("content"), f"{where}.content", output=output)
            part = "output_text" if output else "input_text"
            items.append(
                {
                    "type": "message",
                    "id": item_id or default_id,
                    "role": role,
                    "status": "completed",
                    "content": [
                        {"type": part, "text": text, **({"annotations": []} if output else {})}
                        for text in texts
                    ],
                }
            )
        elif kind == "function_call":
            arguments = _string(item, "arguments", where)
            items.append(
                {
                    "type": "function_call",
                    "id": item_id or default_id,
                    "call_id": _string(item, "call_id", where),
                    "name": _string(item, "name", where),
                    "arguments": arguments,
                    "status": "completed",
                }
            )
        elif kind == "reasoning":
            items.append(
                {
                    "type": "reasoning",
                    "id": item_id or default_id,
                    "summary": [],
                    "content": [
                        {"type": "reasoning_text", "text": text}
                        for text in _reasoning_texts(item.get("content"), f"{where}.content")
                    ],
                    "status": "completed",
                }
            )
        elif kind == "function_call_output":
            output_value = item.get("output")
            if not isinstance(output_value, str):
                output_value = "\n".join(_texts_of(output_value, f"{where}.output", output=False))
            items.append(
                {
                    "type": "function_call_output",
                    "id": item_id or default_id,
                    "call_id": _string(item, "call_id", where),
                    "output": output_value,
                    "status": "completed",
                }
            )
        else:
            raise ApiError(
                400,
                "unsupported_parameter",
                f"Input items of type {shown(str(kind))} are not supported; send messages, "
                "reasoning, function_call and function_call_output items.",
                param=f"{where}.type",
            )
    return items


def _reasoning_texts(content: Any, where: str) -> list[str]:
    """A reasoning item's content: its reasoning_text parts' texts (none: an empty list)."""
    if content is None:
        return []
    if not isinstance(content, list):
        raise invalid(where, f"'{where}' must be a list of reasoning_text parts.")
    texts = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        if not isinstance(part, dict) or part.get("type") != "reasoning_text":
            raise invalid(f"{at}.type", f"'{at}.type' must be 'reasoning_text'.")
        texts.append(_string(part, "text", at))
    return texts


def messages_of(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages from input and output items, in order.

    Function calls join the assistant message just before them (or open one); each call's
    output is a tool message. A reasoning item's thinking goes with the assistant's message
    or calls that follow it (chat's `reasoning`, for a template that shows earlier thinking).
    """
    messages: list[dict[str, Any]] = []
    thought: list[str] = []  # a reasoning item's, waiting for the assistant's turn
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            thought += [part["text"] for part in item["content"]]
            continue
        if kind == "message":
            # Its parts as chat's text parts: joined with a newline for most templates, and
            # kept apart for one that loops over content, as vLLM's chat rendering does.
            parts = [{"type": "text", "text": part["text"]} for part in item["content"]]
            content = parts[0]["text"] if len(parts) == 1 else parts
            messages.append({"role": ROLES[item["role"]], "content": content})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not thought:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
        if thought and messages and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning"] = "\n".join(thought)
            thought = []
    if thought:  # thinking with no answer after it: an assistant turn of its own
        messages.append({"role": "assistant", "content": "", "reasoning": "\n".join(thought)})
    return messages


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    """Responses' function tools as chat's (the function's fields one level down)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise invalid("tools", "'tools' must be a list of tools.")
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(where, f"'{where}' must be an object.")
        if tool.get("type") != "function":
            raise ApiError(
                400,
                "unsupported_parameter",
                f"Only function tools are supported; '{where}.type' is "
                f"{shown(str(tool.get('type')))}.",
                param=f"{where}.type",
            )
        keys = ("name", "description", "parameters", "strict")
        function = {k: tool[k] for k in keys if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: Any) -> Any:
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


def _response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as chat's response_format."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("text", "'text' must be an object.")
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        name = sorted(unknown)[0]
        raise ApiError(
            400, "unsupported_parameter", f"'text.{shown(name)}' is not supported.",
            param=f"text.{shown(name)}",
        )  # fmt: skip
    if text.get("verbosity") not in (None, "medium"):
        raise ApiError(
            400,
            "unsupported_parameter",
            "'text.verbosity' is not supported; leave it out or send \"medium\".",
            param="text.verbosity",
        )
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format", "'text.format' must be an object.")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid(
        "text.format.type",
        "'text.format.type' must be 'text', 'json_object' or 'json_schema'; "
        f"got {shown(str(kind))}.",
    )


def _refuse_unsupported(
    body: dict[str, Any], honoured: frozenset[str], refused_unless: dict[str, tuple[Any, ...]]
) -> None:
    for name, value in body.items():
        if name in honoured:
            continue
        allowed = refused_unless.get(name)
        if allowed is None:
            raise unrecognized(name)
        if not any(value == unused and type(value) is type(unused) for unused in allowed):
            raise ApiError(
                400, "unsupported_parameter", f"'{name}' is not supported; leave it out.",
                param=name,
            )  # fmt: skip


def _top_logprobs(body: dict[str, Any]) -> int | None:
    """The alternatives per token the output text's log probabilities list; None: no log
    probabilities (`include` does not name them)."""
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list):
        raise invalid("include", "'include' must be a list of strings.")
    for i, name in enumerate(include):
        if name != OUTPUT_LOGPROBS:
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'include[{i}]' is not supported: only {OUTPUT_LOGPROBS!r} is; "
                f"got {shown(str(name))}.",
                param=f"include[{i}]",
            )
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool)):
        raise invalid("top_logprobs", "'top_logprobs' must be an integer.")
    if not include:
        if top:
            raise invalid(
                "top_logprobs",
                f"'top_logprobs' lists alternatives of the output's log probabilities: send "
                f"'include': [{OUTPUT_LOGPROBS!r}] with it.",
            )
        return None
    return top or 0


def _max_tool_calls(body: dict[str, Any]) -> int | None:
    """OpenAI's bound on calls to its built-in tools in one response. This platform runs no
    built-in tool (the client runs every function call), so no response comes near it; it is
    checked and repeated, as OpenAI's and vLLM's servers repeat it."""
    value = body.get("max_tool_calls")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise invalid("max_tool_calls", "'max_tool_calls' must be a positive integer.")
    return value


def _reasoning_effort(reasoning: Any) -> Any:
    """`reasoning.effort`, which reaches chat as its reasoning_effort (the chat template's);
    a summary of the thinking is not written (the thinking itself comes, as a reasoning
    item), so asking for one is refused."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise invalid("reasoning", "'reasoning' must be an object.")
    for name, value in reasoning.items():
        if name != "effort" and value is not None:
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'reasoning.{shown(name)}' is not supported: a reasoning model's thinking "
                "comes whole, as a reasoning item.",
                param=f"reasoning.{shown(name)}",
            )
    return reasoning.get("effort")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"'{name}' must be a boolean.")
    return value


def metadata_read(raw: Any) -> dict[str, str] | None:
    """A body's `metadata`, checked as OpenAI bounds it (None: absent)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_METADATA_KEYS:
        raise invalid(
            "metadata", f"'metadata' must be an object of at most {MAX_METADATA_KEYS} keys."
        )
    for key, value in raw.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise invalid(
                "metadata",
                "'metadata' keys are at most 64 characters and values strings of at most 512.",
            )
    return raw


def chat_error_renamed(exc: ApiError) -> ApiError:
    """A chat field's error, naming the Responses field the client sent."""
    if exc.param:
        head, dot, tail = exc.param.partition(".")
        base = head.split("[")[0]
        if base in _PARAMS:
            exc.param = _PARAMS[base] + head[len(base) :] + dot + tail
            exc.message = re.sub(rf"\b{base}\b", _PARAMS[base], exc.message)
    return exc


def responses_parse(
    body: dict[str, Any],
    *,
    response_id: str,
    history: list[Kept],
    conversation: list[dict[str, Any]] | None = None,
    input_required: bool = True,
) -> ResponsesRequest:
    """Return the chat request of a Responses body, or raise a 400 naming its field.

    `history`: the stored turns before this one, oldest first (from previous_response_id);
    `conversation`: the items of the conversation the body names, oldest first. A count of
    what a history alone takes has no `input` (not `input_required`).
    """
    _refuse_unsupported(body, HONOURED | frozenset(PASSED_TO_CHAT), REFUSED_UNLESS)
    if "input" in body:
        items = input_items_read(body["input"], response_id=response_id)
    elif input_required:
        raise invalid("input", "'input' is required.", code="missing_required_parameter")
    else:
        items = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions", "'instructions' must be a string.")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise invalid(
            "truncation",
            f"'truncation' must be 'auto' or 'disabled'; got {shown(str(truncation))}.",
        )
    conversation_id = conversation_id_read(body)
    earlier: list[dict[str, Any]] = list(conversation or [])
    for turn in history:
        earlier.extend(turn.input_items)
        earlier.extend(turn.body.get("output", []))
    messages = messages_of(earlier + items)
    if instructions:
        # A turn's instructions are its own: those of earlier turns are not carried over.
        messages.insert(0, {"role": "system", "content": instructions})
    if len(messages) > MAX_MESSAGES:
        if truncation == "auto":
            # The oldest turns go first: those past what a prompt may hold go now.
            messages = kept_from(messages, turn_starts(messages, most=MAX_MESSAGES)[0])
        else:
            own = len(messages_of(items)) + bool(instructions)
            before = "conversation" if conversation_id is not None else "previous_response_id"
            where = "input" if own > MAX_MESSAGES else before
            raise invalid(
                where,
                f"This turn and the history before it hold {len(messages)} messages; a request "
                f"may hold at most {MAX_MESSAGES}. Set 'truncation' to 'auto' to drop the "
                "oldest turns, or start a new conversation.",
                code="array_above_max_length",
            )
    user = body.get("user") if body.get("user") is not None else body.get("safety_identifier")
    chat_body: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "stream": _flag(body, "stream", False),
    }
    optional = {
        "max_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tools": _tools(body.get("tools")),
        "tool_choice": _tool_choice(body.get("tool_choice")),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _response_format(body.get("text")),
        "user": user,
        "service_tier": body.get("service_tier"),
    }
    optional["reasoning_effort"] = _reasoning_effort(body.get("reasoning"))
    optional.update({name: body.get(name) for name in PASSED_TO_CHAT})
    if optional["stop"] == "":
        # vLLM's Responses server reads an empty stop as none (chat's refuses it).
        optional["stop"] = None
    top_logprobs = _top_logprobs(body)
    if top_logprobs is not None:
        optional.update(logprobs=True, top_logprobs=top_logprobs)
    chat_body.update({k: v for k, v in optional.items() if v is not None})
    try:
        chat = generation_parse(chat_body, endpoint=CHAT)
    except ApiError as exc:
        raise chat_error_renamed(exc) from None
    chat = dataclasses.replace(chat, truncate_turns=truncation == "auto")
    previous = body.get("previous_response_id")
    tools = body.get("tools") or []
    return ResponsesRequest(
        response_id=response_id,
        chat=chat,
        input_items=items,
        store=_flag(body, "store", True),
        background=_flag(body, "background", False),
        previous_response_id=previous,
        echo={
            "instructions": instructions,
            "max_output_tokens": chat.max_tokens,
            "max_tool_calls": _max_tool_calls(body),
            "metadata": metadata_read(body.get("metadata")) or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "previous_response_id": previous,
            "temperature": 1.0 if chat.temperature is None else chat.temperature,
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or ("auto" if tools else "none"),
            "tools": tools,
            "top_p": 1.0 if chat.top_p is None else chat.top_p,
            # The builder reads it too: None, no log probabilities on the output text.
            "top_logprobs": top_logprobs,
            "truncation": truncation or "disabled",
            "user": user,
            "store": _flag(body, "store", True),
            "background": _flag(body, "background", False),
            "conversation": None if conversation_id is None else {"id": conversation_id},
        },
    )


def count_parse(
    body: dict[str, Any],
    *,
    history: list[Kept],
    conversation: list[dict[str, Any]] | None = None,
) -> GenerationRequest:
    """The chat request whose prompt a count body's input tokens are, or a 400 naming its field.

    Each field is read as a create reads it, so a count is the `usage.input_tokens` of the
    response the same fields would create.
    """
    _refuse_unsupported(body, COUNTED, COUNT_REFUSED_UNLESS)
    counted = {name: value for name, value in body.items() if name in COUNTED}
    parsed = responses_parse(
        counted,
        response_id="resp_count",
        history=history,
        conversation=conversation,
        # A history alone may be counted: what a conversation or a chain takes so far.
        input_required=body.get("conversation") is None
        and body.get("previous_response_id") is None,
    )
    return parsed.chat


RESPONSES = "responses"  # a batch's endpoint kind for /v1/responses lines


def batch_line_parse(body: dict[str, Any], *, response_id: str) -> ResponsesRequest:
    """A /v1/responses batch line: a response of its own, never chained or in the background
    (the batch already runs in the background; a line cannot wait on another's answer)."""
    for name in ("previous_response_id", "background", "truncation", "conversation"):
        if body.get(name) not in (None, False, "disabled"):
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'{name}' is not supported in a batch line; leave it out.",
                param=f"body.{name}",
            )
    return responses_parse(body, response_id=response_id, history=[])


def conversation_id_read(body: dict[str, Any]) -> str | None:
    """The id of the conversation a body names (`"conv_..."` or `{"id": "conv_..."}`), checked;
    None without one. A body names a conversation or a previous response, not both."""
    raw = body.get("conversation")
    if raw is None:
        return None
    found = raw.get("id") if isinstance(raw, dict) and set(raw) == {"id"} else raw
    if not isinstance(found, str) or not found:
        raise invalid(
            "conversation", "'conversation' must be a conversation id, or an object of its id."
        )
    if body.get("previous_response_id") is not None:
        raise invalid(
            "conversation",
            "Send 'conversation' or 'previous_response_id', not both: each names the history.",
        )
    return found


def previous_id_read(body: dict[str, Any]) -> str | None:
    """The body's previous_response_id, checked (it is read before the rest of the body)."""
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise invalid("previous_response_id", "'previous_response_id' must be a response id.")
    return previous
