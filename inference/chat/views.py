"""OpenAI's chat and completions endpoints (and vLLM's batch chat), and resuming or
cancelling a recent request by its id.

Each view reads its body, makes one pipeline call (inference.edge.endpoint's
generation_submitted) and writes the request's events as the client asked: a stream of
chunks or one body.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from config.db import db_call
from config.json_body import shown
from dataplane.replies import entry_id_parse
from inference.base.errors import ApiError
from inference.base.metrics import RequestClock
from inference.body.fields import CHAT, COMPLETIONS
from inference.body.parser import GenerationRequest, generation_parse
from inference.chat.format import (
    answer_shape,
    done_only,
    formatter_for,
    shape_of,
    sse_chunks,
)
from inference.chat.protocol import CHAT_BATCH, chat_batch_parse
from inference.edge.endpoint import (
    api_endpoint,
    finished_check,
    generation_submitted,
    idempotency_key,
    json_response,
    request_clock,
    request_principal,
    request_read,
    sse_response,
    whole_replayed,
)
from inference.pipeline import relay
from inference.pipeline.admission import Submitted, request_ended
from inference.pipeline.auth import Principal, unnarrowed
from inference.pipeline.clients import dispatch_get, routing_get
from inference.pipeline.collect import completion_collect
from inference.pipeline.idempotency import Original
from inference.pipeline.safety import policy_get
from models_registry.selectors import version_served_name
from tenants.models import Scope


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
    clock = request_clock(request)
    submitted = await generation_submitted(
        request,
        principal=principal,
        chat=parsed,
        body=body,
        request_id=request_id,
        # The API a usage record (and an idempotency key's original) names.
        api=CHAT_BATCH if batch else parsed.endpoint,
        key=idempotency_key(request),
        replay=functools.partial(_replay, parsed=parsed, clock=clock, principal=principal),
    )
    if not isinstance(submitted, Submitted):
        return submitted
    formatter = formatter_for(
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
            sse_chunks(events, parsed.include_usage, formatter, on_end, clock, cursor=cursor)
        )
    else:
        response = json_response(await completion_collect(events, formatter, on_end))
        clock.skip()
    return submitted.headed(response)


async def _replay(
    original: Original, parsed: GenerationRequest, clock: RequestClock, *, principal: Principal
) -> HttpResponseBase | None:
    """Return the original's response again, or None when the original failed.

    The tenant's safety policy filters the replayed text as it filtered the original's. Its
    prompts' token ids (return_token_ids, echo) come from the reply stream, where the worker
    put them; a token-id prompt is echoed as the original's version's tokenizer writes it.
    """
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
    formatter = formatter_for(
        endpoint=parsed.endpoint,
        request_id=original.request_id,
        model=original.model,
        version=original.version,
        created=original.created,
        shape=shape,
    )
    events = await relay.original_events(original, tenant_id=principal.tenant_id)
    if parsed.stream:
        return sse_response(sse_chunks(events, parsed.include_usage, formatter, None, clock))
    await finished_check(original)
    return await whole_replayed(events, formatter)


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
    formatter = formatter_for(
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
        return sse_response(done_only())
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
        sse_chunks(
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
