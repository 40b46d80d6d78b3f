"""`/v1/conversations`: OpenAI's Conversations API, and its items.

A conversation holds items (messages, reasoning, function calls and their outputs) that a
response naming it (`conversation` on `POST /v1/responses`) reads as its history; the
response's turn, its input and then its output, is added once it ends (inference.responses
_views and inference.responses_store). Everything lives in PostgreSQL under the tenant
(inference.conversations_store), so any frontend serves it; another tenant's id is a 404.
Every call takes a request from the tenant's requests per minute, as an inference call does:
each writes or reads PostgreSQL, and one tenant's flood of them must run out of its own.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.http import HttpRequest, HttpResponse

from config.db import db_call
from config.json_body import shown
from inference.conversations_store import (
    ITEM_ID,
    MAX_ITEMS,
    conversation_create,
    conversation_delete,
    conversation_get,
    conversation_item_delete,
    conversation_item_get,
    conversation_items_add,
    conversation_items_page,
    conversation_update,
)
from inference.endpoint import (
    api_endpoint,
    json_response,
    list_page,
    page_query,
    request_json,
    request_principal,
)
from inference.errors import ApiError, invalid, unrecognized
from inference.responses import OUTPUT_LOGPROBS, input_items_read, metadata_read
from tenants.models import Scope

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
