"""The building blocks of the /v1 API's OpenAPI document: a JSON Schema and its shorthands."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

MAX_TOKENS = 1 << 30
NO_NUL = "^[^\\x00]*$"
PATH_SEGMENT = "^[^/]+$"  # what Django's <str:...> converter matches
ENTRY_ID = "^\\d{1,20}-\\d{1,20}$"


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def integer(lo: int, hi: int, description: str = "") -> Schema:
    schema: Schema = {"type": ["integer", "null"], "minimum": lo, "maximum": hi}
    return {**schema, "description": description} if description else schema


def number(lo: float, hi: float, description: str = "") -> Schema:
    schema: Schema = {"type": ["number", "null"], "minimum": lo, "maximum": hi}
    return {**schema, "description": description} if description else schema


def obj(properties: dict[str, Schema], *required: str, **extra: Any) -> Schema:
    return {"type": "object", "required": list(required), "properties": properties, **extra}


def json_content(schema: Schema) -> dict[str, Schema]:
    return {"application/json": {"schema": schema}}
