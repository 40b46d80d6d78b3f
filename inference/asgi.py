"""A lean ASGI handler for the /v1 data plane.

Django's HTML middleware (sessions, CSRF, messages) runs each hook through a thread hop in
async mode; the API authenticates by key and needs none of it, so its requests skip the stack.

Django's handler also opens a thread-sensitive context per request and closes each response
through `sync_to_async`, which starts a thread per request just to close it (and a database
call inside that context would open a connection of its own in that thread). The API's
responses hold no resources that need a thread to close, and its database calls run on
`inference.db`'s own threads, so this handler does neither.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix

from inference.metrics import loop_lag_watch

API_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics")


def is_api_path(path: str) -> bool:
    return path == "/v1" or path.startswith(API_PREFIXES)


class ApiHandler(ASGIHandler):
    """An ASGI handler whose request path has no middleware and no thread hops."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # The same innermost callable Django's own load_middleware wraps, minus the layers.
        get_response = self._get_response_async if is_async else self._get_response  # type: ignore[attr-defined]
        self._middleware_chain = convert_exception_to_response(get_response)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"the API handler serves HTTP only, not {scope['type']}")
        loop_lag_watch()
        await self.handle(scope, receive, send)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one request as Django's handler does, closing its response inline."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # create_request returns one or the other
            body_file.close()
            await self.send_response(error_response, send)
            error_response.close()
            return
        # A client that goes away mid-response cancels the view (a stream stops and its
        # request is cancelled in the engine).
        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        serving = asyncio.create_task(self._serve(request, send))
        try:
            await asyncio.wait([listener, serving], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listener, serving):
                if not task.done():
                    task.cancel()
            await asyncio.gather(listener, serving, return_exceptions=True)
            body_file.close()
        if serving.cancelled():
            await signals.request_finished.asend(sender=self.__class__)
            return
        exc = serving.exception()
        if exc is not None:
            raise exc
        serving.result().close()

    async def _serve(self, request: Any, send: Any) -> Any:
        response = await self.run_get_response(request)
        # A client that disconnects while the response is being sent cancels the send.
        with contextlib.suppress(asyncio.CancelledError):
            await self.send_response(response, send)
        return response
