"""Streaming over a WebSocket (`/v1/ws`): many concurrent generations on one connection.

Protocol (JSON text frames):

- connect with `Authorization: Bearer rh-…` (or, from a browser, the subprotocol
  `roundhouse.key.rh-…`); a bad key is refused before the handshake completes.
- client → server:
  `{"type": "request", "id": "<client id>", "endpoint": "chat.completions" | "completions",
    "body": {… the body of the HTTP endpoint …}}` and `{"type": "cancel", "id": "<client id>"}`.
- server → client, each tagged with the client's id:
  `started` (request id, model), `delta` (text, tokens), `finished` (finish reason, usage) or
  `error` (an OpenAI-shaped error: code, message, param). Every accepted request ends with
  exactly one `finished` or `error`. A frame refused before it is read has no id to carry:
  its `error` says which frame it answers (`frame`, counted from 1 on the socket).

Every frame is handled as an HTTP request would be now, before it is parsed: its key is
checked again (a revoked or expired key, a disabled tenant: the frame's error, then the socket
closes with 4401 or 4403), and it counts against its tenant's requests per minute (a refused
frame gets its 429 and the socket's next frame is read only once a retry could pass). An open
socket's key is also checked every ROUNDHOUSE_WS_KEY_CHECK_SECONDS while it sends nothing.

A frame over ROUNDHOUSE_WS_MAX_FRAME_BYTES closes the socket with 1009; so does, with 1008, a
client whose unread frames pile up past the backlog's bounds (`_Inbox`): the frames waiting are
dropped unread. Closing the socket, from either side, cancels every request still running on
it; a cancelled request is billed for the tokens it produced, like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from config.json_body import shown
from dataplane.background import event_wait, loop_ok, spawn, supervise
from dataplane.tracing import TraceContext, bind, trace_start
from dataplane.types import Delta, Failed, Finished
from inference.base.errors import ApiError
from inference.body.fields import CHAT
from inference.body.parser import generation_parse
from inference.chat.format import finished_usage
from inference.edge.asgi import HOLD_MAX_SECONDS, unread_request_count
from inference.pipeline import relay
from inference.pipeline.admission import request_ended, request_failure, request_id_new
from inference.pipeline.auth import Principal, authenticate
from inference.pipeline.clients import dispatch_get
from inference.pipeline.collect import events_close
from inference.pipeline.control_cache import revocation_hook_add
from inference.pipeline.preprocessing import preprocessed
from inference.pipeline.submission import generation_submit
from inference.websocket.format import close_code, delta_message
from inference.websocket.protocol import (
    CLOSE_FLOODED,
    CLOSE_TOO_BIG,
    ENDPOINTS,
    FRAME_BYTES,
    INLINE_PARSE_CHARS,
    Unreadable,
    frame_bytes,
    frame_parse,
    key_offered,
    scope_header,
)
from tenants.models import Scope

log = logging.getLogger(__name__)
MAX_IN_FLIGHT = 64  # concurrent requests one socket may have running


def _unavailable() -> ApiError:
    """The answer to a frame whose key or limits cannot be checked (the platform is at fault)."""
    return ApiError(
        503,
        "service_unavailable",
        "The platform cannot check this frame's key or limits right now; retry shortly.",
        retry_after=1,
    )


class _Inbox:
    """The messages a socket's server hands over, taken as they come; a bounded backlog waits.

    Channels hands a consumer one message at a time, and uvicorn reads more of a socket only
    while no message waits: a consumer holding a refused frame would see neither the frames
    piling up behind it nor a hang-up queued after them, and would work through every one of
    them after the flood stopped. The inbox takes each message at once instead: a hang-up goes
    before the frames waiting (nobody would read their answers), and a frame over
    ROUNDHOUSE_WS_MAX_FRAME_BYTES, or one past ROUNDHOUSE_WS_MAX_WAITING_FRAMES frames or twice
    the frame limit in bytes waiting, drops every frame waiting unread and asks the consumer
    to close the socket (`websocket.overflow`).
    """

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._receive = receive
        self._waiting: deque[dict[str, Any]] = deque()
        self._bytes = 0
        self._arrived = asyncio.Event()
        # Set once the client hung up or overflowed: nothing it sends now is handled.
        self.closing = asyncio.Event()

    async def pump(self) -> None:
        """Take the server's messages until the client hangs up."""
        try:
            while True:
                message = await self._receive()
                if message["type"] == "websocket.disconnect":
                    self._drop()
                    self._put(message)
                    return
                if message["type"] != "websocket.receive":
                    self._put(message)
                elif not self.closing.is_set():
                    self._frame(message)
        finally:
            if not self.closing.is_set():  # the server failed us: end the consumer
                self._drop()
                self._put({"type": "websocket.disconnect", "code": 1011})

    async def get(self) -> dict[str, Any]:
        """The next message for the consumer, waiting for one."""
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        message = self._waiting.popleft()
        self._bytes -= message.get(FRAME_BYTES, 0)
        return message

    def _frame(self, message: dict[str, Any]) -> None:
        size = message[FRAME_BYTES] = frame_bytes(message)
        limit = settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES
        if size > limit:
            error = ApiError(413, "frame_too_large", f"A frame may have at most {limit} bytes.")
            self._overflow(error, code=CLOSE_TOO_BIG)
            return
        waiting = settings.ROUNDHOUSE_WS_MAX_WAITING_FRAMES
        if len(self._waiting) >= waiting or self._bytes + size > 2 * limit:
            error = ApiError(
                429,
                "too_many_frames",
                f"More than {waiting} frames (or {2 * limit} bytes) were waiting to be read on "
                "this socket: send no faster than its answers come.",
            )
            self._overflow(error, code=CLOSE_FLOODED)
            return
        self._bytes += size
        self._put(message)

    def _overflow(self, error: ApiError, *, code: int) -> None:
        self._drop()
        self._put({"type": "websocket.overflow", "error": error, "code": code})

    def _drop(self) -> None:
        """Forget the frames waiting: nothing is handled after this."""
        self.closing.set()
        self._waiting.clear()
        self._bytes = 0

    def _put(self, message: dict[str, Any]) -> None:
        self._waiting.append(message)
        self._arrived.set()


class GenerationConsumer(AsyncWebsocketConsumer):
    authorization: str | None  # the key it connected with, checked again for every frame
    principal: Principal  # as the key was last checked
    running: dict[str, asyncio.Task[None]]
    trace: TraceContext  # the socket's; each request runs in a span of its own

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.authorization = None
        self.running = {}
        self.frames = 0  # read so far, the one being handled included
        self.ending: ApiError | None = None  # why the platform is closing the socket
        self.inbox: _Inbox | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.inbox = _Inbox(receive)
        pump = asyncio.create_task(self.inbox.pump())
        try:
            await super().__call__(scope, self.inbox.get, send)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Not Channels' own, which closes stale database connections around every message: a
        # hop to the process's one thread-sensitive thread for each frame of every socket. The
        # database calls made here run on config.db's threads, which do that themselves.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.trace = trace_start(scope_header(self.scope, b"traceparent"))
        self.authorization, protocol = key_offered(self.scope)
        try:
            self.principal = await authenticate(self.authorization, scope=Scope.INFERENCE)
        except ApiError as exc:
            log.info("websocket refused: %s", exc.code)
            await self.close(code=close_code(exc))
            return
        await self.accept(subprotocol=protocol)
        self.loop = asyncio.get_running_loop()
        _open.add(self)
        _checker_ensure()

    async def disconnect(self, code: int) -> None:
        _open.discard(self)
        # The client is gone: every request it still has running is cancelled (and billed).
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)

    async def end(self, exc: ApiError, *, code: int | None = None) -> None:
        """Close the socket from this side, for `exc`: its key no longer lets it in (4401,
        4403), or its client overflowed it (`code`).

        Every request still running on it ends first with `exc` as its `error` (cancelled, and
        billed for the tokens it produced); nothing it sends after this is handled.
        """
        if self.ending is not None:
            return
        self.ending = exc
        _open.discard(self)
        log.info("websocket closed: %s", exc.code)
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.close(code=code or close_code(exc), reason=exc.code)

    async def websocket_overflow(self, message: dict[str, Any]) -> None:
        await self.end(message["error"], code=message["code"])

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        self.frames += 1
        frame = self.frames
        if self.ending is not None:
            return
        # As an HTTP request is, before anything reads it: its key as it stands now, then
        # counted against its tenant's requests per minute.
        principal = await self._principal_now(frame)
        if principal is None or await self._refused(principal, message, frame):
            return
        raw = message.get("text")
        if raw is None:
            error = ApiError(400, "invalid_json", "Send JSON text frames.")
            await self._error(None, error, frame=frame)
            return
        try:
            client_id, request = await frame_parse(raw, tenant_id=principal.tenant_id)
        except Unreadable as exc:
            await self._error(exc.client_id, exc.error, frame=frame)
            return
        kind = request.get("type")
        if kind == "cancel":
            task = self.running.get(client_id)
            if task is not None:
                task.cancel()
            return
        if kind != "request":
            error = ApiError(400, "invalid_type", "'type' is 'request' or 'cancel'.", param="type")
            await self._error(client_id, error)
            return
        endpoint = request.get("endpoint", "chat.completions")
        if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
            error = ApiError(
                400, "invalid_endpoint", "Use chat.completions or completions.", param="endpoint"
            )
            await self._error(client_id, error)
            return
        if client_id in self.running:
            text = f"'{shown(client_id)}' is still running."
            error = ApiError(409, "duplicate_id", text, param="id")
            await self._error(client_id, error)
            return
        if len(self.running) >= MAX_IN_FLIGHT:
            error = ApiError(
                429, "too_many_streams", f"At most {MAX_IN_FLIGHT} requests run per socket."
            )
            await self._error(client_id, error)
            return
        if self.ending is not None:  # closed while this frame was read
            return
        task = asyncio.create_task(
            self._generate(client_id, request, principal, large=len(raw) > INLINE_PARSE_CHARS)
        )
        self.running[client_id] = task
        task.add_done_callback(lambda _: self.running.pop(client_id, None))

    async def _principal_now(self, frame: int) -> Principal | None:
        """The socket's principal as its key stands now; None if the frame was answered.

        A key that no longer lets it in ends the socket (`end`), after the frame's error.
        """
        try:
            principal = await authenticate(self.authorization, scope=Scope.INFERENCE)
        except ApiError as exc:
            await self._error(None, exc, frame=frame)
            await self.end(exc)
            return None
        except Exception:
            log.warning("could not check a websocket's key", exc_info=True)
            await self._error(None, _unavailable(), frame=frame)
            return None
        self.principal = principal
        return principal

    async def _refused(self, principal: Principal, message: dict[str, Any], frame: int) -> bool:
        """Count a frame against its tenant's limits, as an HTTP request's unread body is;
        answer it and return True if it is refused.

        A refused frame costs nothing more: it is not parsed, and the socket's next frame is
        read once a retry could pass (at most HOLD_MAX_SECONDS later), so a socket flooding
        frames slows itself, and its unread frames pile up until the inbox closes it.
        """
        try:
            refusal = await unread_request_count(
                principal=principal, size=message.get(FRAME_BYTES, 0)
            )
        except Exception:
            log.warning("could not count a websocket frame", exc_info=True)
            await self._error(None, _unavailable(), frame=frame)
            return True
        if refusal is None:
            return False
        await self._error(None, refusal, frame=frame)
        wait = min(refusal.retry_after or 0.0, HOLD_MAX_SECONDS)
        if wait > 0 and self.inbox is not None:
            await event_wait(self.inbox.closing, wait)  # a hang-up ends the wait
        return True

    def _ended_by(self) -> ApiError:
        """The error a request cancelled now ends with: why the socket closes, or a cancel."""
        return self.ending or ApiError(499, "cancelled", "request cancelled")

    async def _generate(
        self, client_id: str, message: dict[str, Any], principal: Principal, *, large: bool
    ) -> None:
        """Run one request frame to its end; a large frame's body is read off the loop."""
        try:
            endpoint = ENDPOINTS.get(message.get("endpoint", "chat.completions"))
            body = message.get("body")
            if endpoint is None:
                raise ApiError(
                    400,
                    "invalid_endpoint",
                    "Use chat.completions or completions.",
                    param="endpoint",
                )
            if not isinstance(body, dict):
                raise ApiError(400, "invalid_body", "'body' must be a JSON object.", param="body")
            read = functools.partial(
                generation_parse,
                {**body, "stream": True},
                endpoint=endpoint,
                tenant_id=principal.tenant_id,
            )
            parsed = await preprocessed(principal.tenant_id, read) if large else read()
            traceparent = message.get("traceparent")
            trace = trace_start(traceparent) if isinstance(traceparent, str) else self.trace.child()
            request_id = request_id_new()
            bind(request_id=request_id, trace_id=trace.trace_id)
            admission = asyncio.ensure_future(
                generation_submit(
                    principal=principal,
                    request=parsed,
                    request_id=request_id,
                    timeout=parsed.timeout,
                    priority=parsed.priority,
                    trace=trace,
                    request_taken=True,  # its frame was counted when it was read
                )
            )
            submitted = await asyncio.shield(admission)
        except ApiError as exc:
            await self._error(client_id, exc)
            return
        except asyncio.CancelledError:
            # Cancelled while being admitted: let admission finish so that a request it
            # admitted is cancelled too (nothing runs unread), then end this id like any other.
            with contextlib.suppress(Exception):
                relay.cancel_soon(dispatch_get(), await admission)
            with contextlib.suppress(Exception):
                await self._error(client_id, self._ended_by())
            return
        except BaseException as exc:
            # Admission settled whatever it had taken; the client still hears that it ended.
            await self._failed(client_id, exc, ended=False)
            return
        ended = False
        events = relay.events(dispatch_get(), submitted)
        try:
            started: dict[str, Any] = {
                "type": "started",
                "id": client_id,
                "request_id": submitted.job.request_id,
                "model": submitted.route.served_name,
            }
            if submitted.cache is not None:
                started["cache"] = "hit" if submitted.cache.hit else "miss"
            if parsed.return_token_ids:
                # Each prompt's ids as the engine got them (chat: its one rendered prompt).
                started["prompt_token_ids"] = submitted.job.inputs()
            if parsed.return_prompt_text:
                started["prompt_text"] = submitted.rendered_prompt
            await self._send(started)
            async for event in events:
                if isinstance(event, Delta):
                    await self._send(delta_message(client_id, event))
                elif isinstance(event, Finished):
                    ended = True
                    request_ended(submitted, event)
                    finished: dict[str, Any] = {
                        "type": "finished",
                        "id": client_id,
                        "finish_reason": event.finish_reason,
                        "usage": finished_usage(event, chat=endpoint == CHAT),
                    }
                    if event.finish_reasons:
                        finished["finish_reasons"] = event.finish_reasons
                    if event.stop_reasons:
                        # vLLM's stop_reason of every choice: the stop string or token id.
                        finished["stop_reasons"] = event.stop_reasons
                    await self._send(finished)
                elif isinstance(event, Failed):
                    ended = True
                    request_ended(submitted, event)
                    await self._error(client_id, request_failure(event))
        except asyncio.CancelledError:
            # A cancel message or a closed socket (`end`: for its reason): relay.events cancels
            # the request itself.
            await events_close(events)
            if not ended:
                with contextlib.suppress(Exception):
                    await self._error(client_id, self._ended_by())
        except BaseException as exc:
            # Closing the events cancels the request if it still runs; its end settles it.
            await events_close(events)
            await self._failed(client_id, exc, ended=ended)

    async def _failed(self, client_id: str, exc: BaseException, *, ended: bool) -> None:
        """End a request's id with one `error` frame whatever broke, unless it has ended."""
        log.error("websocket request %s failed", client_id, exc_info=exc)
        if not ended:
            error = ApiError(500, "internal_error", "The platform failed to handle this request.")
            with contextlib.suppress(Exception):
                await self._error(client_id, error)
        if not isinstance(exc, Exception):
            raise exc

    async def _error(
        self, client_id: str | None, exc: ApiError, *, frame: int | None = None
    ) -> None:
        """Send an error frame: for a request's id, or else for the `frame`-th frame read."""
        message: dict[str, Any] = {"type": "error", "id": client_id, **exc.body()}
        if client_id is None and frame is not None:
            message["frame"] = frame
        if exc.retry_after is not None:
            message["retry_after_ms"] = int(exc.retry_after * 1000)
        await self._send(message)

    async def _send(self, message: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(message, ensure_ascii=False))


# The sockets open on this process, whose keys the checker checks again.
_open: weakref.WeakSet[GenerationConsumer] = weakref.WeakSet()
_checker: asyncio.Task[None] | None = None
CHECKER = "websocket_keys"


# Set when a key's revocation reaches this process: the checker runs at once.
_revoked = asyncio.Event()


def _checker_ensure() -> None:
    """Start this process's key checker in the running loop, unless one runs there already."""
    global _checker, _revoked
    loop = asyncio.get_running_loop()
    if _checker is None or _checker.done() or _checker.get_loop() is not loop:
        _revoked = asyncio.Event()
        revocation_hook_add(_revocation_heard)
        _checker = spawn(supervise(CHECKER, _keys_check_forever), name=CHECKER, lasting=True)


def _revocation_heard(public_id: str) -> None:
    """A key was revoked: check the open sockets now, not at the next periodic check."""
    if _checker is not None and not _checker.done():
        with contextlib.suppress(RuntimeError):
            if _checker.get_loop() is asyncio.get_running_loop():
                _revoked.set()


async def _keys_check_forever() -> None:
    while True:
        await event_wait(_revoked, settings.ROUNDHOUSE_WS_KEY_CHECK_SECONDS)
        _revoked.clear()
        await sockets_check()
        loop_ok(CHECKER)


async def sockets_check() -> int:
    """Check the key of every socket open on this loop again; end those it no longer lets in.

    For a socket that sends nothing: a frame checks its key itself. Each key is checked once
    however many sockets use it, from the key cache (a revocation drops the key from it at
    once; another change marks it stale, and the next check sees the reload). A key that
    cannot be checked (the database is away past the cache's grace) leaves its sockets open
    until a check can tell. Returns how many sockets were ended.
    """
    loop = asyncio.get_running_loop()
    by_key: dict[str | None, list[GenerationConsumer]] = {}
    for consumer in list(_open):
        if consumer.loop is loop and consumer.ending is None:
            by_key.setdefault(consumer.authorization, []).append(consumer)
    ended = unchecked = 0
    for authorization, consumers in by_key.items():
        try:
            await authenticate(authorization, scope=Scope.INFERENCE)
        except ApiError as exc:
            for consumer in consumers:
                spawn(consumer.end(exc))
            ended += len(consumers)
        except Exception:
            unchecked += 1
    if unchecked:
        log.warning("could not check %d keys of open websockets", unchecked)
    return ended
