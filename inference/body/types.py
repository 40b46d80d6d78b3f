"""What a body field holds: its JSON Schema and how a value is read, declared together.

A `Kind` is the one declaration of a field's type. inference.body.fields gives every field of a
request its kind; the request parsers read values through it (a wrong value is a 400 naming
the field) and the OpenAPI document publishes its schema, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from config.json_body import shown
from inference.base.errors import ApiError, invalid

Schema = dict[str, Any]
Reader = Callable[[dict[str, Any], str], Any]
MAX_TOKENS = 1 << 30
NO_NUL = "^[^\\x00]*$"


@dataclass(frozen=True)
class Kind:
    """A field's type: the schema the API publishes and the reader that enforces it.

    `read(body, name)` returns the field's value (its default when absent or null) or raises
    the 400 naming it.
    """

    schema: Schema
    read: Reader


def kinds_read(body: dict[str, Any], kinds: list[tuple[str, Kind]]) -> dict[str, Any]:
    """Each named field's value in `body`, read by its kind in the order given (the first
    wrong one is the 400).

    The loop stands here, beside the readers it calls, so a pass of fields is read in one go
    rather than by a hop out of the field table and back per field (measured: a chat body's
    read then enters this file once per pass, bench/request_trip.py)."""
    return {name: kind.read(body, name) for name, kind in kinds}


def type_error(name: str, expected: str, value: Any) -> ApiError:
    return invalid(
        name,
        f"Invalid type for '{name}': expected {expected}, got {type(value).__name__}.",
        code="invalid_type",
    )


def booleans_read(source: dict[str, Any], names: tuple[str, ...], where: str) -> dict[str, bool]:
    """The named flags `source` sets (absent or null: left out), each checked a boolean."""
    found = {}
    for name in names:
        value = source.get(name)
        if value is not None:
            if not isinstance(value, bool):
                raise type_error(f"{where}.{name}", "a boolean", value)
            found[name] = value
    return found


def _described(schema: Schema, doc: str) -> Schema:
    return {**schema, "description": doc} if doc else schema


def whole(value: Any) -> Any:
    """A number without a fraction (4.0) as the integer it is, as JSON Schema reads it and
    vLLM's server takes it (clients that compute a count send one); anything else as it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def integer(lo: int, hi: int, *, default: int | None = None, doc: str = "") -> Kind:
    def read(body: dict[str, Any], name: str) -> int | None:
        value = body.get(name)
        if value is None:
            return default
        value = whole(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise type_error(name, "an integer", value)
        if not lo <= value <= hi:
            raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {shown(value)}.")
        return value

    schema = {"type": ["integer", "null"], "minimum": lo, "maximum": hi}
    return Kind(_described(schema, doc), read)


def number(
    lo: float,
    hi: float,
    *,
    default: float | None = None,
    above: bool = False,
    doc: str = "",
) -> Kind:
    """A number from `lo` (or above it, with `above`) to `hi`."""

    def read(body: dict[str, Any], name: str) -> float | None:
        value = body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise type_error(name, "a number", value)
        # Compared before any float(): an integer too large for a float (a body that did not
        # come through body_parse, like a batch line) is out of range, not an OverflowError.
        # NaN compares false, so it is out of range too.
        if not lo <= value <= hi:
            raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {shown(value)}.")
        if above and value == lo:
            raise invalid(name, f"'{name}' must be above {lo} and at most {hi}, got {lo}.")
        return float(value)

    bound = {"exclusiveMinimum": lo} if above else {"minimum": lo}
    return Kind(_described({"type": ["number", "null"], **bound, "maximum": hi}, doc), read)


def boolean(*, default: bool = False, doc: str = "") -> Kind:
    def read(body: dict[str, Any], name: str) -> bool:
        value = body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise type_error(name, "a boolean", value)
        return value

    return Kind(_described({"type": ["boolean", "null"]}, doc), read)


def boolean_or_none(*, doc: str = "") -> Kind:
    """A boolean where absence means something of its own (None)."""

    def read(body: dict[str, Any], name: str) -> bool | None:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise type_error(name, "a boolean", value)
        return value

    return Kind(_described({"type": ["boolean", "null"]}, doc), read)


def string(*, required: bool = False, nul: bool = True, doc: str = "") -> Kind:
    """A string; `nul=False` refuses the NUL character (the value is stored)."""

    def read(body: dict[str, Any], name: str) -> str | None:
        value = body.get(name)
        if value is None:
            if required:
                raise invalid(
                    name,
                    f"Missing required parameter: '{name}'.",
                    code="missing_required_parameter",
                )
            return None
        if not isinstance(value, str):
            raise type_error(name, "a string", value)
        if not nul and "\x00" in value:
            raise invalid(name, f"'{name}' cannot contain the NUL character.")
        return value

    schema: Schema = {"type": "string" if required else ["string", "null"]}
    if not nul:
        schema["pattern"] = NO_NUL
    return Kind(_described(schema, doc), read)


def one_of(values: Sequence[str], *, doc: str = "") -> Kind:
    """One of a few strings; absent or null reads as None."""

    def read(body: dict[str, Any], name: str) -> str | None:
        value = body.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise type_error(name, "a string", value)
        if value not in values:
            raise invalid(name, f"'{name}' must be one of {', '.join(sorted(values))}.")
        return value

    return Kind(_described({"type": ["string", "null"], "enum": [*values, None]}, doc), read)


def is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


TOKEN_IDS: Schema = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "integer", "minimum": 0},
    "description": "Token ids, each below the model's vocabulary size.",
}


def _item_refused(where: str, item: Any, of: tuple[type, str], message: str) -> None:
    """Refuse one item of a list, naming it: for its type (`of`: the Python type and its
    name), else (`message`) for its value."""
    kind, named = of
    if isinstance(item, bool) or not isinstance(item, kind):
        raise type_error(where, named, item)
    raise invalid(where, message)


def token_list(*, doc: str = "") -> Kind:
    """A list of token ids (their range is checked against the vocabulary when tokenising)."""

    def read(body: dict[str, Any], name: str) -> list[int]:
        value = body.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            raise type_error(name, "an array of token ids", value)
        for i, token in enumerate(value):
            if not is_token(token):
                where = f"{name}[{i}]"
                _item_refused(where, token, (int, "a token id"), f"'{where}' is below 0: {token}.")
        return list(value)

    schema = {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}}
    return Kind(_described(schema, doc), read)


def strings(*, doc: str = "") -> Kind:
    """A list of non-empty strings."""

    def read(body: dict[str, Any], name: str) -> list[str]:
        value = body.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            raise type_error(name, "an array of non-empty strings", value)
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                where = f"{name}[{i}]"
                _item_refused(where, item, (str, "a string"), f"'{where}' is empty.")
        return list(value)

    schema = {"type": ["array", "null"], "items": {"type": "string", "minLength": 1}}
    return Kind(_described(schema, doc), read)


# A JSON Schema type: the Python types of its values, and how an error names it.
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "string": ((str,), "a string"),
    "object": ((dict,), "an object"),
    "array": ((list,), "an array"),
    "integer": ((int,), "an integer"),
    "number": ((int, float), "a number"),
    "boolean": ((bool,), "a boolean"),
}


def accepted(schema: Schema | None = None, *, doc: str = "") -> Kind:
    """A field taken as it comes: it cannot change the answer, so nothing uses it. A value
    of another JSON type than its schema's is still refused (the types are the contract)."""
    schema = schema or {}
    types = [t for t in schema.get("type", []) if t != "null"]

    def read(body: dict[str, Any], name: str) -> Any:
        value = body.get(name)
        if value is None or not types:
            return value
        for kind in types:
            python, _ = _JSON_TYPES[kind]
            if isinstance(value, python) and (kind == "boolean") == isinstance(value, bool):
                return value
        raise type_error(name, " or ".join(_JSON_TYPES[kind][1] for kind in types), value)

    return Kind(_described(schema, doc), read)


def custom(schema: Schema, read: Reader) -> Kind:
    """A field whose reader is its own (messages, tools, a response format, ...)."""
    return Kind(schema, read)
