"""The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on the chat path.

A Messages request becomes the chat request vLLM's own Messages server makes of it: its system
prompt a leading system message, its content blocks chat's content, `tool_use` and
`tool_result` blocks chat's tool calls and tool messages, `thinking` a thinking budget or a
reasoning effort. It then runs like any chat request (quotas, queues, deadlines, safety,
usage), and its events become Anthropic's: one message, or a stream of `message_start`,
`content_block_*`, `message_delta` and `message_stop` events (inference.messages.format).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from config.json_body import shown
from inference.base.errors import ApiError, invalid
from inference.body.fields import CHAT
from inference.body.inputs import messages_count_check
from inference.body.parser import GenerationRequest, generation_parse
from inference.body.tools import compiled_for, schema_check
from inference.body.types import booleans_read, type_error, whole

MESSAGES = "messages"  # the endpoint a usage record names for /v1/messages

# The body's fields: honoured here, or handed to chat as they are (vLLM's extensions its own
# Messages server takes: chat honours or refuses each, naming it). Anything else is an unknown
# field (400 unsupported_parameter), as on the other endpoints.
HONOURED = frozenset(
    {
        "model", "messages", "max_tokens", "system", "stop_sequences", "stream",
        "temperature", "top_p", "top_k", "tools", "tool_choice", "metadata", "thinking",
        "output_config", "cache_control",
    }
)  # fmt: skip
PASSED_TO_CHAT = (
    "chat_template_kwargs", "cache_salt", "watermarking", "kv_transfer_params",
    "ec_transfer_params", "vllm_xargs", "mm_payload", "return_mm_kwargs",
)  # fmt: skip
COUNT_HONOURED = frozenset(
    {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
     "cache_control"}
)  # fmt: skip
COUNT_PASSED_TO_CHAT = ("chat_template_kwargs",)

EFFORTS = ("low", "medium", "high", "xhigh", "max")
MIN_THINKING_BUDGET = 1024  # as Anthropic's API and vLLM's server bound it
# Claude Code's first system block: a per-request hash that would defeat the prefix cache.
BILLING_HEADER = "x-anthropic-billing-header"
# What each content block may carry besides its type. `cache_control` asks Anthropic's API to
# cache the prompt up to the block: the engine's prefix cache keeps every prompt's blocks, so
# it is met without being sent on; `citations` is null on a text block echoed back.
_BLOCK_FIELDS = {
    "text": {"text", "cache_control", "citations"},
    "image": {"source", "cache_control"},
    "thinking": {"thinking", "signature"},
    "redacted_thinking": {"data"},
    "tool_use": {"id", "name", "input", "cache_control"},
    "tool_result": {"tool_use_id", "content", "is_error", "cache_control"},
    # A tool search's blocks (vLLM's): a tool named in a tool's result, and deferred tools added
    # to or removed from the conversation's tools by a system message.
    "tool_reference": {"tool_name", "name"},
    "tool_addition": {"tool"},
    "tool_removal": {"tool"},
}
_TOOL_CHANGES = ("tool_addition", "tool_removal")
# Chat's names of the fields a Messages request names otherwise (for errors), longest first;
# chat's own positions in messages, tools and tool_choice are not the request's.
_PARAMS = (
    ("response_format.json_schema.schema", "output_config.format.schema"),
    ("response_format", "output_config.format"),
    ("stop", "stop_sequences"),
    ("reasoning_effort", "output_config.effort"),
    ("thinking_token_budget", "thinking.budget_tokens"),  # nosec B105: a field name
    ("user", "metadata.user_id"),
    ("messages", "messages"),
    ("tools", "tools"),
    ("tool_choice", "tool_choice"),
)
_POSITIONS_DROPPED = ("messages", "tools", "tool_choice")


@dataclass(frozen=True)
class Needs:
    """What converting a body needs to know of the template of the version it runs on."""

    inline_system: bool  # a system message inside `messages`: kept in place, or merged first
    thinking_disabled: bool  # thinking off: the reasoning effort that turns it off


def _unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, "unsupported_parameter", message, param=param)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise type_error(where, "an object", value)
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise type_error(where, "a string", value)
    return value


def _refuse_unknown(body: dict[str, Any], known: frozenset[str], passed: tuple[str, ...]) -> None:
    for name in body:
        if name not in known and name not in passed:
            raise _unsupported(name, f"Unrecognized request argument supplied: {shown(name)}.")


def _block_read(block: Any, where: str) -> dict[str, Any]:
    """One content block, checked: its type known and its fields those of its type."""
    block = _object(block, where)
    kind = block.get("type")
    kind = kind if isinstance(kind, str) else None  # a list or an object names no type
    if kind not in _BLOCK_FIELDS:
        raise invalid(
            f"{where}.type",
            f"A content block's type must be one of {', '.join(_BLOCK_FIELDS)}; "
            f"got {shown(str(kind))}.",
        )
    for name in block:
        if name != "type" and name not in _BLOCK_FIELDS[kind]:
            raise _unsupported(f"{where}.{name}", f"A '{kind}' block has no field {shown(name)}.")
    for name in ("text", "thinking", "id", "name", "tool_use_id", "signature", "data", "tool_name"):
        if block.get(name) is not None:
            _text(block[name], f"{where}.{name}")
    if block.get("input") is not None:
        _object(block["input"], f"{where}.input")
    if kind == "image":
        source = _object(block.get("source"), f"{where}.source")
        if source.get("type") not in ("base64", "url"):
            raise invalid(f"{where}.source.type", "An image's source is 'base64' or 'url'.")
    if kind == "tool_reference" and not (block.get("tool_name") or block.get("name")):
        raise invalid(
            f"{where}.tool_name",
            "A tool_reference names its tool in 'tool_name'.",
            code="missing_required_parameter",
        )
    if kind == "tool_result":
        content = block.get("content")
        if content is not None and not isinstance(content, str | list):
            raise type_error(f"{where}.content", "a string or an array of blocks", content)
        for i, item in enumerate(content if isinstance(content, list) else []):
            inner = _block_read(item, f"{where}.content[{i}]")
            if inner["type"] not in ("text", "image", "tool_reference"):
                # A tool's answer is text, images and the tools it found; anything else would
                # vanish unread.
                message = "A tool_result's content holds text, image and tool_reference blocks."
                raise invalid(f"{where}.content[{i}].type", message)
    return block


@dataclass(frozen=True)
class _ToolChange:
    """A tool_addition or tool_removal: the tool it names, and its definition when an
    addition brings the tool whole (None: a reference to a declared tool)."""

    kind: str
    name: str
    definition: dict[str, Any] | None = None


def _tool_change_read(kind: str, raw: Any, where: str) -> _ToolChange:
    """A tool_addition's or tool_removal's tool: a reference to a declared tool by name, or
    (an addition only) a tool's whole definition."""
    change = _object(raw, where)
    form = change.get("type")
    if form == "tool_reference":
        fields: tuple[str, ...] = ("type", "name")
        read = _ToolChange(kind, _text(change.get("name"), f"{where}.name"))
    elif form == "tool_definition" and kind == "tool_addition":
        fields = ("type", "definition")
        definition = _tool_read(change.get("definition"), f"{where}.definition")
        read = _ToolChange(kind, definition["name"], definition)
    else:
        allowed = (
            "tool_reference" if kind == "tool_removal" else "tool_reference or tool_definition"
        )
        raise invalid(f"{where}.type", f"A {kind}'s tool is a {allowed}.")
    for name in change:
        if name not in fields:
            raise _unsupported(f"{where}.{name}", f"A {form} has no field {shown(name)}.")
    return read


def _content_read(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise type_error(where, "a string or an array of content blocks", content)
    return [_block_read(block, f"{where}[{i}]") for i, block in enumerate(content)]


def _without_billing_header(text: str) -> str | None:
    return None if text.startswith(BILLING_HEADER) else text


def _blocks_text(
    blocks: list[dict[str, Any]], where: str, *, tool_changes: bool = False
) -> str | None:
    """A system prompt's text blocks joined, the billing header left out (None: no text).

    With `tool_changes` (a system message's), tool_addition and tool_removal blocks may stand
    among them: they change the tools (`_tools`), not the text."""
    parts = []
    for i, block in enumerate(blocks):
        if tool_changes and block["type"] in _TOOL_CHANGES:
            continue
        if block["type"] != "text":
            raise invalid(f"{where}[{i}].type", "A system prompt holds text blocks only.")
        text = block.get("text")
        if text and _without_billing_header(text) is not None:
            parts.append(text)
    return "".join(parts) if parts else None


def _system_of_message(content: str | list[dict[str, Any]], where: str) -> str | None:
    if isinstance(content, str):
        return _without_billing_header(content)
    return _blocks_text(content, where, tool_changes=True)


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_result_messages(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A user's tool_result block: the tool message that answers the call (its images, if
    any, in a user message after it, and the tools it referred to in a tool message of
    tool_reference parts after that, as vLLM's server writes them)."""
    content = block.get("content")
    images: list[str] = []
    references: list[str] = []
    if isinstance(content, list):
        texts = []
        for item in content:
            if item["type"] == "text":
                texts.append(item.get("text") or "")
            elif item["type"] == "image":
                images.append(_image_url(item["source"]))
            elif item["type"] == "tool_reference":
                references.append(item.get("tool_name") or item["name"])
        text = "\n".join(texts)
    else:
        text = content or ""
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text}
    ]
    if images:
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
        out.append({"role": "user", "content": parts})
    if references:
        found = [{"type": "tool_reference", "name": name} for name in references]
        out.append(
            {"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": found}
        )
    return out


def _message_converted(
    role: str, content: list[dict[str, Any]], chat: list[dict[str, Any]]
) -> dict[str, Any]:
    """A user or assistant message of blocks as chat's message; a user's tool results go to
    `chat` first, as the tool messages they are."""
    message: dict[str, Any] = {"role": role}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for block in content:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id") or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {
                        "name": block.get("name") or "",
                        "arguments": json.dumps(block.get("input") or {}),
                    },
                }
            )
        elif kind == "tool_result":
            if role == "user":
                chat.extend(_tool_result_messages(block))
            else:
                # As vLLM's server writes an assistant's tool result: the content's text form.
                shown_result = str(block["content"]) if block.get("content") else ""
                parts.append({"type": "text", "text": f"Tool result: {shown_result}"})
        # redacted_thinking: opaque (encrypted by Anthropic's API), nothing a template can show.
    if thinking:
        message["reasoning"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if only_text else parts
    return message


def _tool_changes_of(role: str, content: list[dict[str, Any]], where: str) -> list[_ToolChange]:
    """A message's tool changes, in order. A block where vLLM's server refuses it, or would
    drop it unread, is refused: a tool change outside a system message, a tool reference
    outside a tool's result."""
    changes = []
    for i, block in enumerate(content):
        kind = block["type"]
        if kind in _TOOL_CHANGES:
            if role != "system":
                raise invalid(
                    f"{where}[{i}].type",
                    f'{kind} blocks are only allowed in messages with role "system".',
                )
            changes.append(_tool_change_read(kind, block.get("tool"), f"{where}[{i}].tool"))
        if kind == "tool_reference":
            raise invalid(
                f"{where}[{i}].type",
                "A tool_reference block belongs in a tool_result's content, where it names "
                "a tool the search found.",
            )
    return changes


def _conversation(
    body: dict[str, Any], *, merge_inline_system: bool
) -> tuple[list[dict[str, Any]], list[_ToolChange]]:
    """The request's system prompt and messages as chat's messages, and the tool changes
    (tool_addition and tool_removal blocks) its system messages make, in order."""
    raw = body.get("messages")
    if raw is None:
        raise invalid("messages", "'messages' is required.", code="missing_required_parameter")
    if not isinstance(raw, list):
        raise type_error("messages", "an array", raw)
    messages_count_check(len(raw), "messages")
    messages = []
    changes: list[_ToolChange] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        message = _object(message, where)
        for name in message:
            if name not in ("role", "content"):
                raise _unsupported(f"{where}.{name}", f"A message has no field {shown(name)}.")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise invalid(f"{where}.role", "'role' must be one of user, assistant, system.")
        if "content" not in message:
            raise invalid(
                f"{where}.content", "'content' is required.", code="missing_required_parameter"
            )
        content = _content_read(message["content"], f"{where}.content")
        if isinstance(content, list):
            changes += _tool_changes_of(role, content, f"{where}.content")
        messages.append((role, content, where))
    system_parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        if system:
            system_parts.append(system)
    elif isinstance(system, list):
        blocks = [_block_read(block, f"system[{i}]") for i, block in enumerate(system)]
        text = _blocks_text(blocks, "system")
        if text:
            system_parts.append(text)
    elif system is not None:
        raise type_error("system", "a string or an array of text blocks", system)
    if merge_inline_system:
        for role, content, where in messages:
            text = _system_of_message(content, f"{where}.content") if role == "system" else None
            if text:
                system_parts.append(text)
    chat: list[dict[str, Any]] = []
    if system_parts:
        chat.append({"role": "system", "content": "".join(system_parts)})
    for role, content, where in messages:
        if role == "system":
            text = None if merge_inline_system else _system_of_message(content, f"{where}.content")
            if text:
                chat.append({"role": "system", "content": text})
            continue
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
            continue
        converted = _message_converted(role, content, chat)
        if role == "assistant" or "content" in converted:
            chat.append(converted)
    return chat, changes


def _tool_read(raw: Any, where: str) -> dict[str, Any]:
    """One client tool, checked: its name, input schema (an object's, unless it says), and
    description, strict and defer_loading when given."""
    tool = _object(raw, where)
    if tool.get("type") not in (None, "custom"):
        raise _unsupported(
            f"{where}.type",
            f"Only client tools (with an input_schema) are supported; got a "
            f"{shown(str(tool.get('type')))} tool.",
        )
    for name in tool:
        if name not in ("type", "name", "description", "input_schema", "strict",
                        "cache_control", "defer_loading"):  # fmt: skip
            raise _unsupported(f"{where}.{name}", f"A tool has no field {shown(name)}.")
    schema = dict(_object(tool.get("input_schema"), f"{where}.input_schema"))
    schema.setdefault("type", "object")
    # Checked here, where its place in the request is known: chat's tools are the resolved
    # list, whose positions are not the request's.
    schema_check(json.dumps(schema), f"{where}.input_schema")
    kept: dict[str, Any] = {"name": _text(tool.get("name"), f"{where}.name"), "parameters": schema}
    if tool.get("description") is not None:
        kept["description"] = _text(tool["description"], f"{where}.description")
    kept.update(booleans_read(tool, ("strict", "defer_loading"), where))
    return kept


def _tools(raw: Any, changes: list[_ToolChange]) -> list[dict[str, Any]] | None:
    """Chat's tools: the request's, with its system messages' tool changes applied in order.

    As vLLM's server resolves them, chat templates seeing one list of tools: the tools in
    effect at the conversation's end. A tool added by reference is no longer deferred, one
    added by definition is declared, a removed one is left out.
    """
    if raw is not None and not isinstance(raw, list):
        raise type_error("tools", "an array", raw)
    declared = None if raw is None else [_tool_read(t, f"tools[{i}]") for i, t in enumerate(raw)]
    if changes:
        tools = {tool["name"]: tool for tool in declared or []}
        removed: set[str] = set()
        for change in changes:
            name = change.name
            if change.definition is not None:
                tools[name] = change.definition
            elif name not in tools:
                raise invalid(
                    "tools",
                    f"A {change.kind} refers to the tool {shown(name)}, which 'tools' "
                    "does not declare.",
                )
            elif change.kind == "tool_addition":
                tools[name] = {k: v for k, v in tools[name].items() if k != "defer_loading"}
            if change.kind == "tool_removal":
                removed.add(name)
            else:
                removed.discard(name)
        declared = [tool for name, tool in tools.items() if name not in removed]
    if declared is None:
        return None
    return [{"type": "function", "function": function} for function in declared]


def _tool_choice(raw: Any) -> tuple[Any, bool | None]:
    """Chat's tool_choice and parallel_tool_calls of Anthropic's tool_choice."""
    if raw is None:
        return None, None
    choice = _object(raw, "tool_choice")
    for name in choice:
        if name not in ("type", "name", "disable_parallel_tool_use"):
            raise _unsupported(f"tool_choice.{name}", f"'tool_choice' has no field {shown(name)}.")
    kind = choice.get("type")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise type_error("tool_choice.disable_parallel_tool_use", "a boolean", disable)
    parallel = not disable
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        tool_name = choice.get("name")
        if not tool_name:
            raise invalid(
                "tool_choice.name",
                "tool_choice.name is required when type is 'tool'.",
                code="missing_required_parameter",
            )
        return {
            "type": "function",
            "function": {"name": _text(tool_name, "tool_choice.name")},
        }, parallel
    raise invalid("tool_choice.type", "tool_choice.type must be auto, any, tool or none.")


def thinking_shown(body: dict[str, Any]) -> bool:
    """Whether the answer's thinking blocks carry their text: not with `display: "omitted"`
    (a body `messages_chat` has accepted)."""
    thinking = body.get("thinking")
    return not (isinstance(thinking, dict) and thinking.get("display") == "omitted")


def _thinking(raw: Any, max_tokens: int | None) -> dict[str, Any]:
    """What `thinking` asks of chat: a thinking budget, or (off) `reasoning_effort` None as a
    marker the caller replaces with the effort that turns thinking off."""
    if raw is None:
        return {}
    thinking = _object(raw, "thinking")
    kind = thinking.get("type")
    kind = kind if isinstance(kind, str) else None  # a list or an object names no type
    allowed = {"enabled": {"type", "budget_tokens", "display"}, "disabled": {"type"},
               "adaptive": {"type", "display"}}  # fmt: skip
    if kind not in allowed:
        raise invalid("thinking.type", "thinking.type must be enabled, disabled or adaptive.")
    for name in thinking:
        if name not in allowed[kind]:
            raise _unsupported(
                f"thinking.{name}", f"thinking of type '{kind}' has no field {shown(name)}."
            )
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        raise _unsupported(
            "thinking.display",
            "thinking.display must be summarized (the thinking comes whole) or omitted (its "
            f"blocks come without text); {shown(str(display))} is not supported.",
        )
    if kind == "disabled":
        return {"thinking_off": True}
    if kind == "adaptive":
        return {}  # the model chooses how long it thinks, under max_tokens
    budget = whole(thinking.get("budget_tokens"))
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise type_error("thinking.budget_tokens", "an integer", budget)
    if budget < MIN_THINKING_BUDGET:
        raise invalid(
            "thinking.budget_tokens",
            f"thinking.budget_tokens must be at least {MIN_THINKING_BUDGET}; got {budget}.",
        )
    if max_tokens is not None and budget >= max_tokens:
        raise invalid(
            "thinking.budget_tokens", "thinking.budget_tokens must be less than max_tokens."
        )
    return {"thinking_token_budget": budget}


def _output_config(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    config = _object(raw, "output_config")
    out: dict[str, Any] = {}
    for name in config:
        if name not in ("effort", "format"):
            raise _unsupported(
                f"output_config.{name}", f"'output_config' has no field {shown(name)}."
            )
    effort = config.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise invalid(
                "output_config.effort", f"output_config.effort must be one of {', '.join(EFFORTS)}."
            )
        out["reasoning_effort"] = effort
    form = config.get("format")
    if form is not None:
        form = _object(form, "output_config.format")
        if form.get("type", "json_schema") != "json_schema":
            raise invalid(
                "output_config.format.type", "output_config.format.type must be 'json_schema'."
            )
        schema = form.get("schema")
        if schema is not None:
            out["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "json_schema",
                    "schema": _object(schema, "output_config.format.schema"),
                },
            }
    return out


def _user(raw: Any) -> str | None:
    if raw is None:
        return None
    metadata = _object(raw, "metadata")
    for name in metadata:
        if name != "user_id":
            raise _unsupported(
                f"metadata.{name}", f"'metadata' has no field {shown(name)}; only user_id."
            )
    user = metadata.get("user_id")
    return None if user is None else _text(user, "metadata.user_id")


def needs_of(body: dict[str, Any]) -> Needs:
    """What the conversion of `body` must know of its version's template (checked later)."""
    raw = body.get("messages")
    inline = isinstance(raw, list) and any(
        isinstance(m, dict) and m.get("role") == "system" for m in raw
    )
    thinking = body.get("thinking")
    off = isinstance(thinking, dict) and thinking.get("type") == "disabled"
    return Needs(inline_system=inline, thinking_disabled=off)


def chat_error_renamed(exc: ApiError) -> ApiError:
    """A chat field's error, naming the Messages field the client sent."""
    param = exc.param or ""
    for chat_name, ours in _PARAMS:
        if param == chat_name or param.startswith((chat_name + ".", chat_name + "[")):
            rest = "" if ours in _POSITIONS_DROPPED else param[len(chat_name) :]
            exc.param = ours + rest
            break
    return exc


def messages_chat(
    body: dict[str, Any],
    *,
    count: bool = False,
    merge_inline_system: bool = False,
    disabled_effort: str = "none",
    tenant_id: int | None = None,
) -> GenerationRequest:
    """The chat request of a Messages body (`count`: a count_tokens body), or the 400 naming
    its field. `merge_inline_system` and `disabled_effort` are what the version's template
    needs (inference.messages.views finds them): whether a system message inside `messages`
    must join the leading one, and which reasoning effort turns its thinking off."""
    if count:
        _refuse_unknown(body, COUNT_HONOURED, COUNT_PASSED_TO_CHAT)
    else:
        _refuse_unknown(body, HONOURED, PASSED_TO_CHAT)
    if body.get("cache_control") is not None:
        # Anthropic's automatic caching: the engine's prefix cache keeps every prompt's blocks.
        _object(body["cache_control"], "cache_control")
    max_tokens = None
    if not count:
        if "max_tokens" not in body:
            raise invalid(
                "max_tokens", "'max_tokens' is required.", code="missing_required_parameter"
            )
        max_tokens = whole(body["max_tokens"])
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise type_error("max_tokens", "an integer", max_tokens)
        if max_tokens <= 0:
            raise invalid("max_tokens", "'max_tokens' must be positive.")
    # The tools' schemas compile as they are read (_tool_read), kept apart per tenant.
    with compiled_for(tenant_id) if tenant_id is not None else contextlib.nullcontext():
        messages, changes = _conversation(body, merge_inline_system=merge_inline_system)
        tool_choice, parallel = _tool_choice(body.get("tool_choice"))
        tools = _tools(body.get("tools"), changes)
    chat_body: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if tools is not None and tool_choice is None:
        tool_choice = "auto"
    options: dict[str, Any] = {
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        **_output_config(body.get("output_config")),
    }
    thinking = _thinking(body.get("thinking"), max_tokens)
    if thinking.pop("thinking_off", False):
        options["reasoning_effort"] = disabled_effort
    options.update(thinking)
    passed = COUNT_PASSED_TO_CHAT if count else PASSED_TO_CHAT
    options.update({name: body.get(name) for name in passed})
    if not count:
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise type_error("stream", "a boolean", stream)
        stops = body.get("stop_sequences")
        if stops is not None and (
            not isinstance(stops, list) or not all(isinstance(x, str) for x in stops)
        ):
            raise type_error("stop_sequences", "an array of strings", stops)
        options.update(
            max_tokens=max_tokens,
            stream=bool(stream),
            stop=body.get("stop_sequences"),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            top_k=body.get("top_k"),
            user=_user(body.get("metadata")),
        )
    chat_body.update({k: v for k, v in options.items() if v is not None})
    try:
        return generation_parse(chat_body, endpoint=CHAT, tenant_id=tenant_id)
    except ApiError as exc:
        raise chat_error_renamed(exc) from None
