"""`/v1/responses`: create (whole or streamed), retrieve, delete and list a response's input.

The request runs on the chat path (inference.responses); what it answers is kept in
PostgreSQL (inference.responses_store) before the client sees its end, so the next turn,
sent to any frontend, finds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from config.db import db_call
from config.json_body import shown
from dataplane.types import Delta, Event, Failed, Finished
from inference import relay
from inference.admission import Submitted, request_ended, request_failure
from inference.clients import dispatch_get
from inference.endpoint import (
    api_endpoint,
    client_timeout,
    internal_error,
    json_response,
    request_body,
    request_clock,
    request_principal,
    request_trace,
)
from inference.errors import ApiError, invalid
from inference.metrics import RequestClock
from inference.params import body_parse
from inference.responses import (
    ResponseBuilder,
    ResponsesRequest,
    previous_id_read,
    responses_parse,
    sse,
)
from inference.responses_store import (
    response_chain,
    response_delete,
    response_get,
    response_save,
)
from inference.results import events_close
from inference.submission import generation_submit
from tenants.models import Scope

log = logging.getLogger(__name__)
MAX_ITEMS_PAGE = 100


def _not_found(response_id: str, param: str = "response_id") -> ApiError:
    return ApiError(404, "response_not_found", f"No response '{shown(response_id)}'.", param=param)


@api_endpoint("POST")
async def responses_create(request: HttpRequest, request_id: str) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE, counted=True)
    body = body_parse(await request_body(request))
    response_id = f"resp_{request_id}"
    previous = previous_id_read(body)
    history = []
    if previous is not None:
        chain = await db_call(response_chain, tenant_id=principal.tenant_id, response_id=previous)
        if chain is None:
            raise _not_found(previous, "previous_response_id")
        history = chain
    parsed = responses_parse(body, response_id=response_id, history=history)
    if parsed.background:
        raise ApiError(
            400,
            "unsupported_parameter",
            "'background' true is not supported yet; send the request without it (stream it "
            "to see its progress).",
            param="background",
        )
    clock = request_clock(request)
    submitted = await generation_submit(
        principal=principal,
        request=parsed.chat,
        request_id=request_id,
        timeout=client_timeout(request, parsed.chat.timeout),
        priority=parsed.chat.priority,
        clock=clock,
        trace=request_trace(request),
        request_taken=True,
    )
    builder = ResponseBuilder(
        response_id=response_id,
        model=submitted.route.served_name,
        echo=parsed.echo,
        created_at=int(submitted.job.enqueued_at),
    )
    events = relay.events(dispatch_get(), submitted)
    response: HttpResponseBase
    if parsed.chat.stream:
        response = StreamingHttpResponse(
            _streamed(events, builder, parsed, submitted, clock), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        response = json_response(await _whole(events, builder, parsed, submitted))
        clock.skip()
    for name, value in submitted.headers().items():
        response[name] = value
    return response


async def _kept(builder: ResponseBuilder, parsed: ResponsesRequest, submitted: Submitted) -> None:
    """Store the response, if asked; a store that fails is logged, the answer still goes out."""
    if not parsed.store:
        return
    try:
        await db_call(
            response_save,
            tenant_id=submitted.job.tenant_id,
            request_id=submitted.job.request_id,
            body=builder.body(),
            input_items=parsed.input_items,
            retention_days=submitted.principal.retention_days,
        )
    except Exception:
        log.exception("could not store response %s", builder.response_id)


def _ended(
    event: Finished | Failed, builder: ResponseBuilder, submitted: Submitted
) -> tuple[list[dict[str, Any]], ApiError | None]:
    request_ended(submitted, event)
    failure = request_failure(event) if isinstance(event, Failed) else None
    return builder.end(event, error=failure), failure


async def _whole(
    events: AsyncIterator[Event],
    builder: ResponseBuilder,
    parsed: ResponsesRequest,
    submitted: Submitted,
) -> dict[str, Any]:
    """The response object once the request has ended; a failed one raises its error."""
    try:
        async for event in events:
            if isinstance(event, Delta):
                builder.delta(event)
            elif isinstance(event, Finished | Failed):
                _, failure = _ended(event, builder, submitted)
                await _kept(builder, parsed, submitted)
                if failure is not None:
                    raise failure
                return builder.body()
    finally:
        await events_close(events)
    raise ApiError(503, "stream_ended", "The reply stream ended without a result.", retry_after=1)


async def _streamed(
    events: AsyncIterator[Event],
    builder: ResponseBuilder,
    parsed: ResponsesRequest,
    submitted: Submitted,
    clock: RequestClock,
) -> AsyncIterator[bytes]:
    """The response's semantic events; whatever breaks, the client gets one terminal event."""
    ended = False
    try:
        for opening in builder.start():
            yield sse(opening)
        async for event in events:
            if isinstance(event, Delta):
                for piece in builder.delta(event):
                    yield sse(piece)
            elif isinstance(event, Finished | Failed):
                clock.skip()  # the worker timed everything up to its terminal event
                closing, _ = _ended(event, builder, submitted)
                await _kept(builder, parsed, submitted)  # before the client sees the end
                ended = True
                for piece in closing:
                    yield sse(piece)
                break
        clock.lap("relay")
        if not ended:
            raise ApiError(503, "stream_ended", "The reply stream ended without a result.")
    except (asyncio.CancelledError, GeneratorExit):
        raise  # the client is gone: nobody is left to tell
    except BaseException as exc:
        log.error("the stream of %s failed", builder.response_id, exc_info=True)
        if not ended:
            error = exc if isinstance(exc, ApiError) else internal_error()
            yield sse(
                {
                    "type": "error",
                    "sequence_number": builder.sequence,
                    "code": error.code,
                    "message": error.message,
                    "param": error.param,
                }
            )
        if not isinstance(exc, Exception):
            raise
    finally:
        await events_close(events)
        clock.finish()


@api_endpoint("GET", "DELETE")
async def response_detail(request: HttpRequest, request_id: str, response_id: str) -> HttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    if request.method == "DELETE":
        deleted = await db_call(
            response_delete, tenant_id=principal.tenant_id, response_id=response_id
        )
        if not deleted:
            raise _not_found(response_id)
        return json_response({"id": response_id, "object": "response", "deleted": True})
    if request.GET.get("stream", "").lower() in ("1", "true"):
        raise ApiError(
            400,
            "unsupported_parameter",
            "'stream' is for background responses, which are not supported yet.",
            param="stream",
        )
    kept = await db_call(response_get, tenant_id=principal.tenant_id, response_id=response_id)
    if kept is None:
        raise _not_found(response_id)
    return json_response(kept.body)


def _page_query(request: HttpRequest) -> tuple[int, str, str | None]:
    raw_limit = request.GET.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_ITEMS_PAGE:
        raise invalid("limit", f"'limit' must be an integer from 1 to {MAX_ITEMS_PAGE}.")
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "'order' must be 'asc' or 'desc'.")
    return int(raw_limit), order, request.GET.get("after")


@api_endpoint("GET")
async def response_input_items(
    request: HttpRequest, request_id: str, response_id: str
) -> HttpResponse:
    """A stored response's input items, a page at a time (newest first unless order=asc)."""
    principal = await request_principal(request, Scope.INFERENCE)
    limit, order, after = _page_query(request)
    kept = await db_call(response_get, tenant_id=principal.tenant_id, response_id=response_id)
    if kept is None:
        raise _not_found(response_id)
    items = kept.input_items if order == "asc" else list(reversed(kept.input_items))
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid("after", f"'after' names no input item of '{shown(response_id)}'.")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )
