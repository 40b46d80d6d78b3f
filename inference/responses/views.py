"""`/v1/responses`: create (whole or streamed), retrieve, delete and list a response's input.

The request runs on the chat path (inference.responses.protocol); what it answers is kept in
PostgreSQL (inference.responses.store) before the client sees its end, so the next turn,
sent to any frontend, finds it.

`/v1/conversations`: OpenAI's Conversations API, and its items.

A conversation holds items (messages, reasoning, function calls and their outputs) that a
response naming it (`conversation` on `POST /v1/responses`) reads as its history; the
response's turn, its input and then its output, is added once it ends (inference.responses.protocol
_views and inference.responses.store). Everything lives in PostgreSQL under the tenant
(inference.responses.store), so any frontend serves it; another tenant's id is a 404.
Every call takes a request from the tenant's requests per minute, as an inference call does:
each writes or reads PostgreSQL, and one tenant's flood of them must run out of its own.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from config.db import db_call
from config.json_body import shown
from dataplane.background import spawn
from dataplane.types import Delta, Event, Failed, Finished
from inference.base.errors import ApiError, internal_error, invalid, unrecognized
from inference.base.metrics import RequestClock
from inference.body.parser import GenerationRequest
from inference.body.tools import compiled_for
from inference.edge.endpoint import (
    api_endpoint,
    finished_check,
    generation_submitted,
    idempotency_key,
    json_response,
    list_page,
    page_query,
    request_clock,
    request_json,
    request_principal,
    request_read,
    sse_response,
)
from inference.pipeline import relay
from inference.pipeline.admission import VERSION_HEADER, Submitted, request_ended, request_failure
from inference.pipeline.clients import dispatch_get, routing_get
from inference.pipeline.collect import events_close, stream_ended
from inference.pipeline.event_streams import builder_stream, sse
from inference.pipeline.idempotency import Original
from inference.pipeline.preprocessing import preprocessed
from inference.pipeline.safety import Policy, policy_get, served_version
from inference.pipeline.submission import task_check
from inference.pipeline.tokenization import prompts_read, tokenizer_of, turns_fitted
from inference.responses import store
from inference.responses.background import builder_of, finish_stored, replay, settle_from_stream
from inference.responses.format import ResponseBuilder, error_event
from inference.responses.protocol import (
    OUTPUT_LOGPROBS,
    RESPONSES,
    ResponsesRequest,
    chat_error_renamed,
    conversation_id_read,
    count_parse,
    input_items_read,
    metadata_read,
    previous_id_read,
    responses_parse,
)
from inference.responses.store import (
    ITEM_ID,
    MAX_ITEMS,
    TERMINAL_STATUSES,
    TURN_STATUSES,
    Kept,
    conversation_create,
    conversation_delete,
    conversation_get,
    conversation_item_delete,
    conversation_item_get,
    conversation_items_add,
    conversation_items_page,
    conversation_turn_add,
    conversation_update,
    kept_room_check,
    response_chain,
    response_delete,
    response_get,
    response_save,
)
from tenants.models import Scope

log = logging.getLogger(__name__)
# A background response's terminal event may come this long after its deadline.
_GRACE_SECONDS = 5.0
# How long a cancel waits for the response's end before it answers with where it stands.
_CANCEL_WAIT_SECONDS = 3.0


def _not_found(response_id: str, param: str = "response_id") -> ApiError:
    return ApiError(404, "response_not_found", f"No response '{shown(response_id)}'.", param=param)


@api_endpoint("POST", counted=True)
async def responses_create(request: HttpRequest, request_id: str) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE)
    response_id = f"resp_{request_id}"
    read = functools.partial(_create_read, response_id=response_id, tenant_id=principal.tenant_id)
    # The body is checked before its history is looked up: a bad one costs no query.
    body, parsed = await request_read(request, read)
    history, conversation = await _history(body, tenant_id=principal.tenant_id)
    if history or conversation is not None:
        # Read again after the turns it follows (up to a conversation's 4,096 items).
        parsed = await preprocessed(
            principal.tenant_id, read, body, history=history, conversation=conversation
        )
    if parsed.background and not parsed.store:
        raise invalid("store", "A background response is stored: leave 'store' out or send true.")
    clock = request_clock(request)

    async def room_check() -> None:
        # What it will keep must fit the tenant's storage bound, checked before any engine
        # work; once admitted its end is kept whole (inference.responses.store).
        await db_call(
            _room_check,
            tenant_id=principal.tenant_id,
            input_items=parsed.input_items,
            copies=int(parsed.store) + int(conversation is not None),
            param="store" if parsed.store else "conversation",
        )

    # With truncation "auto" submitting drops the oldest turns until the prompt fits.
    submitted = await generation_submitted(
        request,
        principal=principal,
        chat=parsed.chat,
        body=body,
        request_id=request_id,
        api=RESPONSES,
        key=idempotency_key(request),
        replay=functools.partial(
            _replay, parsed=parsed, clock=clock, tenant_id=principal.tenant_id
        ),
        before=room_check if parsed.store or conversation is not None else None,
        refused=chat_error_renamed,
    )
    if not isinstance(submitted, Submitted):
        return submitted
    builder = ResponseBuilder(
        response_id=response_id,
        model=submitted.route.served_name,
        echo=parsed.echo,
        created_at=int(submitted.job.enqueued_at),
    )
    response: HttpResponseBase
    if parsed.background:
        return submitted.headed(await _background(builder, parsed, submitted))
    events = relay.events(dispatch_get(), submitted)
    if parsed.chat.stream:
        job = submitted.job

        async def settled(event: Finished | Failed) -> None:
            request_ended(submitted, event)
            await _kept(
                builder,
                parsed,
                tenant_id=job.tenant_id,
                request_id=job.request_id,
                retention_days=submitted.principal.retention_days,
            )

        response = sse_response(
            builder_stream(events, builder, clock, name=builder.response_id, at_end=settled)
        )
    else:
        job = submitted.job
        body = await _whole(
            events,
            builder,
            parsed,
            submitted,
            tenant_id=job.tenant_id,
            request_id=job.request_id,
            retention_days=submitted.principal.retention_days,
        )
        response = json_response(body)
        clock.skip()
    return submitted.headed(response)


def _room_check(
    *, tenant_id: int, input_items: list[dict[str, Any]], copies: int, param: str
) -> None:
    """Refuse a response whose input alone, kept `copies` times (stored, and a conversation's
    turn), would take the tenant past its storage bound."""
    size = len(json.dumps(input_items).encode()) * copies
    kept_room_check(tenant_id=tenant_id, size=size, param=param)


def _create_read(
    body: dict[str, Any],
    *,
    response_id: str,
    tenant_id: int,
    history: list[Kept] | None = None,
    conversation: list[dict[str, Any]] | None = None,
) -> ResponsesRequest:
    """A create's body read as the tenant's, after the turns it follows (if known yet)."""
    with compiled_for(tenant_id):
        return responses_parse(
            body, response_id=response_id, history=history or [], conversation=conversation
        )


def _count_read(
    body: dict[str, Any],
    *,
    tenant_id: int,
    history: list[Kept] | None = None,
    conversation: list[dict[str, Any]] | None = None,
) -> GenerationRequest | None:
    """A count's body read as the tenant's, after the turns it follows (if known yet); None
    for a body that counts a history alone before its history is known (nothing to check)."""
    if history is None and conversation is None and "input" not in body:
        return None
    with compiled_for(tenant_id):
        return count_parse(body, history=history or [], conversation=conversation)


async def _history(
    body: dict[str, Any], *, tenant_id: int
) -> tuple[list[Kept], list[dict[str, Any]] | None]:
    """What a body's turn follows, oldest first: the stored turns its previous_response_id
    chains onto, or the items of the conversation it names (None: it names none). A missing
    link or conversation is a 404 naming it."""
    previous, conversation = previous_id_read(body), conversation_id_read(body)
    if previous is None and conversation is None:
        return [], None
    if conversation is not None:
        items = await db_call(
            store.conversation_items, tenant_id=tenant_id, conversation_id=conversation
        )
        if items == "missing":
            raise conversation_not_found(conversation, "conversation")
        if isinstance(items, str):
            raise invalid(
                "conversation",
                f"The conversation holds more than {MAX_ITEMS} items: start another one.",
            )
        return [], items
    assert previous is not None, "a body without a conversation chains onto a response here"
    chain = await db_call(response_chain, tenant_id=tenant_id, response_id=previous)
    if chain is None:
        raise _not_found(previous, "previous_response_id")
    return chain, None


@api_endpoint("POST", counted=True)
async def responses_input_tokens(request: HttpRequest, request_id: str) -> HttpResponse:
    """The input tokens a Responses request would take: its conversation (the turns it chains
    onto included), instructions and tools as the routed version's template writes them.

    With truncation "auto" the oldest turns go, as a create drops them, until the prompt fits
    the context; without it a conversation past the context is counted whole.
    """
    principal = await request_principal(request, Scope.INFERENCE)
    tenant_id = principal.tenant_id
    read = functools.partial(_count_read, tenant_id=tenant_id)
    body, chat = await request_read(request, read)
    history, conversation = await _history(body, tenant_id=tenant_id)
    if chat is None or history or conversation is not None:
        chat = await preprocessed(tenant_id, read, body, history=history, conversation=conversation)
    assert chat is not None, "a count's body read after its history is a chat request"
    routing = await routing_get(chat.model, principal=principal)
    route = routing.pick(tenant_id=tenant_id, user=chat.user)
    task_check(route, embeddings=False, model=chat.model)
    await tokenizer_of(route)  # its first load off the event loop
    context = min(route.context_length, principal.max_context_tokens)
    if chat.truncate_turns:
        chat = await preprocessed(
            tenant_id,
            turns_fitted,
            chat,
            route,
            context=context,
            seconds=settings.ROUNDHOUSE_PREPROCESS_SECONDS,
        )
    # Counted whole: a prompt past the context is a count all the same.
    ids, _ = await preprocessed(tenant_id, prompts_read, chat, route)
    count = sum(len(prompt) for prompt in ids)
    response = json_response({"object": "response.input_tokens", "input_tokens": count})
    response[VERSION_HEADER] = route.version
    return response


async def _replay(
    original: Original, parsed: ResponsesRequest, clock: RequestClock, *, tenant_id: int
) -> HttpResponseBase | None:
    response_id = f"resp_{original.request_id}"
    kept = await db_call(response_get, tenant_id=tenant_id, response_id=response_id)
    if kept is not None and (kept.finished or kept.body.get("background")):
        if kept.body["status"] == "failed":
            return None
        if parsed.chat.stream and kept.body.get("background"):
            semantic = replay(
                dispatch_get(),
                builder_of(kept),
                deployment=original.deployment,
                request_id=original.request_id,
                tenant_id=tenant_id,
                policy=await policy_get(tenant_id=tenant_id, version=original.version),
                follow=True,
                deadline=original.deadline + _GRACE_SECONDS,
            )
            return sse_response(_sequenced(semantic, after=-1))
        if not parsed.chat.stream:
            return json_response(kept.body)
    # Not stored (or a stream of a response that was not in the background): its events again.
    if not parsed.chat.stream:
        await finished_check(original)
    builder = ResponseBuilder(
        response_id=response_id,
        model=original.model,
        echo=parsed.echo,
        created_at=original.created,
    )
    events = await relay.original_events(original, tenant_id=tenant_id)
    if parsed.chat.stream:
        return sse_response(builder_stream(events, builder, clock, name=builder.response_id))
    try:
        async for event in events:
            if isinstance(event, Delta):
                builder.delta(event)
            elif isinstance(event, Finished | Failed):
                if isinstance(event, Failed):
                    return None
                builder.end(event)
                return json_response(builder.body())
    finally:
        await events_close(events)
    return None


async def _background(
    builder: ResponseBuilder, parsed: ResponsesRequest, submitted: Submitted
) -> HttpResponseBase:
    """Store a background response as queued, follow it to its end off the request, and
    answer now: the queued response, or its events (a stream that may be resumed)."""
    builder.status = "queued"
    job = submitted.job
    await db_call(
        response_save,
        tenant_id=job.tenant_id,
        request_id=job.request_id,
        body=builder.body(),
        input_items=parsed.input_items,
        retention_days=submitted.principal.retention_days,
        requested_model=parsed.chat.model,
    )
    spawn(_background_follow(builder.fresh(), submitted))
    if not parsed.chat.stream:
        return json_response(builder.body())
    return sse_response(_sequenced(_followed(builder, submitted), after=-1))


def _followed(
    builder: ResponseBuilder,
    submitted: Submitted,
    on_end: Callable[[Finished | Failed], None] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """A background response's events as its accepting frontend follows them to the end."""
    job = submitted.job
    return replay(
        dispatch_get(),
        builder,
        deployment=job.deployment,
        request_id=job.request_id,
        tenant_id=job.tenant_id,
        policy=submitted.policy,
        follow=True,
        deadline=job.deadline + _GRACE_SECONDS,
        on_end=on_end,
    )


async def _background_follow(builder: ResponseBuilder, submitted: Submitted) -> None:
    """The accepting frontend's part: follow the response to its end, settle its
    reservation and store its end. Leaving early (this frontend stops) cancels nothing; what
    fails here is logged, and a later GET or the sweep ends the response instead."""
    job = submitted.job
    last = -1
    try:
        ended = functools.partial(request_ended, submitted)
        async for event in _followed(builder, submitted, ended):
            last = event["sequence_number"]
        if builder.status in TERMINAL_STATUSES:
            await finish_stored(builder, tenant_id=job.tenant_id, last_sequence=last)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("following background response %s failed", builder.response_id)


async def _sequenced(events: AsyncIterator[dict[str, Any]], *, after: int) -> AsyncIterator[bytes]:
    """A response's events after a sequence number, as SSE; one error event if it breaks."""
    sequence = after
    try:
        async for event in events:
            sequence = event["sequence_number"]
            if sequence > after:
                yield sse(event)
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception:
        log.error("a background response's stream failed", exc_info=True)
        yield sse(error_event(sequence + 1, internal_error()))


async def _kept(
    builder: ResponseBuilder,
    parsed: ResponsesRequest,
    *,
    tenant_id: int,
    request_id: str,
    retention_days: int,
) -> None:
    """Store the response, if asked, and add its turn to the conversation it names; a write
    that fails is logged, the answer still goes out."""
    body = builder.body()
    conversation = body.get("conversation")
    try:
        if parsed.store:
            await db_call(
                response_save,
                tenant_id=tenant_id,
                request_id=request_id,
                body=body,
                input_items=parsed.input_items,
                retention_days=retention_days,
                requested_model=parsed.chat.model,
            )
        if conversation and body["status"] in TURN_STATUSES:
            await db_call(
                conversation_turn_add,
                tenant_id=tenant_id,
                conversation_id=conversation["id"],
                items=[*parsed.input_items, *body["output"]],
            )
    except Exception:
        log.exception("could not keep response %s", builder.response_id)


async def responses_collect(
    events: AsyncIterator[Event],
    parsed: ResponsesRequest,
    *,
    model: str,
    submitted: Submitted | None,
    tenant_id: int,
) -> bytes:
    """A batch line's response body (stored, if asked), or the ApiError it ended with.

    A resumed line (no `submitted`) settles nothing: the ingester settles its reservation.
    """
    builder = ResponseBuilder(response_id=parsed.response_id, model=model, echo=parsed.echo)
    retention = submitted.principal.retention_days if submitted is not None else 0
    return json.dumps(
        await _whole(
            events,
            builder,
            parsed,
            submitted,
            tenant_id=tenant_id,
            request_id=parsed.response_id.removeprefix("resp_"),
            retention_days=retention,
        )
    ).encode()


async def _whole(
    events: AsyncIterator[Event],
    builder: ResponseBuilder,
    parsed: ResponsesRequest,
    submitted: Submitted | None,
    *,
    tenant_id: int,
    request_id: str,
    retention_days: int,
) -> dict[str, Any]:
    """The response object once the request has ended; a failed one raises its error."""
    try:
        async for event in events:
            if isinstance(event, Delta):
                builder.delta(event)
            elif isinstance(event, Finished | Failed):
                if submitted is not None:
                    request_ended(submitted, event)
                failure = request_failure(event) if isinstance(event, Failed) else None
                builder.end(event, error=failure)
                await _kept(
                    builder,
                    parsed,
                    tenant_id=tenant_id,
                    request_id=request_id,
                    retention_days=retention_days,
                )
                if failure is not None:
                    raise failure
                return builder.body()
    finally:
        await events_close(events)
    raise stream_ended()


@api_endpoint("GET", "DELETE", counted=True)
async def response_detail(
    request: HttpRequest, request_id: str, response_id: str
) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE)
    if request.method == "DELETE":
        deleted = await db_call(
            response_delete, tenant_id=principal.tenant_id, response_id=response_id
        )
        if not deleted:
            raise _not_found(response_id)
        return json_response({"id": response_id, "object": "response", "deleted": True})
    kept = await db_call(response_get, tenant_id=principal.tenant_id, response_id=response_id)
    if kept is None:
        raise _not_found(response_id)
    if request.GET.get("stream", "").lower() in ("1", "true"):
        return await _resumed(request, kept, tenant_id=principal.tenant_id)
    if kept.finished:
        return json_response(kept.body)
    # A background response not ended in the store: its reply stream says where it stands
    # (and ends it in the store if it has ended, its accepting frontend gone).
    builder = await settle_from_stream(
        dispatch_get(),
        kept,
        tenant_id=principal.tenant_id,
        policy=await _policy_of(kept, tenant_id=principal.tenant_id),
        follow=False,
        deadline=0.0,
    )
    return json_response(kept.body if builder is None else builder.body())


async def _policy_of(kept: Kept, *, tenant_id: int) -> Policy | None:
    """The policy a stored response's text is read under: its served version's."""
    return await policy_get(tenant_id=tenant_id, version=served_version(kept.body["model"]))


async def _resumed(request: HttpRequest, kept: Kept, *, tenant_id: int) -> HttpResponseBase:
    """A background response's events again, after `starting_after` (from its start)."""
    if not kept.body.get("background"):
        raise invalid("stream", "Only a background response can be streamed again.")
    raw = request.GET.get("starting_after", "-1")
    try:
        after = int(raw)
    except ValueError:
        raise invalid("starting_after", "'starting_after' must be an integer.") from None
    dispatch = dispatch_get()
    where = await dispatch.whereabouts(kept.request_id)
    if where is None:
        # The reply stream has expired: only the end the store kept is left to send.
        return sse_response(_stored_end(kept, after=after))
    builder = builder_of(kept)
    events = replay(
        dispatch,
        builder,
        deployment=where.deployment,
        request_id=kept.request_id,
        tenant_id=tenant_id,
        policy=await _policy_of(kept, tenant_id=tenant_id),
        follow=True,
        deadline=time.time() + settings.ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS,
    )
    return sse_response(_sequenced(events, after=after))


async def _stored_end(kept: Kept, *, after: int) -> AsyncIterator[bytes]:
    if kept.finished and kept.last_sequence > after:
        kind = {
            "completed": "response.completed",
            "incomplete": "response.incomplete",
            "cancelled": "response.cancelled",
        }.get(kept.body["status"], "response.failed")
        yield sse({"type": kind, "sequence_number": kept.last_sequence, "response": kept.body})


@api_endpoint("POST", counted=True)
async def response_cancel(request: HttpRequest, request_id: str, response_id: str) -> HttpResponse:
    """Cancel a background response; one that has ended is answered as it is."""
    principal = await request_principal(request, Scope.INFERENCE)
    kept = await db_call(response_get, tenant_id=principal.tenant_id, response_id=response_id)
    if kept is None:
        raise _not_found(response_id)
    if not kept.body.get("background"):
        raise ApiError(
            400,
            "invalid_request",
            "Only a background response can be cancelled.",
            param="response_id",
        )
    if kept.finished:
        return json_response(kept.body)
    dispatch = dispatch_get()
    where = await dispatch.whereabouts(kept.request_id)
    if where is not None:
        await dispatch.cancel_by_id(where=where, request_id=kept.request_id)
    # Its end (cancelled, or whatever came first) arrives within moments: answer with it,
    # screened as a poll or a stream screens it (and so stored, if this call ends it).
    builder = await settle_from_stream(
        dispatch,
        kept,
        tenant_id=principal.tenant_id,
        policy=await _policy_of(kept, tenant_id=principal.tenant_id),
        follow=True,
        deadline=time.time() + _CANCEL_WAIT_SECONDS,
    )
    return json_response(kept.body if builder is None else builder.body())


@api_endpoint("GET", counted=True)
async def response_input_items(
    request: HttpRequest, request_id: str, response_id: str
) -> HttpResponse:
    """A stored response's input items, a page at a time (newest first unless order=asc)."""
    principal = await request_principal(request, Scope.INFERENCE)
    limit, order, after = page_query(request)
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
    return json_response(list_page(page, has_more=len(items) > limit))


# The items one request may add, as OpenAI bounds it.
MAX_ADDED = 20


def conversation_not_found(conversation_id: str, param: str = "conversation_id") -> ApiError:
    return ApiError(
        404,
        "conversation_not_found",
        f"No conversation '{shown(conversation_id)}'.",
        param=param,
    )


def _item_not_found(item_id: str) -> ApiError:
    return ApiError(404, "item_not_found", f"No item '{shown(item_id)}'.", param="item_id")


def _fields_check(body: dict[str, Any], fields: frozenset[str]) -> None:
    for name in body:
        if name not in fields:
            raise unrecognized(name)


def _items_read(body: dict[str, Any], *, required: bool) -> list[dict[str, Any]]:
    """The body's `items` in their full shape, each with an id of its own among them."""
    raw = body.get("items")
    if raw is None and not required:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_ADDED or (required and not raw):
        least = 1 if required else 0
        raise invalid("items", f"'items' must be a list of {least} to {MAX_ADDED} items.")
    if not raw:
        return []
    items = input_items_read(raw, response_id=f"resp_{secrets.token_hex(16)}", field="items")
    seen: set[str] = set()
    for i, item in enumerate(items):
        item_id = item["id"]
        if not ITEM_ID.fullmatch(item_id):
            raise invalid(
                f"items[{i}].id",
                "An item's id is 1 to 64 letters, digits and the characters _ . : -",
            )
        if item_id in seen:
            raise invalid(f"items[{i}].id", f"'items[{i}].id' repeats an earlier item's id.")
        seen.add(item_id)
    return items


def _included(request: HttpRequest) -> bool:
    """Whether `include` (a query parameter) asks for the output text's log probabilities."""
    include = request.GET.getlist("include") + request.GET.getlist("include[]")
    for i, name in enumerate(include):
        if name != OUTPUT_LOGPROBS:
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'include[{i}]' is not supported: only {OUTPUT_LOGPROBS!r} is; got {shown(name)}.",
                param=f"include[{i}]",
            )
    return bool(include)


def _shown_item(item: dict[str, Any], *, logprobs: bool) -> dict[str, Any]:
    """An item as the list answers it: an output text's log probabilities only if included."""
    if logprobs or item.get("type") != "message":
        return item
    parts = [{k: v for k, v in part.items() if k != "logprobs"} for part in item["content"]]
    return {**item, "content": parts}


@api_endpoint("POST", counted=True)
async def conversations(request: HttpRequest, request_id: str) -> HttpResponse:
    """Create a conversation, with up to 20 first items and its metadata."""
    principal = await request_principal(request, Scope.INFERENCE)
    body = await request_json(request)
    _fields_check(body, frozenset({"items", "metadata"}))
    items = _items_read(body, required=False)
    created = await db_call(
        conversation_create,
        tenant_id=principal.tenant_id,
        items=items,
        metadata=metadata_read(body.get("metadata")) or {},
        retention_days=principal.retention_days,
    )
    return json_response(created)


@api_endpoint("GET", "POST", "DELETE", counted=True)
async def conversation_detail(
    request: HttpRequest, request_id: str, conversation_id: str
) -> HttpResponse:
    """A conversation: retrieve it, change its metadata (POST) or delete it and its items."""
    principal = await request_principal(request, Scope.INFERENCE)
    tenant_id = principal.tenant_id
    found: dict[str, Any] | None
    if request.method == "DELETE":
        if not await db_call(
            conversation_delete, tenant_id=tenant_id, conversation_id=conversation_id
        ):
            raise conversation_not_found(conversation_id)
        return json_response(
            {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
        )
    if request.method == "POST":
        body = await request_json(request)
        _fields_check(body, frozenset({"metadata"}))
        if "metadata" not in body:
            raise invalid("metadata", "'metadata' is required.", code="missing_required_parameter")
        found = await db_call(
            conversation_update,
            tenant_id=tenant_id,
            conversation_id=conversation_id,
            metadata=metadata_read(body["metadata"]) or {},
            retention_days=principal.retention_days,
        )
    else:
        found = await db_call(
            conversation_get, tenant_id=tenant_id, conversation_id=conversation_id
        )
    if found is None:
        raise conversation_not_found(conversation_id)
    return json_response(found)


@api_endpoint("GET", "POST", counted=True)
async def conversation_items(
    request: HttpRequest, request_id: str, conversation_id: str
) -> HttpResponse:
    """A conversation's items a page at a time (newest first unless order=asc), or (POST) up
    to 20 more added after its last one."""
    principal = await request_principal(request, Scope.INFERENCE)
    logprobs = _included(request)
    if request.method == "POST":
        body = await request_json(request)
        _fields_check(body, frozenset({"items"}))
        added = await db_call(
            conversation_items_add,
            tenant_id=principal.tenant_id,
            conversation_id=conversation_id,
            items=_items_read(body, required=True),
            retention_days=principal.retention_days,
        )
        if added == "missing":
            raise conversation_not_found(conversation_id)
        if added == "full":
            raise invalid("items", f"A conversation holds at most {MAX_ITEMS} items.")
        if isinstance(added, str):
            raise invalid("items", f"The conversation holds an item '{shown(added)}' already.")
        return json_response(
            list_page([_shown_item(i, logprobs=logprobs) for i in added], has_more=False)
        )
    limit, order, after = page_query(request)
    page = await db_call(
        conversation_items_page,
        tenant_id=principal.tenant_id,
        conversation_id=conversation_id,
        limit=limit,
        order=order,
        after=after,
    )
    if page == "conversation":
        raise conversation_not_found(conversation_id)
    if isinstance(page, str):
        raise invalid("after", f"'after' names no item of '{shown(conversation_id)}'.")
    items, more = page
    return json_response(
        list_page([_shown_item(i, logprobs=logprobs) for i in items], has_more=more)
    )


@api_endpoint("GET", "DELETE", counted=True)
async def conversation_item(
    request: HttpRequest, request_id: str, conversation_id: str, item_id: str
) -> HttpResponse:
    """One item of a conversation; DELETE takes it out and answers the conversation."""
    principal = await request_principal(request, Scope.INFERENCE)
    found: dict[str, Any] | str
    if request.method == "DELETE":
        found = await db_call(
            conversation_item_delete,
            tenant_id=principal.tenant_id,
            conversation_id=conversation_id,
            item_id=item_id,
            retention_days=principal.retention_days,
        )
    else:
        logprobs = _included(request)
        found = await db_call(
            conversation_item_get,
            tenant_id=principal.tenant_id,
            conversation_id=conversation_id,
            item_id=item_id,
        )
        if isinstance(found, dict):
            found = _shown_item(found, logprobs=logprobs)
    if found == "conversation":
        raise conversation_not_found(conversation_id)
    if isinstance(found, str):
        raise _item_not_found(item_id)
    return json_response(found)
