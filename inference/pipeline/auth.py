"""API-key authentication for the data plane, cached per process.

A revocation publishes the key's public id (dataplane.tenancy); every frontend drops it from its
cache at once, and the cache TTL bounds staleness if a message is missed. Other changes to keys,
tenants and quotas mark the cached keys stale (`dataplane.changes`).
"""

from __future__ import annotations

import dataclasses
import hmac
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from dataplane.quotas import Limits
from inference.base.errors import ApiError
from inference.pipeline.control_cache import RefreshingCache
from tenants.keys import token_hash, token_parse
from tenants.models import ApiKey


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant through one of its keys."""

    tenant_id: int
    tenant_slug: str
    key_id: int
    key_public_id: str
    scopes: frozenset[str]
    max_tokens_per_request: int
    max_context_tokens: int
    limits: Limits
    priority_weight: float = 1.0
    max_request_seconds: float = 600.0
    response_cache_seconds: int = 0  # 0: the tenant did not opt in
    response_cache_bill_percent: int = 100
    # The tenant's own large-body bytes a minute (None: the platform's setting; 0: no limit).
    large_body_bytes_per_minute: int | None = None
    retention_days: int = 0  # 0: the request's text is never stored
    # A request that would finish after its deadline runs capped (inference/pipeline/capping.py).
    output_capping: bool = False
    # The names the key is narrowed to (empty: every model its tenant may call).
    allowed_models: frozenset[str] = frozenset()


def unnarrowed(principal: Principal) -> Principal:
    """The caller with its key's model list lifted: what its tenant may call, all of it.

    For finding the version that served one of the key's admitted requests by its pinned
    name (`model@version`), which a key narrowed to an alias does not name itself.
    """
    return dataclasses.replace(principal, allowed_models=frozenset())


@dataclass(frozen=True)
class _Cached:
    secret_hash: str
    principal: Principal
    problem: ApiError | None
    expires_at: float | None


def _load(public_id: str) -> _Cached | None:
    """Load a key by its public id; None when no key has it."""
    key = (
        ApiKey.objects.select_related("tenant", "tenant__quota").filter(public_id=public_id).first()
    )
    if key is None:
        return None
    problem = None
    if key.revoked_at is not None:
        problem = ApiError(401, "revoked_api_key", "This API key has been revoked.")
    elif not key.tenant.is_active:
        problem = ApiError(403, "tenant_disabled", "This tenant is disabled.")
    quota = key.tenant.quota
    principal = Principal(
        tenant_id=key.tenant_id,
        tenant_slug=key.tenant.slug,
        key_id=key.pk,
        key_public_id=key.public_id,
        scopes=frozenset(key.scopes),
        max_tokens_per_request=quota.max_tokens_per_request,
        max_context_tokens=quota.max_context_tokens,
        limits=Limits(
            requests_per_minute=quota.requests_per_minute,
            tokens_per_minute=quota.tokens_per_minute,
            max_concurrency=quota.max_concurrency,
            monthly_budget=quota.monthly_budget,
        ),
        priority_weight=float(max(quota.priority_weight, 1)),
        max_request_seconds=float(quota.max_request_seconds),
        response_cache_seconds=quota.response_cache_seconds,
        response_cache_bill_percent=quota.response_cache_bill_percent,
        large_body_bytes_per_minute=quota.large_body_bytes_per_minute,
        retention_days=key.tenant.retention_days,
        output_capping=quota.output_capping,
        allowed_models=frozenset(key.allowed_models or ()),
    )
    expires = key.expires_at.timestamp() if key.expires_at else None
    return _Cached(key.secret_hash, principal, problem, expires)


# Anyone can present a well-formed token: unknown public ids share a small shelf of their own
# (RefreshingCache), so made-up keys neither grow the process nor evict the keys in use.
_keys: RefreshingCache[str, _Cached | None] = RefreshingCache(
    _load,
    ttl=lambda: settings.ROUNDHOUSE_KEY_CACHE_SECONDS,
    grace=30.0,
    kind="keys",
    max_entries=10_000,
    max_missing=1_024,
)


def credentials(authorization: str | None, api_key: str | None) -> str | None:
    """A request's key as an Authorization header: its own, or an `x-api-key` header's key
    (how Anthropic's SDKs send it) as a bearer token."""
    if authorization or api_key is None:
        return authorization
    return f"Bearer {api_key}"


async def authenticate(authorization: str | None, *, scope: str) -> Principal:
    """Return the principal of a bearer token or raise a 401/403 ApiError."""
    return scope_check(await key_check(authorization), scope=scope)


def scope_check(principal: Principal, *, scope: str) -> Principal:
    """Return the principal if its key has the scope, or raise the 403 saying it lacks it."""
    if scope not in principal.scopes:
        raise ApiError(403, "insufficient_scope", f"This API key lacks the '{scope}' scope.")
    return principal


async def key_check(authorization: str | None) -> Principal:
    """Return who a bearer token acts as, whatever its scopes, or raise a 401/403 ApiError."""
    if not authorization:
        raise ApiError(
            401,
            "missing_api_key",
            "You didn't provide an API key. Send it as 'Authorization: Bearer rh-...' "
            "(or as 'x-api-key: rh-...').",
        )
    kind, _, token = authorization.partition(" ")
    token = token.strip()
    if kind.lower() != "bearer" or not token:
        raise ApiError(401, "invalid_authorization_header", "Use 'Authorization: Bearer rh-...'.")
    parsed = token_parse(token)
    if parsed is None:
        raise ApiError(401, "invalid_api_key", "Incorrect API key provided.")
    cached = await _keys.get(parsed.public_id)
    if cached is None or not hmac.compare_digest(cached.secret_hash, token_hash(token)):
        raise ApiError(401, "invalid_api_key", "Incorrect API key provided.")
    if cached.problem is not None:
        raise cached.problem
    if cached.expires_at is not None and cached.expires_at <= timezone.now().timestamp():
        raise ApiError(401, "expired_api_key", "This API key has expired.")
    return cached.principal


def principal_of_key(public_id: str) -> Principal:
    """Return who a stored key acts as, for work it started earlier (a batch's requests).

    Raises the ApiError a client with this key would get now: a revoked or expired key, or a
    disabled tenant, stops its batches too.
    """
    cached = _load(public_id)
    if cached is None:
        raise ApiError(401, "invalid_api_key", "The batch's API key no longer exists.")
    if cached.problem is not None:
        raise cached.problem
    if cached.expires_at is not None and cached.expires_at <= timezone.now().timestamp():
        raise ApiError(401, "expired_api_key", "The batch's API key has expired.")
    return cached.principal
