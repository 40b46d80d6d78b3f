"""A lean ASGI handler for the /v1 data plane.

Django's HTML middleware (sessions, CSRF, messages) runs each hook through a thread hop in
async mode; the API authenticates by key and needs none of it, so its requests skip the stack.

Django's handler also opens a thread-sensitive context per request and closes each response
through `sync_to_async`, which starts a thread per request just to close it (and a database
call inside that context would open a connection of its own in that thread). The API's
responses hold no resources that need a thread to close, and its database calls run on
`config.db`'s own threads, so this handler does neither.

Cheap checks come before the body is read at all: a Content-Length over the path's limit is
refused, and so is a request with a body that needs a key and has no valid one, and a request
to a counted path (`counted_paths`) past its tenant's requests per minute; the body is then read
with the limit enforced chunk by chunk (a 413 the moment it is passed, nothing more read).
Everything else (scopes, parsing, the other limits) is the views' work.

Every response is written within a write timeout (`send_response`): uvicorn's send waits while
its buffer for the connection is full, so a client that stops reading stalls it; past
ROUNDHOUSE_WRITE_TIMEOUT_SECONDS on one message the response is given up, its connection closed
and what it held freed (a stream's request is cancelled as on a disconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import StreamingHttpResponse
from django.urls import URLResolver, get_resolver, set_script_prefix

from config.turns import Counts, Turns
from inference.base.errors import ApiError, should_retry
from inference.base.metrics import loop_lag_watch, write_timeouts
from inference.pipeline.admission import body_bytes_count, request_count
from inference.pipeline.auth import Principal, credentials, key_check, scope_check
from tenants.models import Scope

log = logging.getLogger(__name__)
API_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics")
# vLLM's operational endpoints, at its paths (inference.operations.views); these two take a key.
KEYED_OPERATION_PATHS = ("/tokenize", "/detokenize")
OPERATION_PATHS = ("/health", "/ping", "/version", *KEYED_OPERATION_PATHS)
# The /v1 paths a client may call without a key.
KEYLESS_PATHS = ("/v1/openapi.json",)
UPLOAD_PATH = "/v1/files"
# Where the handler leaves the principal of a key it checked before reading the body.
CHECKED_PRINCIPAL = "roundhouse.principal"
TURN_OVER = "roundhouse.turn_over"  # in a large body's scope: ends its reading turn (_turns)
# The requests that count against their tenant's requests per minute are counted here before
# their body is read: a throttled tenant's flood of large bodies costs a frontend their headers
# only. Which endpoints count is the views' own mark (`api_endpoint(counted=True)`), read from
# the URL table. A request counted here says so in its scope (COUNTED): its view counts it no
# more.
COUNTS_REQUESTS = "counts_requests"
COUNTED = "roundhouse.counted"
COUNT_BYTES_READ = "roundhouse.count_bytes_read"
MULTIPART_SLACK = 64 * 1024  # a multipart form's own bytes around the file it carries


# Whose large bodies a frontend reads and parses now: one of each tenant's at a time. Reading a
# body of megabytes takes a frontend's event loop through dozens of chunks, then it is joined
# and parsed; a tenant posting many at once would hold the loop that every other tenant's
# requests wait for. Its further large bodies wait their turn unread (the client's sends
# stall), so a flood of them slows its own tenant most. A turn lasts from the first byte read
# until its view has parsed the body (`turn_over`), or the request ends.
_turns = Turns(lambda: int(settings.ROUNDHOUSE_LARGE_BODIES_PER_TENANT))


class _Refused:
    """Tenants this frontend refused a moment ago, refused again from memory until then.

    A tenant out of requests for the minute, or of large-body bytes, gets its next 429s here
    until a retry could succeed (at most MAX_SECONDS later, so a raised quota shows soon),
    without a round trip to Valkey: a flood whose clients do not wait out their 429s costs a
    frontend their heads. A request refused from memory takes nothing from the tenant's
    limits; it would have been refused anyway.
    """

    MAX_SECONDS = 1.0
    MAX_TENANTS = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (tenant, limit) -> (until, the smallest size it holds for, the refusal)
        self._until: dict[tuple[int, str], tuple[float, int, ApiError]] = {}

    def remember(self, tenant_id: int, limit: str, error: ApiError, *, size: int = 0) -> None:
        wait = min(error.retry_after or 0.0, self.MAX_SECONDS)
        if wait <= 0:
            return
        now = self._clock()
        if len(self._until) >= self.MAX_TENANTS:
            self._until = {k: v for k, v in self._until.items() if v[0] > now}
        self._until[(tenant_id, limit)] = (now + wait, size, error)

    def refusal(self, tenant_id: int, limit: str, *, size: int = 0) -> ApiError | None:
        """The refusal a request would get now, or None: ask Valkey. A larger body needs at
        least as many bytes as the one refused, a smaller one may fit."""
        found = self._until.get((tenant_id, limit))
        if found is None:
            return None
        until, at_least, error = found
        now = self._clock()
        if now >= until:
            del self._until[(tenant_id, limit)]
            return None
        if size < at_least:
            return None
        return ApiError(
            error.status,
            error.code,
            error.message,
            param=error.param,
            retry_after=until - now,
            headers=error.headers,
        )


_refused = _Refused()

# A throttled tenant's 429 is answered when a retry could pass, at most this many seconds
# later, for at most this many of its requests at once on a frontend (the rest at once).
HOLD_MAX_SECONDS = 1.0
HOLD_MAX_PER_TENANT = 16
HELD_CODES = frozenset({"rate_limit_exceeded", "body_bytes_exceeded"})
_holding = Counts()  # per tenant: its refusals held now
_sleep = asyncio.sleep  # (tests wait on their own clock)


async def refusal_held(tenant_id: int, refusal: ApiError) -> ApiError:
    """Hold a tenant's 429 (requests per minute, large-body bytes) until a retry could pass.

    Its client would have to wait that long anyway, and the 429 says so (its Retry-After is
    what is left of the wait); a client that retries at once instead of waiting is slowed
    to the pace its limits allow, rather than looping as fast as the frontend answers.
    """
    wait = min(refusal.retry_after or 0.0, HOLD_MAX_SECONDS)
    if wait <= 0 or _holding.get(tenant_id, 0) >= HOLD_MAX_PER_TENANT:
        return refusal
    _holding.enter(tenant_id)
    try:
        await _sleep(wait)
    finally:
        _holding.leave(tenant_id)
    refusal.retry_after = max((refusal.retry_after or 0.0) - wait, 0.0)
    return refusal


def _large(scope: Any) -> bool:
    """Whether a request's body is, or may be, at least ROUNDHOUSE_LARGE_BODY_BYTES."""
    length = _header(scope, b"content-length")
    if length is None:
        return _header(scope, b"transfer-encoding") is not None  # chunked: unknown
    length = length.strip()
    return not length.isdigit() or int(length) >= settings.ROUNDHOUSE_LARGE_BODY_BYTES


@functools.cache
def counted_paths() -> frozenset[str]:
    """The paths of the endpoints marked as counting requests, from the URL table."""
    found: set[str] = set()

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif getattr(pattern.callback, COUNTS_REQUESTS, False):
                found.add("/" + prefix + str(pattern.pattern))

    walk(get_resolver().url_patterns, "")
    return frozenset(found)


def is_api_path(path: str) -> bool:
    return path == "/v1" or path.startswith(API_PREFIXES) or path in OPERATION_PATHS


class _TooLarge(Exception):
    pass


class WriteTimeout(Exception):
    """A response's client took none of a message within ROUNDHOUSE_WRITE_TIMEOUT_SECONDS."""


class _WriteWatch:
    """An ASGI `send` that raises WriteTimeout from a message it could not hand on within
    `seconds` (uvicorn's send waits while the connection's write buffer is full).

    One timer per response rather than one per message: a stream sends an event per few
    tokens, and a timer set and cancelled around each send cost several microseconds apiece.
    The timer looks at the send in flight when it fires, and is set again for its due time.
    """

    def __init__(self, send: Any, seconds: float) -> None:
        self._send = send
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._since: float | None = None  # when the send in flight began
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    async def __call__(self, message: Any) -> None:
        self._since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(self._since + self._seconds, self._check)
        try:
            await self._send(message)
        except asyncio.CancelledError:
            # Cancelled by the timer alone (not by a disconnect as well): a write timeout.
            if self._expired and self._task is not None and self._task.uncancel() == 0:
                raise WriteTimeout() from None
            raise
        finally:
            self._since = None

    def _check(self) -> None:
        self._timer = None
        if self._since is None or self._task is None:
            return  # nothing waits: the next send sets the timer again
        due = self._since + self._seconds
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self._expired = True
        self._task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class LastPart:
    """Set by a stream as it yields its last part, so that the part ends the response's body.

    Django sends a streamed body's end as a message of its own, after the last part, which its
    server writes alone (chunked encoding's `0\r\n\r\n`). A stream's end is its last event's
    write: `_BodyEnd` sends that part as the body's end instead, one write fewer per stream.
    """

    __slots__ = ("reached",)

    def __init__(self) -> None:
        self.reached = False


class LastPartResponse(StreamingHttpResponse):
    """A streamed response whose stream says, through `last`, which of its parts is its last:
    `ApiHandler` ends the body with that part (`_BodyEnd`)."""

    def __init__(self, streaming_content: Any, *, last: LastPart, **kwargs: Any) -> None:
        super().__init__(streaming_content, **kwargs)
        self.last = last


class _BodyEnd:
    """An ASGI `send` that ends a streamed body with its last part (`LastPart`) rather than
    after it: once the stream reached its last part, each body message is held until the next
    one, and the body's end carries the held part."""

    def __init__(self, send: Any, last: LastPart) -> None:
        self._send = send
        self._last = last
        self._held: Any = None

    async def __call__(self, message: Any) -> None:
        if message["type"] != "http.response.body" or not self._last.reached:
            await self._send(message)
            return
        held, self._held = self._held, None
        if message.get("more_body", False):
            if held is not None:  # a part larger than one message: all but its last slice
                await self._send(held)
            self._held = message
            return
        if held is None or message.get("body"):
            if held is not None:
                await self._send(held)
            await self._send(message)
            return
        await self._send({"type": "http.response.body", "body": held["body"]})


def _length_unsaid(response: Any) -> bool:
    """Whether a response is a whole body that does not say its length yet and may: a status
    that has a body (not 1xx, 204 or 304), not a stream."""
    status = response.status_code
    return (
        not response.streaming
        and not (status < 200 or status in (204, 304))
        and not response.has_header("Content-Length")
    )


class ResponseCut(Exception):
    """Raised by a streamed body that cannot go on (what it sends is gone): the connection is
    cut short of the response's length, so its client sees it incomplete, not ended."""


async def _connection_cut(send: Any) -> None:
    """Close a response's connection now, dropping what its server still buffers.

    uvicorn's send is a method of the request's cycle, which holds the connection's transport
    (asyncio's or uvloop's: not a subclass of one another, so it is asked for `abort`).
    Closing it instead would wait for the buffer to drain, which a client that stopped
    reading never lets happen. A server that shows none closes the connection itself once
    the handler returns with the response unfinished.
    """
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    abort = getattr(transport, "abort", None)
    if callable(abort):
        abort()
        # Let the connection's loss reach uvicorn before the application returns, or it
        # reports a response the application left incomplete (an error, for each cut).
        await asyncio.sleep(0)


def body_limit(path: str) -> int:
    """The most bytes a request body to `path` may have: a file upload's, or any request's."""
    if path == UPLOAD_PATH:
        return int(settings.ROUNDHOUSE_MAX_FILE_BYTES) + MULTIPART_SLACK
    return int(settings.MAX_REQUEST_BYTES)


def _too_large(path: str) -> ApiError:
    if path == UPLOAD_PATH:
        limit = settings.ROUNDHOUSE_MAX_FILE_BYTES
        return ApiError(413, "file_too_large", f"The file exceeds {limit} bytes.", param="file")
    limit = settings.MAX_REQUEST_BYTES
    return ApiError(413, "request_too_large", f"The request body exceeds {limit} bytes.")


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _has_body(scope: Any) -> bool:
    length = _header(scope, b"content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return _header(scope, b"transfer-encoding") is not None


async def refusal_before_body(scope: Any) -> ApiError | None:
    """Return why a request is refused before its body is read, if it is."""
    path = scope["path"]
    length = _header(scope, b"content-length")
    if length is not None and length.strip().isdigit() and int(length) > body_limit(path):
        return _too_large(path)
    needs_key = path.startswith("/v1/") and path not in KEYLESS_PATHS
    needs_key = needs_key or path in KEYED_OPERATION_PATHS
    if needs_key and _has_body(scope):
        # The key is in a header: an anonymous upload costs a lookup, not its body.
        try:
            # The view takes the checked key from here rather than checking it again.
            principal = await key_check(
                credentials(_header(scope, b"authorization"), _header(scope, b"x-api-key"))
            )
        except ApiError as exc:
            return exc
        except Exception:
            # The key could not be looked up (the database is away): the view, which looks
            # again, answers with the fault in its usual shape.
            return None
        scope[CHECKED_PRINCIPAL] = principal
        if scope.get("method") == "POST" and path in counted_paths():
            size = int(length) if length is not None and length.strip().isdigit() else None
            try:
                # Its key must be allowed to infer before it counts: a 403 takes nothing.
                scope_check(principal, scope=Scope.INFERENCE)
            except ApiError as exc:
                return exc
            try:
                refusal = await unread_request_count(principal=principal, size=size)
            except Exception:
                return None  # Redis is away: the view counts it, and answers the fault
            if refusal is not None:
                return refusal  # its 429, with the limit's headers
            scope[COUNTED] = True
            if size is None:
                scope[COUNT_BYTES_READ] = True  # its length is known once it is read
    return None


async def unread_request_count(*, principal: Principal, size: int | None) -> ApiError | None:
    """Count a request whose body is still unread; return the 429 that refuses it, if one.

    It takes one of its tenant's requests per minute, then, when `size` is known, its size
    from the tenant's large-body bytes a minute. A refusal is remembered for a moment
    (`_Refused`): the tenant's next requests are refused from memory, without asking Valkey.
    Raises what counting raised when Redis is away: the request was not counted then (a
    body's bytes that cannot be counted go uncounted). A WebSocket frame is counted here
    too, before it is parsed (inference/websocket/views.py).
    """
    tenant = principal.tenant_id
    remembered = _refused.refusal(tenant, "requests") or (
        _refused.refusal(tenant, "bytes", size=size) if size is not None else None
    )
    if remembered is not None:
        return remembered
    try:
        await request_count(principal=principal)
    except ApiError as exc:
        _refused.remember(tenant, "requests", exc)
        return exc
    if size is not None:
        try:
            await body_bytes_count(principal=principal, size=size)
        except ApiError as exc:
            _refused.remember(tenant, "bytes", exc, size=size)
            return exc
        except Exception:
            return None  # Redis is away: the body goes uncounted
    return None


async def _read_bytes_count(scope: Any, body_file: IO[bytes]) -> None:
    """Count a counted request's body of unknown length once it has been read."""
    size = body_file.seek(0, io.SEEK_END)
    body_file.seek(0)
    with contextlib.suppress(Exception):  # Redis is away: the body goes uncounted
        await body_bytes_count(principal=scope[CHECKED_PRINCIPAL], size=size, read=True)


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
        refusal = await refusal_before_body(scope)
        principal = scope.get(CHECKED_PRINCIPAL)
        if refusal is not None and refusal.code in HELD_CODES and principal is not None:
            refusal = await refusal_held(principal.tenant_id, refusal)
        if refusal is not None or principal is None or not _large(scope):
            await self._handle(scope, receive, send, refusal)
            return
        over = scope[TURN_OVER] = await _turns.take(principal.tenant_id)
        try:
            await self._handle(scope, receive, send, refusal)
        finally:
            over()

    async def _handle(self, scope: Any, receive: Any, send: Any, refusal: ApiError | None) -> None:
        try:
            if refusal is not None:
                raise refusal
            body_file = await self.read_body_within(receive, limit=body_limit(scope["path"]))
            if scope.get(COUNT_BYTES_READ):
                await _read_bytes_count(scope, body_file)
        except RequestAborted:
            return
        except _TooLarge:
            await self._refuse(_too_large(scope["path"]), send, scope["path"])
            return
        except ApiError as error:
            await self._refuse(error, send, scope["path"])
            return
        set_script_prefix(get_script_prefix(scope))
        await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # create_request returns one or the other
            body_file.close()
            retry = should_retry(error_response.status_code, "")
            error_response["x-should-retry"] = "true" if retry else "false"
            await self._send(error_response, send)
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

    async def read_body_within(self, receive: Any, *, limit: int) -> IO[bytes]:
        """Read a request's body as Django's `read_body` does, stopping past `limit` bytes.

        Up to an API request's limit the chunks are kept as they come and joined once: the
        body is copied once, and Django's read of the whole of it is that same object.
        (Writing each chunk to an in-memory file took 13 % of a frontend's time under a flood
        of 4 MB bodies, as the file grew and was copied again.) A larger upload goes to a
        temporary file.
        """
        chunks: list[bytes] = []
        size = 0
        body_file: IO[bytes] | None = None
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise RequestAborted()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise _TooLarge()
                if body_file is None and size > settings.MAX_REQUEST_BYTES:
                    body_file = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115
                    body_file.writelines(chunks)
                    chunks = []
                if body_file is None:
                    chunks.append(chunk)
                else:
                    await sync_to_async(body_file.write, thread_sensitive=False)(chunk)
                if not message.get("more_body", False):
                    break
        except BaseException:
            if body_file is not None:
                body_file.close()
            raise
        if body_file is None:
            return io.BytesIO(b"".join(chunks))
        body_file.seek(0)
        return body_file

    async def _refuse(self, error: ApiError, send: Any, path: str) -> None:
        """Answer a request whose body is left unread, and close its connection."""
        response = error.response(path)
        # The rest of the body is never read: the connection cannot carry another request.
        response["Connection"] = "close"
        response["x-request-id"] = uuid.uuid4().hex
        response._has_been_logged = True  # type: ignore[attr-defined]
        await self._send(response, send)
        response.close()

    async def send_response(self, response: Any, send: Any) -> None:
        """Send a response as Django does, each message within the write timeout.

        Django sends a body 64 KiB at a time, and a streaming one a part at a time as its
        iterator makes them, each once the one before was handed on: what a connection holds
        is its response and about one message more. A client that reads none of a message for
        ROUNDHOUSE_WRITE_TIMEOUT_SECONDS raises WriteTimeout here, out of the streaming
        iterator too (as a disconnect cancels it). A stream that says which part is its last
        ends its body with that part (`_BodyEnd`).

        A whole answer says its length (`Content-Length`), as vLLM's server says it and as
        Django's CommonMiddleware, which the API skips, would: its client knows where it ends
        without chunked encoding's framing.
        """
        if isinstance(response, LastPartResponse):
            send = _BodyEnd(send, response.last)
        elif _length_unsaid(response):
            response["Content-Length"] = str(len(response.content))
        seconds = float(settings.ROUNDHOUSE_WRITE_TIMEOUT_SECONDS)
        if seconds <= 0:
            await super().send_response(response, send)
            return
        watched = _WriteWatch(send, seconds)
        try:
            await super().send_response(response, watched)
        finally:
            watched.close()

    async def _serve(self, request: Any, send: Any) -> Any:
        response = await self.run_get_response(request)
        # A client that disconnects while the response is being sent cancels the send.
        with contextlib.suppress(asyncio.CancelledError):
            await self._send(response, send)
        return response

    async def _send(self, response: Any, send: Any) -> None:
        """Send a response; a client that stops reading it has its connection cut, and so
        does a streamed body that cannot go on (ResponseCut)."""
        try:
            await self.send_response(response, send)
        except WriteTimeout:
            write_timeouts.inc()
            seconds = settings.ROUNDHOUSE_WRITE_TIMEOUT_SECONDS
            log.warning("cut off the client of request %s: it took none of its response for "
                        "%g s", response.get("x-request-id", "?"), seconds)  # fmt: skip
            await _connection_cut(send)
        except ResponseCut as exc:
            log.warning("cut request %s short: %s", response.get("x-request-id", "?"), exc)
            await _connection_cut(send)
