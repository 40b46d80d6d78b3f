"""Who may call a model: the one rule that routing, `/v1/models` and the console apply.

A model is platform-wide (no owner) or owned by one tenant. A platform-wide model is open to
every tenant unless an operator limited it to the tenants granted it; an owned model is its
owner's alone. A version is a model's, so it has the model's audience; a LoRA adapter is a
version on a base version, so it has both its own model's audience and its base's (a tenant
calls the base's weights through it). An alias has the audience of its primary version; a
split, canary or shadow version a tenant may not use takes none of that tenant's requests.

An API key may narrow its tenant's audience further to a list of names (aliases or models; a
model covers its pinned `model@version` names). A name a key may not call is the same 404 as a
name that does not exist (docs/model-access.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING

from models_registry.models import BUCKETS, Model, ModelVersion

if TYPE_CHECKING:
    from models_registry.selectors import Route, Routing

# The tenant ids that may call something; None: every tenant.
Audience = frozenset[int] | None


def model_audience(model: Model) -> Audience:
    """Return the tenants that may call a model: its owner, its grants, or every tenant."""
    if model.owner_id is not None:
        return frozenset({model.owner_id})
    if model.limited:
        return frozenset(grant.tenant_id for grant in model.grants.all())
    return None


def version_audience(version: ModelVersion) -> Audience:
    """Return the tenants that may call a version: its model's, and an adapter's base's too."""
    own = model_audience(version.model)
    if version.base is None:
        return own
    return audience_meet(own, model_audience(version.base.model))


def audience_meet(one: Audience, other: Audience) -> Audience:
    """Return the tenants in both audiences."""
    if one is None:
        return other
    if other is None:
        return one
    return one & other


def audience_admits(audience: Audience, tenant_id: int) -> bool:
    return audience is None or tenant_id in audience


def audience_includes(audience: Audience, other: Audience) -> bool:
    """Whether every tenant `other` admits is admitted by `audience`."""
    if audience is None:
        return True
    return other is not None and other <= audience


def name_allowed(name: str, allowed: Collection[str]) -> bool:
    """Whether a key narrowed to `allowed` names (empty: not narrowed) may call a name.

    A model's name covers its pinned versions (`model@version`); an alias covers itself only.
    """
    return not allowed or name in allowed or name.partition("@")[0] in allowed


def routing_for_tenant(
    routing: Routing, *, name: str, tenant_id: int, allowed: Collection[str]
) -> Routing | None:
    """Return the part of a name's routing a tenant's key may use; None where it may use none.

    The primary decides: a tenant that may not use it may not call the name at all. What is
    returned routes this tenant alone: its own splits (targeted at it, or the untargeted
    ones), where a split or canary version it may not use sends its buckets to the primary
    (its traffic share, as /v1/models/{id} shows it, goes with them), and no other tenant's
    targeting. A shadow version it may not use gets no copy of its requests. An alias's
    fallback is a name of its own, checked when a request goes there.
    """
    if not name_allowed(name, allowed) or not _admits(routing.primary, tenant_id):
        return None
    own = routing.splits_for(tenant_id=tenant_id)
    if all(_admits(route, tenant_id) for _, route in own) and (
        routing.shadow is None or _admits(routing.shadow, tenant_id)
    ):
        return routing
    primary = routing.primary
    splits = tuple((upper, route if _admits(route, tenant_id) else primary) for upper, route in own)
    weights: dict[str, float] = {}
    lower = 0
    for upper, route in splits:
        weights[route.version] = weights.get(route.version, 0.0) + (upper - lower) * 100 / BUCKETS
        lower = upper
    weights[primary.version] = 100 - sum(v for k, v in weights.items() if k != primary.version)
    shadow = routing.shadow if routing.shadow and _admits(routing.shadow, tenant_id) else None
    return dataclasses.replace(
        routing,
        splits=splits,
        targets={},
        shadow=shadow,
        shadow_buckets=routing.shadow_buckets if shadow is not None else 0,
        weights=weights,
    )


def _admits(route: Route, tenant_id: int) -> bool:
    return audience_admits(route.tenants, tenant_id)
