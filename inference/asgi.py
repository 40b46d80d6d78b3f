"""A lean ASGI handler for the /v1 data plane.

Django's HTML middleware (sessions, CSRF, messages) runs each hook through a thread hop in
async mode; the API authenticates by key and needs none of it, so its requests skip the stack.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

API_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics")


def is_api_path(path: str) -> bool:
    return path == "/v1" or path.startswith(API_PREFIXES)


class ApiHandler(ASGIHandler):
    """An ASGI handler whose request path has no middleware."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # The same innermost callable Django's own load_middleware wraps, minus the layers.
        get_response = self._get_response_async if is_async else self._get_response  # type: ignore[attr-defined]
        self._middleware_chain = convert_exception_to_response(get_response)
