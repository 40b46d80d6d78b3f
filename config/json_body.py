"""The limits every JSON body the platform reads meets, whichever API or protocol carries it.

Python's json module accepts what no field of ours can use and what breaks later, far from the
parse: lone UTF-16 surrogates (PostgreSQL, Valkey and UTF-8 encoders refuse them), nesting deep
enough to exhaust the recursion limit, NaN and Infinity, integers too large for a float or a
64-bit field. A body is checked once, right after parsing, and a problem names the field at
fault, so the client hears a 400 instead of a server error somewhere downstream.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any

import msgspec

MAX_DEPTH = 32  # objects and arrays inside one another; OpenAI's deepest body needs about 6
MAX_INTEGER = 1 << 64  # larger magnitudes fit no field and overflow a float
SHOWN_CHARS = 64  # how much of a client's value a message echoes
_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyProblem(ValueError):
    """A body that cannot be used, and the field at fault (a path: `messages[0].content`)."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """Return a client's value as a message may echo it: at most `limit` characters, valid text."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    return _SURROGATE.sub("\ufffd", text)


# Parses a valid document about five times faster than the json module (a 4 MB chat body:
# 1.2 ms against 6.2), to the same values; anything it refuses goes to the json module, which
# decides and says why, so what is accepted and every error message stay the json module's.
_fast = msgspec.json.Decoder()


def json_load(raw: bytes | str, *, what: str = "The request body") -> Any:
    """Return the value of a JSON text, or raise BodyProblem saying why it is not JSON we read."""
    # Whatever it refuses, the json module below has the last word.
    with contextlib.suppress(msgspec.MsgspecError, RecursionError, ValueError):
        return _fast.decode(raw)
    try:
        return json.loads(raw)
    except RecursionError:
        field = _deep_field(raw)
        where = f"'{field}'" if field else what
        message = f"{where} nests objects and arrays deeper than {MAX_DEPTH} levels."
        raise BodyProblem(message, param=field, code="invalid_json") from None
    except json.JSONDecodeError as exc:
        message = f"{what} is not valid JSON: {exc.msg} at character {exc.pos}."
        raise BodyProblem(message, code="invalid_json") from None
    except UnicodeDecodeError:
        raise BodyProblem(f"{what} is not valid UTF-8.", code="invalid_json") from None
    except ValueError:
        # Python refuses to convert integers of more than 4,300 digits (a CPU guard).
        message = f"{what} holds an integer with too many digits."
        raise BodyProblem(message, code="invalid_json") from None


def _skip_space(text: str, at: int) -> int:
    while text[at : at + 1] in (" ", "\t", "\n", "\r") and at < len(text):
        at += 1
    return at


def _deep_field(raw: bytes | str) -> str | None:
    """Return the top-level field of an object whose value nests too deep to parse, if one."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    decoder = json.JSONDecoder()
    at = _skip_space(text, 0)
    if text[at : at + 1] != "{":
        return None
    try:
        while True:
            key, at = decoder.raw_decode(text, _skip_space(text, at + 1))
            at = _skip_space(text, at)
            if not isinstance(key, str) or text[at] != ":":
                return None
            try:
                _, at = decoder.raw_decode(text, _skip_space(text, at + 1))
            except RecursionError:
                return shown(key, 32)
            at = _skip_space(text, at)
            if text[at] != ",":
                return None
    except (ValueError, IndexError):
        return None


def _top_field(path: str) -> str | None:
    return re.split(r"[.\[]", path, maxsplit=1)[0] or None


def _key_path(path: str, key: str) -> str:
    name = shown(key, 32)
    return f"{path}.{name}" if path else name


def _text_check(text: str, param: str | None, *, nul: bool) -> None:
    where = f"'{param}'" if param else "The body"
    if not text.isascii() and _SURROGATE.search(text):
        raise BodyProblem(
            f"{where} holds a lone surrogate, which is not valid Unicode.", param=param
        )
    if not nul and "\x00" in text:
        raise BodyProblem(f"{where} cannot contain the NUL character.", param=param)


def _number_check(value: int | float, param: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise BodyProblem(f"'{param}' must be a finite number.", param=param)
    if isinstance(value, int) and not -MAX_INTEGER < value < MAX_INTEGER:
        raise BodyProblem(f"'{param}' is out of range.", param=param)


def json_check(value: Any, *, nul: bool = True, root: str = "") -> None:
    """Raise BodyProblem at the first field of a parsed body that breaks the limits.

    The walk is iterative, so it cannot itself run out of stack. `nul=False` also refuses the
    NUL character in every string (for bodies stored as they are). `root` prefixes the paths.
    """
    stack: list[tuple[Any, str, int]] = [(value, root, 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list) and depth > MAX_DEPTH:
            field = _top_field(path)
            where = f"'{field}'" if field else "The body"
            message = f"{where} nests objects and arrays deeper than {MAX_DEPTH} levels."
            raise BodyProblem(message, param=field, code="invalid_json")
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                where = _key_path(path, key)
                _text_check(key, where, nul=nul)
                children.append((child, where, depth + 1))
            stack.extend(reversed(children))  # report the first problem in document order
        elif isinstance(item, list):
            if set(map(type, item)) <= {int}:
                # Token ids: thousands of small integers, checked in C rather than one by one.
                if item and (max(item) >= MAX_INTEGER or min(item) <= -MAX_INTEGER):
                    bad = next(i for i, t in enumerate(item) if not -MAX_INTEGER < t < MAX_INTEGER)
                    _number_check(item[bad], f"{path}[{bad}]")
                continue
            stack.extend((item[i], f"{path}[{i}]", depth + 1) for i in reversed(range(len(item))))
        elif isinstance(item, str):
            _text_check(item, path or None, nul=nul)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            _number_check(item, path or "body")


def json_document(raw: bytes | str, *, nul: bool = True, what: str = "The request body") -> Any:
    """Return a JSON body that meets the limits, or raise BodyProblem naming the field at fault."""
    value = json_load(raw, what=what)
    json_check(value, nul=nul)
    return value
