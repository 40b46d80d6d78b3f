"""Services that change tenants, members, keys, quotas and the audit trail."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

# The audit chain lives in tenants.audit; audit_record and GENESIS_HASH are re-exported here.
from tenants.audit import GENESIS_HASH as GENESIS_HASH
from tenants.audit import audit_record as audit_record
from tenants.keys import token_generate, token_hash
from tenants.models import ApiKey, Membership, Quota, Role, Scope, Tenant


def tenant_create(*, slug: str, name: str = "", actor: User | None = None) -> Tenant:
    """Create a tenant with the default quota."""
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise ValidationError({"slug": f"tenant {slug!r} already exists"})
        tenant = Tenant.objects.create(slug=slug, name=name or slug)
        Quota.objects.create(tenant=tenant, **settings.SWITCHYARD_DEFAULT_QUOTA)
        audit_record(
            action="tenant.create", target_type="tenant", target_id=slug, tenant=tenant, actor=actor
        )
    return tenant


def membership_add(
    *,
    tenant: Tenant,
    username: str,
    role: str,
    email: str = "",
    password: str | None = None,
    actor: User | None = None,
) -> Membership:
    """Add a user (created if new) to a tenant with a role."""
    if role not in Role.values:
        raise ValidationError({"role": f"role must be one of {', '.join(Role.values)}"})
    user_model = get_user_model()
    with transaction.atomic():
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"email": email}
        )
        if password is not None:
            user.set_password(password)
            user.save(update_fields=["password"])
        elif created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        membership, _ = Membership.objects.update_or_create(
            user=user, tenant=tenant, defaults={"role": role}
        )
        audit_record(
            action="membership.set",
            target_type="user",
            target_id=username,
            tenant=tenant,
            actor=actor,
            data={"role": role},
        )
    return membership


@dataclass(frozen=True)
class IssuedKey:
    """A freshly issued key: the token is only ever available here, once."""

    key: ApiKey
    token: str


def api_key_issue(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    expires_at: dt.datetime | None = None,
    actor: User | None = None,
) -> IssuedKey:
    """Issue a key for a tenant and return its token, which is not stored."""
    scopes = list(scopes) if scopes is not None else [Scope.INFERENCE, Scope.MODELS_READ]
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown:
        raise ValidationError({"scopes": f"unknown scopes: {', '.join(unknown)}"})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "expiry must be in the future"})
    public_id, token = token_generate()
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            public_id=public_id,
            secret_hash=token_hash(token),
            scopes=scopes,
            expires_at=expires_at,
            created_by=actor if actor and actor.pk else None,
        )
        audit_record(
            action="api_key.issue",
            target_type="api_key",
            target_id=public_id,
            tenant=tenant,
            actor=actor,
            data={"name": name, "scopes": scopes},
        )
    return IssuedKey(key=key, token=token)


def api_key_rotate(
    *, key: ApiKey, overlap: dt.timedelta = dt.timedelta(hours=24), actor: User | None = None
) -> IssuedKey:
    """Issue a successor with the same name and scopes; the old key expires after the overlap.

    Clients switch to the new token while the old one still works; after the overlap the
    old key is refused like any expired key.
    """
    if overlap < dt.timedelta(0):
        raise ValidationError({"overlap": "the overlap cannot be negative"})
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=key.pk)
        if key.revoked_at is not None:
            raise ValidationError({"key": "a revoked key cannot be rotated; issue a new one"})
        ends = timezone.now() + overlap
        successor = api_key_issue(
            tenant=key.tenant,
            name=key.name,
            scopes=list(key.scopes),
            # A key that expires after the overlap passes its own expiry on to the successor.
            expires_at=key.expires_at if key.expires_at and key.expires_at > ends else None,
            actor=actor,
        )
        if key.expires_at is None or key.expires_at > ends:
            key.expires_at = ends
            key.save(update_fields=["expires_at"])
        audit_record(
            action="api_key.rotate",
            target_type="api_key",
            target_id=key.public_id,
            tenant=key.tenant,
            actor=actor,
            after={"successor": successor.key.public_id, "old_key_expires_at": ends.isoformat()},
        )
    return successor


def api_key_revoke(*, key: ApiKey, actor: User | None = None) -> ApiKey:
    """Revoke a key everywhere within seconds; revoking twice is a no-op."""
    from inference.auth import key_revocation_publish

    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=key.pk)
        if key.revoked_at is None:
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])
            audit_record(
                action="api_key.revoke",
                target_type="api_key",
                target_id=key.public_id,
                tenant=key.tenant,
                actor=actor,
            )
            public_id = key.public_id
            transaction.on_commit(lambda: key_revocation_publish(public_id=public_id))
    return key


QUOTA_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrency",
    "max_tokens_per_request",
    "max_context_tokens",
    "monthly_budget",
    "priority_weight",
    "max_request_seconds",
    "response_cache_seconds",
    "response_cache_bill_percent",
)


def quota_update(*, tenant: Tenant, changes: dict[str, Any], actor: User | None = None) -> Quota:
    """Change a tenant's quota; every change is an audit event with the old and new values.

    Frontends pick the new limits up within their key cache time (a few seconds).
    """
    unknown = sorted(set(changes) - set(QUOTA_FIELDS))
    if unknown:
        raise ValidationError({name: "not a quota field" for name in unknown})
    with transaction.atomic():
        quota = Quota.objects.select_for_update().get(tenant=tenant)
        diff = {
            name: {"from": str(getattr(quota, name)), "to": str(value)}
            for name, value in changes.items()
            if getattr(quota, name) != value
        }
        if not diff:
            return quota
        for name, value in changes.items():
            setattr(quota, name, value)
        quota.full_clean()
        quota.save()
        audit_record(
            action="quota.update",
            target_type="tenant",
            target_id=tenant.slug,
            tenant=tenant,
            actor=actor,
            data=diff,
        )
    return quota
