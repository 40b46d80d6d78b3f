"""Tools and structured output: read from a chat or completions body, checked before queueing.

A constraint the engine cannot compile (a JSON schema, a regex, a grammar) is a 400 naming
the field here, on the frontend, before the request reserves anything: the engine would
otherwise refuse it only after the request waited in the queue. The compilers are
xgrammar's, the library vLLM's structured decoding uses.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import msgspec

from dataplane.types import Structured
from inference.errors import ApiError, invalid

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


def _type_error(name: str, expected: str, value: Any) -> ApiError:
    return invalid(
        name,
        f"Invalid type for '{name}': expected {expected}, got {type(value).__name__}.",
        code="invalid_type",
    )


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
    strict = function.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise _type_error(f"{where}.strict", "a boolean", strict)
        kept["strict"] = strict
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
        tools.append({"type": "function", "function": function})
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
    raw_tools, raw_choice = body.get(tools_name), body.get(choice_name)
    tools = _tools(raw_tools, tools_name, legacy=legacy) if raw_tools is not None else []
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _type_error("parallel_tool_calls", "a boolean", parallel)
    if raw_choice is None:
        if not tools:
            return None
        choice, named = "auto", False
    else:
        choice, named = _choice(raw_choice, choice_name, legacy=legacy)
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
    whitespace = spec.get("whitespace_pattern")
    if whitespace is not None and not isinstance(whitespace, str):
        raise _type_error("structured_outputs.whitespace_pattern", "a string", whitespace)
    raw = spec[kind]
    if kind == "json":
        text = _schema_text(raw, where)
        schema_check(text, where)
        return _switched(
            Structured(
                json=text,
                whitespace_pattern=whitespace,
            ),
            spec,
        )
    if kind == "json_object":
        if raw is not True:
            raise invalid(where, f"'{where}' must be true.")
        return _switched(
            Structured(
                json_object=True,
                whitespace_pattern=whitespace,
            ),
            spec,
        )
    if kind == "regex":
        if not isinstance(raw, str):
            raise _type_error(where, "a string", raw)
        _compile("regex", raw, where)
        return _switched(
            Structured(
                regex=raw,
            ),
            spec,
        )
    if kind == "choice":
        if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
            raise _type_error(where, "a non-empty array of strings", raw)
        return _switched(
            Structured(
                choice=list(raw),
            ),
            spec,
        )
    if kind == "grammar":
        if not isinstance(raw, str):
            raise _type_error(where, "a string", raw)
        _compile("grammar", raw, where)
        return _switched(
            Structured(
                grammar=raw,
            ),
            spec,
        )
    raise ApiError(400, "unsupported_parameter", f"'{where}' is not supported.", param=where)


_SWITCHES = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback")


def _switched(structured: Structured, spec: dict[str, Any]) -> Structured:
    """The constraint with vLLM's switches the request set (disable_fallback is the
    server's business: the engine picks its backend as vLLM's server does)."""
    kept = {}
    for name in _SWITCHES:
        value = spec.get(name)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise _type_error(f"structured_outputs.{name}", "a boolean", value)
        if name != "disable_fallback":
            kept[name] = value
    return msgspec.structs.replace(structured, **kept)


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


def _compile(kind: str, text: str, where: str) -> None:
    if "\x00" in text:
        raise invalid(where, f"'{where}' cannot contain the NUL character.")
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
        message = f"'{where}' cannot be compiled: {reason or type(exc).__name__}."
        raise invalid(where, message) from None


def schema_check(schema: str, where: str) -> None:
    """Raise the 400 of a JSON schema the engine's structured decoding cannot compile."""
    _compile("json", schema, where)


def structured_ready() -> None:
    """Load the compiler now (a frontend calls it at start, so no request waits for it)."""
    _compiler()
