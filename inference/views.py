"""The OpenAI-compatible /v1 endpoints: thin async views over submission and relay."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from config.db import db_call
from config.json_body import shown
from dataplane.replies import entry_id_parse
from dataplane.types import Delta, Event, Failed, Finished
from inference import relay
from inference.admission import request_ended, request_failure
from inference.auth import Principal, unnarrowed
from inference.clients import dispatch_get, model_names_get, routing_get
from inference.content_policy import policy_get
from inference.endpoint import (
    api_endpoint,
    client_timeout,
    internal_error,
    json_response,
    pieces_response,
    request_clock,
    request_principal,
    request_read,
    request_trace,
    sse_response,
)
from inference.errors import ApiError
from inference.fields import CHAT_BATCH
from inference.idempotency import Original, key_validate
from inference.key_replay import finished_check, key_freed_on_failure, replayed_or_claimed
from inference.metrics import RequestClock
from inference.openai_format import DONE, Formatter, Shape, error_chunk, shape_of
from inference.openapi import openapi_json
from inference.params import (
    CHAT,
    COMPLETIONS,
    GenerationRequest,
    chat_batch_parse,
    embeddings_parse,
    generation_parse,
)
from inference.results import OnEnd, completion_collect, embeddings_collect, events_close
from inference.submission import answer_shape, embedding_submit, generation_submit
from models_registry.selectors import Route, version_served_name
from tenants.models import Scope

log = logging.getLogger(__name__)


@api_endpoint("POST", counted=True)
async def chat_completions(request: HttpRequest, request_id: str) -> HttpResponseBase:
    return await _generate(request, request_id, endpoint=CHAT)


@api_endpoint("POST", counted=True)
async def completions(request: HttpRequest, request_id: str) -> HttpResponseBase:
    return await _generate(request, request_id, endpoint=COMPLETIONS)


@api_endpoint("POST", counted=True)
async def chat_completions_batch(request: HttpRequest, request_id: str) -> HttpResponseBase:
    """vLLM's batch chat: several conversations in one request, a choice for each."""
    return await _generate(request, request_id, endpoint=CHAT, batch=True)


@api_endpoint("POST", counted=True)
async def embeddings(request: HttpRequest, request_id: str) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE)
    _, parsed = await request_read(request, embeddings_parse)
    clock = request_clock(request)
    submitted = await embedding_submit(
        principal=principal,
        request=parsed,
        request_id=request_id,
        timeout=client_timeout(request, parsed.timeout),
        clock=clock,
        trace=request_trace(request),
        request_taken=True,
    )
    route = submitted.route
    answer = await embeddings_collect(
        relay.events(dispatch_get(), submitted),
        parsed,
        model=route.served_name,
        on_end=functools.partial(request_ended, submitted),
        request_id=request_id,
    )
    clock.skip()
    # The answer is encoded as its client reads it: here it is the vectors (docs/embeddings.md).
    response = pieces_response(answer.pieces, content_type=answer.content_type)
    clock.lap("relay")
    clock.finish()
    if answer.metadata is not None:
        response["metadata"] = answer.metadata
    for name, value in submitted.headers().items():
        response[name] = value
    return response


async def _generate(
    request: HttpRequest, request_id: str, *, endpoint: str, batch: bool = False
) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE)
    tenant_id = principal.tenant_id
    body, parsed = await request_read(
        request,
        functools.partial(chat_batch_parse, tenant_id=tenant_id)
        if batch
        else functools.partial(generation_parse, endpoint=endpoint, tenant_id=tenant_id),
    )
    # The API a usage record (and an idempotency key's original) names.
    api = CHAT_BATCH if batch else parsed.endpoint
    key = key_validate(request.headers.get("Idempotency-Key"))
    clock = request_clock(request)
    with key_freed_on_failure(tenant_id=principal.tenant_id, key=key, request_id=request_id):
        if key is not None:
            replayed = await replayed_or_claimed(
                principal=principal,
                model=parsed.model,
                key=key,
                endpoint=api,
                body=body,
                replay=lambda original: _replay(original, parsed, clock, principal=principal),
                request_id=request_id,
            )
            if replayed is not None:
                return replayed
        submitted = await generation_submit(
            principal=principal,
            request=parsed,
            request_id=request_id,
            timeout=client_timeout(request, parsed.timeout),
            priority=parsed.priority,
            idempotency_key=key,
            clock=clock,
            trace=request_trace(request),
            request_taken=True,
            endpoint=api,
        )
    formatter = _formatter(
        endpoint=endpoint,
        request_id=request_id,
        model=submitted.route.served_name,
        version=submitted.route.version,
        created=int(submitted.job.enqueued_at),
        shape=answer_shape(
            parsed, submitted.route, submitted.job, rendered=submitted.rendered_prompt
        ),
    )
    cursor = relay.Cursor() if parsed.stream else None
    events = relay.events(dispatch_get(), submitted, cursor=cursor)
    on_end = functools.partial(request_ended, submitted)
    if parsed.stream:
        response: HttpResponseBase = sse_response(
            _sse(events, parsed.include_usage, formatter, on_end, clock, cursor=cursor)
        )
    else:
        response = await _collect(events, formatter, on_end)
        clock.skip()
    for name, value in submitted.headers().items():
        response[name] = value
    return response


def _formatter(
    *,
    endpoint: str,
    request_id: str,
    model: str,
    version: str,
    created: int,
    shape: Shape | None = None,
) -> Formatter:
    """The response builder of a request; a replay builds the same one from its record."""
    return Formatter(
        endpoint=endpoint,
        request_id=request_id,
        model=model,
        created=created,
        shape=shape,
        fingerprint=f"rh-{version}",
    )


async def _replay(
    original: Original, parsed: GenerationRequest, clock: RequestClock, *, principal: Principal
) -> HttpResponseBase | None:
    """Return the original's response again, or None when the original failed.

    The tenant's safety policy filters the replayed text as it filtered the original's. Its
    prompts' token ids (return_token_ids, echo) come from the reply stream, where the worker
    put them; a token-id prompt is echoed as the original's version's tokenizer writes it.
    """
    dispatch = dispatch_get()
    shape = shape_of(parsed, decode=lambda ids: "")
    if parsed.echo or parsed.return_prompt_text:
        # An echo writes token ids back as text and return_prompt_text renders the template,
        # with the answering version's tokenizer; a version that routes nowhere now echoes
        # nothing and renders nothing.
        with contextlib.suppress(ApiError):
            route = (await routing_get(original.model, principal=unnarrowed(principal))).primary
            shape = await asyncio.to_thread(answer_shape, parsed, route)
    if original.thinking and parsed.continuous_usage:
        # The original's running usage counted its thinking; the replay has no job to ask.
        shape = dataclasses.replace(shape, thinking=True)
    formatter = _formatter(
        endpoint=parsed.endpoint,
        request_id=original.request_id,
        model=original.model,
        version=original.version,
        created=original.created,
        shape=shape,
    )
    events = relay.attach(
        dispatch,
        deployment=original.deployment,
        request_id=original.request_id,
        deadline=original.deadline,
        policy=await policy_get(tenant_id=principal.tenant_id, version=original.version),
        tenant_id=principal.tenant_id,
    )
    if parsed.stream:
        return sse_response(_sse(events, parsed.include_usage, formatter, None, clock))
    await finished_check(original)
    try:
        return await _collect(events, formatter, on_end=None)
    except ApiError:
        return None


async def _collect(
    events: AsyncIterator[Event], formatter: Formatter, on_end: OnEnd
) -> HttpResponse:
    return json_response(await completion_collect(events, formatter, on_end))


async def _sse(
    events: AsyncIterator[Event],
    include_usage: bool,
    formatter: Formatter,
    on_end: OnEnd,
    clock: RequestClock,
    *,
    cursor: relay.Cursor | None = None,
) -> AsyncIterator[bytes]:
    """Write a request's events as SSE; with a cursor, each write carries its stream id.

    A client that loses the stream resumes it after the last id it saw
    (`GET /v1/requests/{id}/stream` with `Last-Event-ID`). Tenants whose output is filtered
    get no ids: their text is held back, so the stream's position is not theirs.
    """
    ended = False
    try:
        async for chunk in _sse_chunks(events, include_usage, formatter, on_end, clock):
            ended = chunk.endswith(DONE)
            yield chunk if cursor is None else b"id: " + cursor.last.encode() + b"\n" + chunk
        clock.lap("relay")
    except (asyncio.CancelledError, GeneratorExit):
        raise  # the client is gone: nobody is left to tell
    except BaseException as exc:
        # Whatever broke mid-stream, the client still gets one terminal event; the request,
        # if it still runs, is cancelled as its events are closed below.
        log.error("the stream of %s failed", formatter.id, exc_info=True)
        if not ended:
            yield error_chunk(internal_error().body())
            yield DONE
        if not isinstance(exc, Exception):
            raise
    finally:
        await events_close(events)
        clock.finish()


async def _sse_chunks(
    events: AsyncIterator[Event],
    include_usage: bool,
    formatter: Formatter,
    on_end: OnEnd,
    clock: RequestClock,
) -> AsyncIterator[bytes]:
    async for event in events:
        if isinstance(event, Finished | Failed):
            clock.skip()  # the worker timed everything up to its terminal event
        if isinstance(event, Delta):
            chunk = formatter.chunk(event, include_usage=include_usage)
            if chunk is not None:
                yield chunk
        elif isinstance(event, Finished):
            if on_end is not None:
                on_end(event)
            # The end's events (each choice's finish, the usage, [DONE]) go in one write.
            yield b"".join([*formatter.finish_chunks(event, include_usage=include_usage), DONE])
            return
        elif isinstance(event, Failed):
            if on_end is not None:
                on_end(event)
            yield error_chunk(request_failure(event).body()) + DONE
            return


@api_endpoint("GET", counted=True)
async def request_stream(request: HttpRequest, request_id: str, target: str) -> HttpResponseBase:
    """Stream one of the tenant's recent requests again, after the `Last-Event-ID` it saw.

    Without the header the whole stream is sent from its start. `?include_usage=true` adds
    the usage chunk, as `stream_options.include_usage` does.
    """
    principal = await request_principal(request, Scope.INFERENCE)
    dispatch = dispatch_get()
    rid = target.removeprefix("chatcmpl-").removeprefix("cmpl-")
    where = await dispatch.whereabouts(rid)
    if (
        where is None
        or where.tenant_id != principal.tenant_id
        or where.endpoint not in (CHAT, COMPLETIONS)
    ):
        raise ApiError(404, "request_not_found", f"No recent stream '{shown(target)}'.", param="id")
    after = request.headers.get("Last-Event-ID", "").strip() or "0-0"
    try:
        entry_id_parse(after)
    except ValueError:
        raise ApiError(
            400,
            "invalid_value",
            "Last-Event-ID is an event id this API sent.",
            param="Last-Event-ID",
        ) from None
    model = await db_call(version_served_name, digest=where.version_digest) or ""
    formatter = _formatter(
        endpoint=where.endpoint,
        request_id=rid,
        model=model,
        version=where.version_digest[:12],
        created=where.created,
    )
    if after != "0-0":
        formatter.resumed()
    include_usage = request.GET.get("include_usage", "").lower() in ("1", "true")
    finished = await dispatch.finished(deployment=where.deployment, request_id=rid)
    newest = await dispatch.reply_last_id(deployment=where.deployment, request_id=rid)
    if finished and (newest is None or _entry_key(newest) <= _entry_key(after)):
        # The client saw the end already: nothing but the stream's close is left.
        return sse_response(_done_only())
    cursor = relay.Cursor(after)
    events = relay.attach(
        dispatch,
        deployment=where.deployment,
        request_id=rid,
        deadline=time.time() + settings.ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS,
        policy=await policy_get(tenant_id=principal.tenant_id, version=where.version_digest),
        tenant_id=principal.tenant_id,
        after=after,
        cursor=cursor,
    )
    response = sse_response(
        _sse(
            events,
            include_usage,
            formatter,
            None,
            request_clock(request),
            cursor=cursor,
        )
    )
    response["x-request-id"] = rid
    return response


def _entry_key(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    return int(millis), int(seq or 0)


async def _done_only() -> AsyncIterator[bytes]:
    yield DONE


@api_endpoint("POST", counted=True)
async def request_cancel(request: HttpRequest, request_id: str, target: str) -> HttpResponse:
    """Cancel one of the caller's tenant's requests by id (the `x-request-id` it got)."""
    principal = await request_principal(request, Scope.INFERENCE)
    dispatch = dispatch_get()
    rid = target.removeprefix("chatcmpl-").removeprefix("cmpl-")
    where = await dispatch.whereabouts(rid)
    if where is None or where.tenant_id != principal.tenant_id:
        raise ApiError(
            404, "request_not_found", f"No recent request '{shown(target)}'.", param="id"
        )
    cancelled = await dispatch.cancel_by_id(where=where, request_id=rid)
    return json_response(
        {"id": rid, "object": "request", "status": "cancelling" if cancelled else "finished"}
    )


def _card(name: str, created: int, route: Route, principal: Principal) -> dict[str, Any]:
    """A model as vLLM's server lists it: `root`, the version that answers it now, and
    `max_model_len`, the context this tenant may use there (the version's and its own limit's
    smaller; what /tokenize reports). Clients size their prompts from it. `owned_by` names the
    tenant a model was built for (only it sees the model), else the platform."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": route.owner or "roundhouse",
        "root": route.served_name,
        "max_model_len": min(route.context_length, principal.max_context_tokens),
    }


async def _route_now(name: str, principal: Principal) -> Route | None:
    """Where a name routes now for the caller; None where it routes nowhere, or nowhere the
    caller may go (routing_get's 404)."""
    try:
        return (await routing_get(name, principal=principal)).primary
    except ApiError:
        return None


@api_endpoint("GET", counted=True)
async def models_list(request: HttpRequest, request_id: str) -> HttpResponse:
    """The names the key may call: each one routing_get takes for it, and no other."""
    principal = await request_principal(request, Scope.MODELS_READ)
    names = await model_names_get()
    routes = await asyncio.gather(*(_route_now(name, principal) for name, _ in names))
    data = [
        _card(name, created, route, principal)
        for (name, created), route in zip(names, routes, strict=True)
        if route is not None
    ]
    return json_response({"object": "list", "data": data})


@api_endpoint("GET", counted=True)
async def models_detail(request: HttpRequest, request_id: str, name: str) -> HttpResponse:
    principal = await request_principal(request, Scope.MODELS_READ)
    routing = await routing_get(name, principal=principal)
    body = {
        **_card(name, int(time.time()), routing.primary, principal),
        "version": routing.primary.version,
    }
    if routing.splits_for(tenant_id=principal.tenant_id):
        # Version -> percent of this tenant's traffic: another tenant's targeting stays unseen.
        body["traffic"] = routing.weights_for(tenant_id=principal.tenant_id)
    return json_response(body)


@api_endpoint("GET")
async def openapi(request: HttpRequest, request_id: str) -> HttpResponse:
    """Serve this API's OpenAPI document; no key needed."""
    return json_response(openapi_json())


@api_endpoint("GET", "POST", "PUT", "PATCH", "DELETE")
async def not_found(request: HttpRequest, request_id: str, path: str = "") -> HttpResponse:
    raise ApiError(404, "not_found", f"No endpoint {request.method} {shown(request.path)}.")
