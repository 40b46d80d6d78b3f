"""This process's shared data-plane clients and its cache of where model names route.

Each client is made once per event loop, against the Redis the settings name; the route and
model-name caches refresh on their own, and the same change messages mark both stale.
"""

from __future__ import annotations

import asyncio

from django.conf import settings

from billing.services import price_current
from config.json_body import shown
from dataplane.frontdoor import FrontDoor
from dataplane.quotas import Quotas
from dataplane.redis_client import redis_client_new
from inference.base.errors import ApiError
from inference.pipeline.answer_cache import ResponseCache
from inference.pipeline.auth import Principal
from inference.pipeline.control_cache import RefreshingCache
from inference.pipeline.idempotency import Idempotency
from models_registry.access import routing_for_tenant
from models_registry.selectors import Routing, model_names_list, routing_resolve

_dispatch: FrontDoor | None = None
_quotas: Quotas | None = None
_idempotency: Idempotency | None = None
_responses: ResponseCache | None = None
_dispatch_loop: asyncio.AbstractEventLoop | None = None


def dispatch_get() -> FrontDoor:
    """Return this process's data-plane client, bound to the running loop."""
    global _dispatch, _quotas, _idempotency, _responses, _dispatch_loop
    loop = asyncio.get_running_loop()
    if _dispatch is None or _quotas is None or _dispatch_loop is not loop:
        client = redis_client_new()
        _dispatch = FrontDoor(client, reply_ttl=settings.ROUNDHOUSE_REPLY_TTL_SECONDS)
        _quotas = Quotas(client)
        _idempotency = Idempotency(client, _dispatch)
        _responses = ResponseCache(client)
        _dispatch_loop = loop
    return _dispatch


def idempotency_get() -> Idempotency:
    """Return this process's Idempotency-Key store, bound to the running loop."""
    dispatch_get()
    assert _idempotency is not None
    return _idempotency


def answer_cache_get() -> ResponseCache:
    """Return this process's response cache, bound to the running loop."""
    dispatch_get()
    assert _responses is not None
    return _responses


def quotas_get() -> Quotas:
    """Return this process's quota client, bound to the running loop."""
    dispatch_get()
    assert _quotas is not None
    return _quotas


def _routing_load(name: str) -> Routing | None:
    return routing_resolve(name=name, price_of=price_current)


_routings: RefreshingCache[str, Routing | None] = RefreshingCache(
    _routing_load, ttl=lambda: settings.ROUNDHOUSE_ROUTE_CACHE_SECONDS, grace=30.0, kind="routes"
)


def _model_names_load(_: None) -> list[tuple[str, int]]:
    return model_names_list()


# Built from the same rows as routes, so the same change messages mark it stale.
_model_names: RefreshingCache[None, list[tuple[str, int]]] = RefreshingCache(
    _model_names_load,
    ttl=lambda: settings.ROUNDHOUSE_ROUTE_CACHE_SECONDS,
    grace=30.0,
    kind="routes",
)


async def model_names_get() -> list[tuple[str, int]]:
    """Return every name any client can call, with its created time, cached like routes.

    Which of them a caller may call is routing_get's to say.
    """
    return await _model_names.get(None)


async def routing_get(name: str, *, principal: Principal) -> Routing:
    """Return where a model name routes for a caller, cached briefly, or raise 404.

    The one check of model access (models_registry.access): a name the caller's tenant may not
    call, or its key is not narrowed to, is the 404 of a name that does not exist, word for
    word; and a split or shadow version the tenant may not use is not in what it gets.
    """
    routing = await _routings.get(name)
    if routing is not None:
        routing = routing_for_tenant(
            routing,
            name=name,
            tenant_id=principal.tenant_id,
            allowed=principal.allowed_models,
        )
    if routing is None:
        if "@" in name:
            model, _, version = name.partition("@")
            message = (
                f"The model '{shown(model)}' has no version '{shown(version)}' (pin a version by "
                "its label or at least 8 characters of its id), or you do not have access to it."
            )
        else:
            message = f"The model '{shown(name)}' does not exist or you do not have access to it."
        raise ApiError(404, "model_not_found", message, param="model")
    return routing
