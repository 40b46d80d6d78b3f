"""The parts of the /v1 OpenAPI document that apps above the API bring: their paths, schemas.

An app that serves /v1 operations of its own describes them in its package and registers the
part from its AppConfig.ready (batches.openapi: files and batches), so the API imports no app
above it. The document lists the parts' paths after the model operations and before those on
one request, their schemas after the model objects, in the order the apps were registered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inference.openapi.schema import Schema


@dataclass(frozen=True)
class Part:
    name: str  # the app's, so that registering again (ready() run twice) replaces it
    paths: Callable[[], dict[str, Schema]]  # a new dict each call: a caller may change it
    schemas: dict[str, Schema]


_PARTS: dict[str, Part] = {}


def part_register(part: Part) -> None:
    """Add an app's part to the document (call it from AppConfig.ready, before any request).

    The document refuses a part that names a path or schema another part, or the API, has.
    """
    _PARTS[part.name] = part


def parts() -> list[Part]:
    return list(_PARTS.values())
