"""Tools and structured output: read from a chat or completions body, checked before queueing.

A constraint the engine cannot compile (a JSON schema, a regex, a grammar) is a 400 naming
the field here, on the frontend, before the request reserves anything: the engine would
otherwise refuse it only after the request waited in the queue. The compilers are
xgrammar's, the library vLLM's structured decoding uses.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dataplane.types import Structured
from inference.base.errors import ApiError, invalid
from inference.body.types import Schema, boolean_or_none, booleans_read, custom
from inference.body.types import type_error as _type_error

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools: the function list, the choice and parallel calls.

    `choice` is "none", "auto", "required" or the name of the function to call.
    """

    tools: list[dict[str, Any]]
    choice: str
    named: bool = False
    parallel: bool | None = None

    @property
    def choice_json(self) -> str:
        """The choice as the request spelt it (a named choice is an object)."""
        if self.named:
            return json.dumps({"type": "function", "function": {"name": self.choice}})
        return json.dumps(self.choice)


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(name, "an object", value)
    return value


def _function(value: Any, where: str) -> dict[str, Any]:
    """One function definition, as vLLM's server keeps it: name, description, parameters, strict."""
    function = _object(value, where)
    name = function.get("name")
    if not isinstance(name, str):
        raise invalid(f"{where}.name", f"Missing required parameter: '{where}.name'.")
    if not _NAME.match(name):
        raise invalid(
            f"{where}.name",
            f"'{where}.name' must be 1 to 64 letters, digits, underscores or dashes.",
        )
    kept: dict[str, Any] = {"name": name}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _type_error(f"{where}.description", "a string", description)
        kept["description"] = description
    parameters = function.get("parameters")
    if parameters is not None:
        kept["parameters"] = _object(parameters, f"{where}.parameters")
    kept.update(booleans_read(function, ("strict", "defer_loading"), where))
    return kept


def _tools(value: Any, name: str, *, legacy: bool) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _type_error(name, "an array", value)
    if len(value) > MAX_TOOLS:
        raise invalid(name, f"'{name}' takes at most {MAX_TOOLS} items, got {len(value)}.")
    tools = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        if legacy:
            function = _function(item, where)
        else:
            tool = _object(item, where)
            if tool.get("type", "function") != "function":
                raise invalid(f"{where}.type", f"'{where}.type' must be 'function'.")
            function = _function(tool.get("function"), f"{where}.function")
        if function["name"] in seen:
            raise invalid(where, f"Two tools are named '{function['name']}'.")
        seen.add(function["name"])
        entry: dict[str, Any] = {"type": "function", "function": function}
        deferred = None if legacy else tool.get("defer_loading")
        if deferred is not None:
            # A tool search's deferred tool (vLLM's): the function carries it too, unless it
            # says otherwise itself.
            if not isinstance(deferred, bool):
                raise _type_error(f"{where}.defer_loading", "a boolean", deferred)
            entry["defer_loading"] = deferred
            function.setdefault("defer_loading", deferred)
        tools.append(entry)
    return tools


def _choice(value: Any, name: str, *, legacy: bool) -> tuple[str, bool]:
    """The tool choice: (mode or function name, whether it names a function)."""
    if isinstance(value, str):
        if value not in TOOL_CHOICES or (legacy and value == "required"):
            allowed = ("none", "auto") if legacy else TOOL_CHOICES
            raise invalid(name, f"'{name}' must be one of {', '.join(allowed)} or a function.")
        return value, False
    choice = _object(value, name)
    if legacy:
        function = choice
    else:
        if choice.get("type", "function") != "function":
            raise invalid(f"{name}.type", f"'{name}.type' must be 'function'.")
        function = _object(choice.get("function"), f"{name}.function")
    called = function.get("name")
    if not isinstance(called, str):
        where = f"{name}.name" if legacy else f"{name}.function.name"
        raise invalid(where, f"Missing required parameter: '{where}'.")
    return called, True


def tools_parse(body: dict[str, Any]) -> ToolUse | None:
    """Return a chat body's tools (legacy `functions` map onto them), or None without any.

    As OpenAI's: tool_choice defaults to "auto" with tools and needs tools otherwise; a named
    choice must name one of them.
    """
    legacy = body.get("functions") is not None or body.get("function_call") is not None
    if legacy and (body.get("tools") is not None or body.get("tool_choice") is not None):
        raise invalid("functions", "Send either 'tools' or the older 'functions', not both.")
    tools_name, choice_name = ("functions", "function_call") if legacy else ("tools", "tool_choice")
    tools_kind, choice_kind = (FUNCTIONS, FUNCTION_CALL) if legacy else (TOOLS, TOOL_CHOICE)
    tools: list[dict[str, Any]] = tools_kind.read(body, tools_name)
    if body.get(tools_name) == []:
        # As vLLM's server and OpenAI's API refuse it: an empty list offers nothing to call.
        raise invalid(
            tools_name,
            f"'{tools_name}' must not be an empty array: send at least one tool or leave it out.",
        )
    chosen: tuple[str, bool] | None = choice_kind.read(body, choice_name)
    parallel = PARALLEL_TOOL_CALLS.read(body, "parallel_tool_calls")
    if chosen is None:
        if not tools:
            return None
        choice, named = "auto", False
    else:
        choice, named = chosen
    if not tools:
        if choice == "none" and not named:
            return None
        raise invalid(
            choice_name, f"'{choice_name}' is only allowed when '{tools_name}' are given."
        )
    if named and choice not in {t["function"]["name"] for t in tools}:
        raise invalid(
            choice_name, f"'{choice_name}' names '{choice}', which is not in '{tools_name}'."
        )
    for i, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is not None:
            where = f"{tools_name}[{i}]" + ("" if legacy else ".function") + ".parameters"
            schema_check(json.dumps(parameters), where)
    return ToolUse(tools=tools, choice=choice, named=named, parallel=parallel)


_FUNCTION: Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": _NAME.pattern},
        "description": {"type": ["string", "null"]},
        "parameters": {
            "type": ["object", "null"],
            "description": "A JSON Schema; compiled before the request is queued.",
        },
        "strict": {"type": ["boolean", "null"]},
        "defer_loading": {
            "type": ["boolean", "null"],
            "description": "A tool search's deferred tool (vLLM's): passed to the template.",
        },
    },
}
TOOLS = custom(
    {
        "type": ["array", "null"],
        "maxItems": MAX_TOOLS,
        "items": {
            "type": "object",
            "required": ["function"],
            "properties": {
                "type": {"const": "function"},
                "function": _FUNCTION,
                "defer_loading": {"type": ["boolean", "null"]},
            },
        },
        "description": "Functions the model may call (chat).",
    },
    lambda body, name: [] if body.get(name) is None else _tools(body[name], name, legacy=False),
)
FUNCTIONS = custom(
    {
        "type": ["array", "null"],
        "maxItems": MAX_TOOLS,
        "items": _FUNCTION,
        "description": "OpenAI's older name for tools: mapped onto them.",
    },
    lambda body, name: [] if body.get(name) is None else _tools(body[name], name, legacy=True),
)
_NAMED: Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}},
}
TOOL_CHOICE = custom(
    {
        "anyOf": [
            {"type": "string", "enum": list(TOOL_CHOICES)},
            {
                "type": "object",
                "required": ["function"],
                "properties": {"type": {"const": "function"}, "function": _NAMED},
            },
            {"type": "null"},
        ],
        "description": "none, auto (the default with tools), required, or a named function.",
    },
    lambda body, name: None if body.get(name) is None else _choice(body[name], name, legacy=False),
)
FUNCTION_CALL = custom(
    {
        "anyOf": [{"type": "string", "enum": ["none", "auto"]}, _NAMED, {"type": "null"}],
        "description": "OpenAI's older name for tool_choice: mapped onto it.",
    },
    lambda body, name: None if body.get(name) is None else _choice(body[name], name, legacy=True),
)
PARALLEL_TOOL_CALLS = boolean_or_none(doc="false: at most one tool call (chat, with tools).")


# --- structured output ---------------------------------------------------------------------


def _schema_text(value: Any, name: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise invalid(name, f"'{name}' is not valid JSON.") from None
    if not isinstance(value, dict | bool):
        raise _type_error(name, "a JSON schema object", value)
    return json.dumps(value)


def response_format_parse(value: Any) -> Structured | None:
    """OpenAI's `response_format`: text (nothing), json_object or json_schema."""
    if value is None:
        return None
    fmt = _object(value, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Structured(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if spec is None:
            raise invalid(
                "response_format.json_schema",
                "When 'response_format.type' is 'json_schema', 'json_schema' must be given.",
            )
        spec = _object(spec, "response_format.json_schema")
        name = spec.get("name")
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise invalid(
                "response_format.json_schema.name",
                "'response_format.json_schema.name' must be 1 to 64 letters, digits, "
                "underscores or dashes.",
            )
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _type_error("response_format.json_schema.strict", "a boolean", strict)
        # vLLM's server reads the schema under "schema" (OpenAI's name) or "json_schema".
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            raise invalid(
                "response_format.json_schema.schema",
                "Missing required parameter: 'response_format.json_schema.schema'.",
            )
        text = _schema_text(schema, "response_format.json_schema.schema")
        schema_check(text, "response_format.json_schema.schema")
        return Structured(json=text)
    raise invalid(
        "response_format.type", "'response_format.type' must be text, json_object or json_schema."
    )


RESPONSE_FORMAT = custom(
    {
        "anyOf": [
            {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"enum": ["text", "json_object"]}},
            },
            {
                "type": "object",
                "required": ["type", "json_schema"],
                "properties": {
                    "type": {"const": "json_schema"},
                    "json_schema": {
                        "type": "object",
                        "required": ["schema"],
                        "properties": {
                            "name": {"type": ["string", "null"], "pattern": _NAME.pattern},
                            "description": {"type": ["string", "null"]},
                            "schema": {"type": ["object", "boolean"]},
                            "strict": {"type": ["boolean", "null"]},
                        },
                    },
                },
            },
            {"type": "null"},
        ],
        "description": "The answer as JSON: any object, or one a JSON Schema describes.",
    },
    lambda body, name: response_format_parse(body.get(name)),
)

_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def structured_outputs_parse(value: Any) -> Structured | None:
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""
    if value is None:
        return None
    spec = _object(value, "structured_outputs")
    unknown = sorted(set(spec) - {*_CONSTRAINTS, *_SWITCHES, "whitespace_pattern"})
    if unknown:
        param = f"structured_outputs.{unknown[0]}"
        raise ApiError(400, "unsupported_parameter", f"'{param}' is not supported.", param=param)
    given = [name for name in _CONSTRAINTS if spec.get(name) is not None]
    if len(given) != 1:
        raise invalid(
            "structured_outputs",
            "'structured_outputs' takes exactly one of json, regex, choice, grammar or "
            f"json_object; got {', '.join(given) or 'none'}.",
        )
    [kind] = given
    where = f"structured_outputs.{kind}"
    _switches_refuse(spec)
    raw = spec[kind]
    if kind == "json":
        text = _schema_text(raw, where)
        schema_check(text, where)
        return Structured(json=text)
    if kind == "json_object":
        if raw is not True:
            raise invalid(where, f"'{where}' must be true.")
        return Structured(json_object=True)
    if kind == "regex":
        if not isinstance(raw, str):
            raise _type_error(where, "a string", raw)
        _compile("regex", raw, where)
        return Structured(regex=raw)
    if kind == "choice":
        if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
            raise _type_error(where, "a non-empty array of strings", raw)
        return Structured(choice=list(raw))
    if kind == "grammar":
        if not isinstance(raw, str):
            raise _type_error(where, "a string", raw)
        _compile("grammar", raw, where)
        return Structured(grammar=raw)
    raise ApiError(400, "unsupported_parameter", f"'{where}' is not supported.", param=where)


def _switches_refuse(spec: dict[str, Any]) -> None:
    """Refuse vLLM's per-request switches that ask for something: its engine reads them from
    its own configuration only (vLLM's server accepts and drops them), so none would happen."""
    for name in (*_SWITCHES, "whitespace_pattern"):
        value = spec.get(name)
        where = f"structured_outputs.{name}"
        if value is None or value is False:
            continue
        if name != "whitespace_pattern" and not isinstance(value, bool):
            raise _type_error(where, "a boolean", value)
        raise ApiError(
            400,
            "unsupported_parameter",
            f"'{where}' is not supported: the engine sets it for the whole deployment, not "
            "per request; leave it out.",
            param=where,
        )


_SWITCHES = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback")
STRUCTURED_OUTPUTS = custom(
    {
        "type": ["object", "null"],
        "description": "vLLM's constraint on the output: exactly one of json, regex, choice, "
        "grammar or json_object.",
        "properties": {
            "json": {"type": ["object", "boolean", "string"]},
            "regex": {"type": "string"},
            "choice": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "grammar": {"type": "string", "description": "EBNF (xgrammar's dialect)."},
            "json_object": {"const": True},
            # vLLM's per-request switches: its engine reads them from its configuration
            # only, so they are refused unless they ask for nothing.
            "whitespace_pattern": {"type": "null"},
            **{name: {"enum": [False, None]} for name in _SWITCHES},
        },
        "additionalProperties": False,
    },
    lambda body, name: structured_outputs_parse(body.get(name)),
)


# --- compiling, as the engine will -----------------------------------------------------------

_xgrammar: Any = None
_xgrammar_lock = threading.Lock()
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


def _compiler() -> Any:
    """xgrammar, imported on first use (it loads torch, which plain requests never need)."""
    global _xgrammar
    with _xgrammar_lock:
        if _xgrammar is None:
            import xgrammar

            _xgrammar = xgrammar
    return _xgrammar


# Whose request is being read: compiled texts are kept per tenant (see _compiles).
_tenant: contextvars.ContextVar[int] = contextvars.ContextVar("compile_tenant", default=0)


@contextlib.contextmanager
def compiled_for(tenant_id: int) -> Iterator[None]:
    """Keep what is compiled while reading one tenant's request apart from other tenants'."""
    token = _tenant.set(tenant_id)
    try:
        yield
    finally:
        _tenant.reset(token)


def _compile(kind: str, text: str, where: str) -> None:
    if "\x00" in text:
        raise invalid(where, f"'{where}' cannot contain the NUL character.")
    try:
        _compiles(kind, text, _tenant.get())
    except _Uncompilable as exc:
        raise invalid(where, f"'{where}' cannot be compiled: {exc}.") from None


class _Uncompilable(Exception):
    """A text the compiler refused; the message is its reason."""


# A client sends the same tools and schemas with every request of a conversation: each text
# compiles once per frontend and tenant, wherever the request holds it. Per tenant, because a
# cached text answers sooner: a tenant must not learn from the time its request took that
# another sent the same schema. Failures are not kept (an exception is never cached).
@functools.lru_cache(maxsize=1024)
def _compiles(kind: str, text: str, tenant_id: int) -> None:
    grammar = _compiler().Grammar
    build = {
        "json": grammar.from_json_schema,
        "regex": grammar.from_regex,
        "grammar": grammar.from_ebnf,
    }[kind]
    try:
        build(text)
    except Exception as exc:  # xgrammar raises RuntimeError with the compiler's message
        reason = _CPP_PREFIX.sub("", str(exc).strip().splitlines()[0] if str(exc) else "")
        raise _Uncompilable(reason or type(exc).__name__) from None


def schema_check(schema: str, where: str) -> None:
    """Raise the 400 of a JSON schema the engine's structured decoding cannot compile."""
    _compile("json", schema, where)


def structured_ready() -> None:
    """Load the compiler now (a frontend calls it at start, so no request waits for it)."""
    _compiler()
