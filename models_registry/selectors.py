"""Read-only queries over the registry: what a model name routes to.

A route carries the prices its requests pay, which billing decides (price books): the caller,
above billing, passes its price function in (inference.pipeline.clients passes billing's
price_current), so the registry imports no app above it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from django.db import models

from dataplane.pools import PoolSpec
from models_registry.access import audience_admits, version_audience
from models_registry.models import (
    BUCKETS,
    Alias,
    Deployment,
    DeploymentState,
    Model,
    ModelVersion,
)


class Price(Protocol):
    """What a request pays per 1,000 tokens of a version (billing.services.Price)."""

    @property
    def input_per_1k(self) -> Decimal: ...

    @property
    def output_per_1k(self) -> Decimal: ...


# The prices a request admitted now pays for a version: billing.services.price_current.
PriceOf = Callable[[ModelVersion], Price]


@dataclass(frozen=True, kw_only=True)
class Pool(PoolSpec):
    """One deployment of a version: what the pick weighs (PoolSpec), and its queue's limits."""

    accelerator: str
    max_queued: int
    max_queued_tokens: int


@dataclass(frozen=True)
class Route:
    """Where a request for a model name goes: a version and the deployment that serves it."""

    requested: str
    model_name: str
    version: str
    version_digest: str
    deployment: str
    context_length: int
    artifact_dir: Path
    sampling_defaults: dict[str, Any]
    price_input_per_1k: Decimal
    price_output_per_1k: Decimal
    max_queued: int
    max_queued_tokens: int
    adapter: str = ""  # the adapter version's digest when the version is a LoRA adapter
    task: str = "chat"  # the model's task: chat, completion or embedding
    dimensions: tuple[int, ...] = ()  # an embedding model's vector sizes, native first
    tool_parser: str = ""  # the vLLM tool parser of the version (an adapter's: its base's)
    reasoning_parser: str = ""  # its vLLM reasoning parser (an adapter's: its base's)
    # Every pool (deployment) of the version, `deployment` first; one pool: no choice to make.
    pools: tuple[Pool, ...] = ()
    # The tenants that may use the version (None: every tenant), and the slug of the tenant
    # that owns its model ("": platform-wide); models_registry.access.
    tenants: frozenset[int] | None = None
    owner: str = ""

    @property
    def served_name(self) -> str:
        """The `model` field of responses: the model pinned to the version that served it."""
        return f"{self.model_name}@{self.version}"


def encoder_dimensions(encoder: dict[str, Any]) -> tuple[int, ...]:
    """The vector sizes an embedding model returns: its own, then any shorter Matryoshka ones.

    Only a model trained for it (`matryoshka_dimensions` in its engine args) keeps its meaning
    when a vector is cut short; others serve their native size alone.
    """
    if not encoder:
        return ()
    native = int(encoder["dimensions"])
    shorter = sorted({int(d) for d in encoder.get("matryoshka_dimensions", []) if d < native})
    return (native, *reversed(shorter))


def deployment_for(version: ModelVersion, *, ready_only: bool = False) -> Deployment | None:
    """Return the deployment serving a version, preferring one whose workers are ready.

    An adapter is served by its base version's deployment. A deployment with no live worker
    still routes a pinned or primary version: the frontend then answers 503 (retry), which is
    the truth, rather than 404 (no such model).
    """
    served = version.base if version.base_id is not None else version
    deployments = Deployment.objects.filter(version=served).order_by("-updated_at")
    if version.base_id is not None:
        deployments = deployments.filter(max_loras__gt=0)  # only these load adapters
    if ready_only:
        deployments = deployments.filter(state=DeploymentState.READY)
    ranked = sorted(deployments, key=lambda d: d.state != DeploymentState.READY)
    return ranked[0] if ranked else None


def pools_for(version: ModelVersion, first: Deployment) -> list[Deployment]:
    """Every deployment serving a version (adapters: those that load them), `first` first."""
    served = version.base if version.base_id is not None else version
    others = (
        Deployment.objects.select_related("version")
        .filter(version=served)
        .exclude(pk=first.pk)
        .order_by("name")
    )
    if version.base_id is not None:
        others = others.filter(max_loras__gt=0)
    return [first, *others]


def _pool(deployment: Deployment) -> Pool:
    return Pool(
        deployment=deployment.name,
        spot=deployment.spot,
        accelerator=deployment.accelerator,
        max_queued=deployment.max_queued,
        max_queued_tokens=deployment.max_queued_tokens,
        target_wait_seconds=deployment.slo_ttft_p95_ms / 1000,
    )


def version_served_name(*, digest: str) -> str | None:
    """Return how responses name a version (`model@version`), or None if it is unknown."""
    version = ModelVersion.objects.select_related("model").filter(digest=digest).first()
    return version.public_name if version is not None else None


def version_pinned(name: str) -> ModelVersion | None:
    """Return the version a `model@version` name pins (a label or a digest prefix), or None."""
    if "\x00" in name:
        return None  # no name holds one, and PostgreSQL cannot compare text that does
    model_name, _, ref = name.partition("@")
    versions = ModelVersion.objects.select_related("model", "base").filter(model__name=model_name)
    by_label = versions.filter(label=ref).first() if ref else None
    if by_label is not None:
        return by_label
    return versions.filter(digest__startswith=ref).first() if len(ref) >= 8 else None


def _newest_deployed(name: str) -> ModelVersion | None:
    """Return a model's newest version that a deployment serves (adapters through their base)."""
    return (
        ModelVersion.objects.select_related("model", "base")
        .filter(model__name=name)
        .filter(models.Q(deployments__isnull=False) | models.Q(base__deployments__max_loras__gt=0))
        .distinct()
        .first()
    )


def _route(
    requested: str, version: ModelVersion, deployment: Deployment, price_of: PriceOf
) -> Route:
    price = price_of(version)
    deployments = pools_for(version, deployment)
    return Route(
        requested=requested,
        model_name=version.model.name,
        version=version.version,
        version_digest=version.digest,
        deployment=deployment.name,
        # Pools of a version should share a context length; a request must fit the smallest.
        context_length=min(d.context_length for d in deployments),
        artifact_dir=(version.base or version).artifact_dir,
        sampling_defaults=version.sampling_defaults,
        price_input_per_1k=price.input_per_1k,
        price_output_per_1k=price.output_per_1k,
        max_queued=deployment.max_queued,
        max_queued_tokens=deployment.max_queued_tokens,
        adapter=version.digest if version.base_id is not None else "",
        task=version.model.task,
        dimensions=encoder_dimensions(version.encoder),
        tool_parser=(version.base or version).tool_parser,
        reasoning_parser=(version.base or version).reasoning_parser,
        pools=tuple(_pool(d) for d in deployments) if len(deployments) > 1 else (),
        tenants=version_audience(version),
        owner=version.model.owner.slug if version.model.owner is not None else "",
    )


def bucket_of(*, alias: str, tenant_id: int, user: str | None) -> int:
    """Return the traffic bucket (0..9,999) of a tenant's user on an alias.

    The same tenant and `user` land in the same bucket on every frontend; without `user` the
    tenant's whole traffic shares one bucket.
    """
    key = f"{alias}\x1f{tenant_id}\x1f{user or ''}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % BUCKETS


Splits = tuple[tuple[int, Route], ...]  # (upper bucket bound, route), from bucket 0 upward


@dataclass(frozen=True)
class Routing:
    """Where a model name sends requests: one route, or an alias's weighted split.

    Splits own bucket ranges from 0 upward in the order they were created and the primary
    version owns the rest, so when a canary's share grows the buckets it had stay with it:
    a user sees one version while the weights that cover its bucket do not change.

    A tenant in `targets` is routed by its own splits alone (tenant targeting: a split or a
    canary scoped to named tenants), every other tenant by `splits`. `routes_for` says which
    versions a tenant can be sent to, for checks that must hold on every version it may get.
    """

    primary: Route
    splits: Splits = ()
    shadow: Route | None = None
    shadow_buckets: int = 0
    weights: dict[str, float] = field(default_factory=dict)  # version -> percent, untargeted
    # The alias an interactive request goes to when this one's deployment cannot take it.
    fallback: str = ""
    # Tenant id -> its own splits; an empty tuple keeps that tenant on the primary (its
    # targeted version's workers are not ready), not on the untargeted splits.
    targets: dict[int, Splits] = field(default_factory=dict)

    def splits_for(self, *, tenant_id: int) -> Splits:
        """Return the splits a tenant's requests are divided by."""
        return self.targets.get(tenant_id, self.splits)

    def pick(self, *, tenant_id: int, user: str | None) -> Route:
        splits = self.splits_for(tenant_id=tenant_id)
        if not splits:
            return self.primary
        bucket = bucket_of(alias=self.primary.requested, tenant_id=tenant_id, user=user)
        for upper, route in splits:
            if bucket < upper:
                return route
        return self.primary

    def routes_for(self, *, tenant_id: int) -> tuple[Route, ...]:
        """Return every route a tenant's requests can take here, the primary first."""
        return (self.primary, *(route for _, route in self.splits_for(tenant_id=tenant_id)))

    def weights_for(self, *, tenant_id: int) -> dict[str, float]:
        """Return each version's percent of a tenant's traffic (another's targeting unshown)."""
        if tenant_id not in self.targets:
            return dict(self.weights)
        weights: dict[str, float] = {}
        lower = 0
        for upper, route in self.targets[tenant_id]:
            weights[route.version] = (upper - lower) * 100 / BUCKETS
            lower = upper
        weights[self.primary.version] = 100 - sum(weights.values())
        return weights

    def shadow_for(self, *, request_id: str) -> Route | None:
        """Return the shadow route when this request is among the copied fraction."""
        if self.shadow is None:
            return None
        draw = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest())
        return self.shadow if draw % BUCKETS < self.shadow_buckets else None


def _alias_routing(alias: Alias, price_of: PriceOf) -> Routing | None:
    primary_deployment = deployment_for(alias.version)
    if primary_deployment is None:
        return None
    primary = _route(alias.name, alias.version, primary_deployment, price_of)
    scopes: dict[int | None, list[tuple[int, Route]]] = {None: []}
    uppers: dict[int | None, int] = {}
    weights: dict[str, float] = {}
    for split in alias.splits.select_related("version__model", "version__base"):
        scope = split.tenant_id
        scopes.setdefault(scope, [])
        upper = uppers[scope] = min(uppers.get(scope, 0) + split.buckets, BUCKETS)
        deployment = deployment_for(split.version, ready_only=True)
        # A version whose workers are not ready takes no traffic: its buckets stay primary.
        if deployment is not None:
            scopes[scope].append((upper, _route(alias.name, split.version, deployment, price_of)))
            if scope is None:
                weights[split.version.version] = split.buckets * 100 / BUCKETS
    weights[alias.version.version] = 100 - sum(weights.values())
    shadow = getattr(alias, "shadow", None)
    shadow_route = None
    if shadow is not None:
        deployment = deployment_for(shadow.version, ready_only=True)
        if deployment is not None:
            shadow_route = _route(alias.name, shadow.version, deployment, price_of)
    untargeted = scopes.pop(None)
    return Routing(
        primary=primary,
        splits=tuple(untargeted),
        shadow=shadow_route,
        shadow_buckets=shadow.buckets if shadow_route is not None and shadow else 0,
        weights=weights,
        fallback=alias.fallback.name if alias.fallback is not None else "",
        targets={tenant: tuple(splits) for tenant, splits in scopes.items() if tenant is not None},
    )


def routing_resolve(*, name: str, price_of: PriceOf) -> Routing | None:
    """Return where a model name (alias, model or `model@version`) routes, or None.

    `price_of` prices each route's version (billing.services.price_current).
    """
    if "\x00" in name:
        return None  # no name holds one, and PostgreSQL cannot compare text that does
    if "@" in name:
        version = version_pinned(name)
    else:
        alias = (
            Alias.objects.select_related(
                "version__model", "version__base", "shadow__version", "fallback"
            )
            .filter(name=name)
            .first()
        )
        if alias is not None:
            return _alias_routing(alias, price_of)
        # A bare model name goes to its newest version that has a deployment.
        version = _newest_deployed(name)
    if version is None:
        return None
    deployment = deployment_for(version)
    if deployment is None:
        return None
    return Routing(primary=_route(name, version, deployment, price_of))


def route_resolve(
    *, name: str, price_of: PriceOf, tenant_id: int = 0, user: str | None = None
) -> Route | None:
    """Return the route one request for a model name takes, or None."""
    routing = routing_resolve(name=name, price_of=price_of)
    return routing.pick(tenant_id=tenant_id, user=user) if routing else None


def model_names_list() -> list[tuple[str, int]]:
    """Return every name a client can call (aliases and served models) with a created time."""
    names: dict[str, int] = {}
    for alias in Alias.objects.all():
        names[alias.name] = int(alias.updated_at.timestamp())
    served = Deployment.objects.values_list("version_id", flat=True)
    lora = Deployment.objects.filter(max_loras__gt=0).values_list("version_id", flat=True)
    versions = ModelVersion.objects.select_related("model").filter(
        models.Q(pk__in=served) | models.Q(base_id__in=lora)
    )
    for version in versions:
        model = version.model
        names.setdefault(model.name, int(model.created_at.timestamp()))
        names.setdefault(version.public_name, int(version.created_at.timestamp()))
    return sorted(names.items())


# --- who may call which model (models_registry.access) -----------------------------------------


@dataclass(frozen=True)
class ModelAccess:
    """A model, who may call it, and what routes to it: a row of the operators' access page."""

    model: Model
    grants: tuple[str, ...]  # the slugs of the tenants granted it (a limited model)
    bases: tuple[str, ...]  # an adapter model's base versions (`model@version`)
    aliases: tuple[str, ...]  # the aliases whose primary is one of its versions

    @property
    def shown(self) -> str:
        """Who may call it, in words."""
        if self.model.owner is not None:
            return f"{self.model.owner.slug} alone"
        if self.model.limited:
            return f"granted: {', '.join(self.grants)}" if self.grants else "granted: nobody"
        return "every tenant"


def _model_access(model: Model) -> ModelAccess:
    versions = list(model.versions.all())
    return ModelAccess(
        model=model,
        grants=tuple(sorted(g.tenant.slug for g in model.grants.all())),
        bases=tuple(sorted({v.base.public_name for v in versions if v.base is not None})),
        aliases=tuple(sorted({a.name for v in versions for a in v.aliases.all()})),
    )


def _models() -> models.QuerySet[Model]:
    return Model.objects.select_related("owner").prefetch_related(
        "grants__tenant", "versions__base__model", "versions__aliases"
    )


def model_access_list() -> list[ModelAccess]:
    """Return every model with who may call it (operators only: it names every tenant)."""
    return [_model_access(model) for model in _models().order_by("name")]


def model_access_get(*, name: str) -> ModelAccess | None:
    """Return one model with who may call it (operators only), or None."""
    if "\x00" in name:
        return None
    model = _models().filter(name=name).first()
    return _model_access(model) if model is not None else None


@dataclass(frozen=True)
class TenantModel:
    """A model a tenant may call, as its own console shows it."""

    model: Model
    access: str  # yours, granted or platform
    bases: tuple[str, ...]  # an adapter's base versions
    aliases: tuple[str, ...]  # the aliases the tenant may call that route to it


def model_list_for_tenant(*, tenant_id: int) -> list[TenantModel]:
    """Return the models a tenant may call (a version of), its own adapters among them.

    No other tenant is named: neither an owner nor another grant.
    """
    found = []
    for model in _models().order_by("name"):
        versions = [
            v for v in model.versions.all() if audience_admits(version_audience(v), tenant_id)
        ]
        if not versions:
            continue
        if model.owner_id is not None:
            access = "yours"
        else:
            access = "granted" if model.limited else "platform"
        found.append(
            TenantModel(
                model=model,
                access=access,
                bases=tuple(sorted({v.base.public_name for v in versions if v.base})),
                aliases=tuple(sorted({a.name for v in versions for a in v.aliases.all()})),
            )
        )
    return found
