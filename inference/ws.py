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
  exactly one `finished` or `error`.

Closing the socket cancels every request still running on it; a cancelled request is
billed for the tokens it produced, like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

from config.json_body import BodyProblem, json_check, json_load, shown
from dataplane.tracing import TraceContext, bind, trace_start
from dataplane.types import Delta, Failed, Finished
from inference import relay
from inference.admission import request_ended, request_failure, request_id_new
from inference.auth import Principal, authenticate
from inference.clients import dispatch_get
from inference.errors import ApiError
from inference.openai_format import finished_usage
from inference.params import CHAT, COMPLETIONS, body_problem, generation_parse
from inference.results import events_close
from inference.submission import generation_submit
from tenants.models import Scope

log = logging.getLogger(__name__)
KEY_PROTOCOL = "roundhouse.key."
MAX_IN_FLIGHT = 64  # concurrent requests one socket may have running
MAX_ID_CHARS = 128
_ENDPOINTS = {"chat.completions": CHAT, "completions": COMPLETIONS}


def _client_id(message: dict[str, Any]) -> str | None:
    """Return a frame's `id` if it is one an error frame can carry back, else None."""
    value = message.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        return None
    try:
        json_check(value)
    except BodyProblem:
        return None
    return value


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _authorization(scope: dict[str, Any]) -> tuple[str | None, str | None]:
    """Return (Authorization header, the key subprotocol to echo) from a connection scope."""
    header = _header(scope, b"authorization")
    if header is not None:
        return header, None
    for protocol in scope.get("subprotocols", []):
        if protocol.startswith(KEY_PROTOCOL):
            return f"Bearer {protocol[len(KEY_PROTOCOL) :]}", protocol
    return None, None


class GenerationConsumer(AsyncWebsocketConsumer):
    principal: Principal
    running: dict[str, asyncio.Task[None]]
    trace: TraceContext  # the socket's; each request runs in a span of its own

    async def connect(self) -> None:
        self.running = {}
        self.trace = trace_start(_header(self.scope, b"traceparent"))
        authorization, protocol = _authorization(self.scope)
        try:
            self.principal = await authenticate(authorization, scope=Scope.INFERENCE)
        except ApiError as exc:
            log.info("websocket refused: %s", exc.code)
            await self.close(code=4401 if exc.status == 401 else 4403)
            return
        await self.accept(subprotocol=protocol)

    async def disconnect(self, code: int) -> None:
        # The client is gone: every request it still has running is cancelled (and billed).
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self._error(None, ApiError(400, "invalid_json", "Send JSON text frames."))
            return
        try:
            # A frame meets the limits of every JSON body (config.json_body), so that
            # nothing past this point meets a lone surrogate or a stack-deep value.
            message = json_load(text_data, what="The frame")
        except BodyProblem as problem:
            await self._error(None, body_problem(problem))
            return
        if not isinstance(message, dict):
            await self._error(None, ApiError(400, "invalid_message", "Send a JSON object."))
            return
        client_id = _client_id(message)
        if client_id is None:
            error = ApiError(
                400,
                "invalid_id",
                f"Every message needs a string 'id' of 1 to {MAX_ID_CHARS} characters.",
                param="id",
            )
            await self._error(None, error)
            return
        try:
            json_check(message)
        except BodyProblem as problem:
            await self._error(client_id, body_problem(problem))
            return
        kind = message.get("type")
        if kind == "cancel":
            task = self.running.get(client_id)
            if task is not None:
                task.cancel()
            return
        if kind != "request":
            error = ApiError(400, "invalid_type", "'type' is 'request' or 'cancel'.", param="type")
            await self._error(client_id, error)
            return
        endpoint = message.get("endpoint", "chat.completions")
        if not isinstance(endpoint, str) or endpoint not in _ENDPOINTS:
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
        task = asyncio.create_task(self._generate(client_id, message))
        self.running[client_id] = task
        task.add_done_callback(lambda _: self.running.pop(client_id, None))

    async def _generate(self, client_id: str, message: dict[str, Any]) -> None:
        try:
            endpoint = _ENDPOINTS.get(message.get("endpoint", "chat.completions"))
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
            parsed = generation_parse(
                {**body, "stream": True}, endpoint=endpoint, tenant_id=self.principal.tenant_id
            )
            traceparent = message.get("traceparent")
            trace = trace_start(traceparent) if isinstance(traceparent, str) else self.trace.child()
            request_id = request_id_new()
            bind(request_id=request_id, trace_id=trace.trace_id)
            admission = asyncio.ensure_future(
                generation_submit(
                    principal=self.principal,
                    request=parsed,
                    request_id=request_id,
                    timeout=parsed.timeout,
                    priority=parsed.priority,
                    trace=trace,
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
                await self._error(client_id, ApiError(499, "cancelled", "request cancelled"))
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
                    await self._send(_delta_message(client_id, event))
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
            # A cancel message or a closed socket: relay.events cancels the request itself.
            await events_close(events)
            if not ended:
                with contextlib.suppress(Exception):
                    await self._error(client_id, ApiError(499, "cancelled", "request cancelled"))
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

    async def _error(self, client_id: str | None, exc: ApiError) -> None:
        await self._send({"type": "error", "id": client_id, **exc.body()})

    async def _send(self, message: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(message, ensure_ascii=False))


def _delta_message(client_id: str, delta: Delta) -> dict[str, Any]:
    """A delta as the socket sends it: text and tokens, and what else the request asked for."""
    message: dict[str, Any] = {
        "type": "delta",
        "id": client_id,
        "text": delta.text,
        "tokens": delta.tokens,
    }
    if delta.index:
        message["index"] = delta.index
    if delta.reasoning:
        message["reasoning"] = delta.reasoning
    if delta.token_ids is not None:
        message["token_ids"] = delta.token_ids
    if delta.tool_calls:
        message["tool_calls"] = [
            {"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}
            for c in delta.tool_calls
        ]
    entries = [*(delta.prompt_logprobs or []), *(delta.logprobs or [])]
    if entries:
        message["logprobs"] = [
            {
                "token": e.token,
                "logprob": e.logprob,
                "top_logprobs": [{"token": t.token, "logprob": t.logprob} for t in e.top],
            }
            for e in entries
        ]
    return message
