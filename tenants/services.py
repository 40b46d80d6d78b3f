"""Services that change tenants, members, keys, quotas and the audit trail."""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from dataplane.changes import KEYS, change_publish
from dataplane.tenancy import key_revocation_publish

# The audit chain lives in tenants.audit; audit_record and GENESIS_HASH are re-exported here.
from tenants.audit import GENESIS_HASH as GENESIS_HASH
from tenants.audit import audit_record as audit_record
from tenants.keys import token_generate, token_hash
from tenants.models import ApiKey, Membership, Quota, Role, Scope, Tenant
from tenants.signals import TenantDeletion, retention_shortened, tenant_deleted, tenant_deleting

# A key lives at most ten years, and a rotated key overlaps its successor at most 30 days:
# longer is never needed, and past year 9999 a date cannot even be stored.
MAX_KEY_DAYS = 3650
MAX_ROTATION_OVERLAP_HOURS = 720


def tenant_create(*, slug: str, name: str = "", actor: User | None = None) -> Tenant:
    """Create a tenant with the default quota."""
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise ValidationError({"slug": f"tenant {slug!r} already exists"})
        tenant = Tenant.objects.create(slug=slug, name=name or slug)
        Quota.objects.create(tenant=tenant, **settings.ROUNDHOUSE_DEFAULT_QUOTA)
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


# The most model names one key may be narrowed to; a model or alias name's longest form.
MAX_KEY_MODELS = 100
_MODEL_NAME = re.compile(r"[-a-zA-Z0-9_]{1,100}")


def key_models_clean(models: list[str] | None) -> list[str]:
    """Return the model names a key is narrowed to, sorted and once each, or refuse them.

    Each is an alias or a model's name as clients call it (a model covers its pinned
    versions, so no `@version`). None or empty: the key is not narrowed.
    """
    if models is None:
        return []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ValidationError({"allowed_models": "a list of model or alias names"})
    bad = [m for m in models if not _MODEL_NAME.fullmatch(m)]
    if bad:
        raise ValidationError(
            {
                "allowed_models": f"{bad[0][:120]!r} is not a model or alias name (letters, "
                "digits, '-' and '_', at most 100; a model's name covers its versions)"
            }
        )
    names = sorted(set(models))
    if len(names) > MAX_KEY_MODELS:
        raise ValidationError(
            {"allowed_models": f"a key is narrowed to at most {MAX_KEY_MODELS} names"}
        )
    return names


def api_key_issue(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    expires_at: dt.datetime | None = None,
    allowed_models: list[str] | None = None,
    actor: User | None = None,
) -> IssuedKey:
    """Issue a key for a tenant and return its token, which is not stored.

    `allowed_models` narrows the key to those names among what its tenant may call.
    """
    scopes = list(scopes) if scopes is not None else [Scope.INFERENCE, Scope.MODELS_READ]
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown:
        raise ValidationError({"scopes": f"unknown scopes: {', '.join(unknown)}"})
    allowed_models = key_models_clean(allowed_models)
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "expiry must be in the future"})
    if expires_at is not None and expires_at > timezone.now() + dt.timedelta(days=MAX_KEY_DAYS):
        raise ValidationError({"expires_at": f"a key expires within {MAX_KEY_DAYS} days"})
    public_id, token = token_generate()
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            public_id=public_id,
            secret_hash=token_hash(token),
            scopes=scopes,
            allowed_models=allowed_models,
            expires_at=expires_at,
            created_by=actor if actor and actor.pk else None,
        )
        data: dict[str, Any] = {"name": name, "scopes": scopes}
        if allowed_models:
            data["allowed_models"] = allowed_models
        audit_record(
            action="api_key.issue",
            target_type="api_key",
            target_id=public_id,
            tenant=tenant,
            actor=actor,
            data=data,
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
    if overlap > dt.timedelta(hours=MAX_ROTATION_OVERLAP_HOURS):
        raise ValidationError(
            {"overlap": f"the overlap is at most {MAX_ROTATION_OVERLAP_HOURS} hours"}
        )
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=key.pk)
        if key.revoked_at is not None:
            raise ValidationError({"key": "a revoked key cannot be rotated; issue a new one"})
        ends = timezone.now() + overlap
        successor = api_key_issue(
            tenant=key.tenant,
            name=key.name,
            scopes=list(key.scopes),
            allowed_models=list(key.allowed_models),
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


def api_key_models_set(*, key: ApiKey, models: list[str], actor: User | None = None) -> ApiKey:
    """Narrow a key to model names (empty: every model its tenant may call); audited.

    Every frontend forgets the key at once, as it does a revoked one, so a narrowing holds
    for its next request.
    """
    names = key_models_clean(models)
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().select_related("tenant").get(pk=key.pk)
        if key.revoked_at is not None:
            raise ValidationError({"key": "a revoked key calls nothing; issue a new one"})
        before = list(key.allowed_models)
        if before == names:
            return key
        key.allowed_models = names
        key.save(update_fields=["allowed_models"])
        audit_record(
            action="api_key.models",
            target_type="api_key",
            target_id=key.public_id,
            tenant=key.tenant,
            actor=actor,
            before={"allowed_models": before},
            after={"allowed_models": names},
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
    "large_body_bytes_per_minute",
    "output_capping",
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


PRIVACY_FIELDS = ("retention_days", "no_training")


def tenant_privacy_update(
    *,
    tenant: Tenant,
    retention_days: int | None = None,
    no_training: bool | None = None,
    actor: User | None = None,
) -> Tenant:
    """Change how long a tenant's text is kept and whether it may train models (audited).

    None leaves a setting as it is. A shorter retention period applies to text already kept.
    Frontends pick the new period up within their key cache time (a few seconds).
    """
    changes: dict[str, Any] = {
        name: value
        for name, value in (("retention_days", retention_days), ("no_training", no_training))
        if value is not None
    }
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if tenant.deleted_at is not None:
            raise ValidationError({"tenant": f"tenant {tenant.slug!r} is deleted"})
        diff = {
            name: {"from": getattr(tenant, name), "to": value}
            for name, value in changes.items()
            if getattr(tenant, name) != value
        }
        if not diff:
            return tenant
        for name, value in changes.items():
            setattr(tenant, name, value)
        tenant.full_clean()
        tenant.save(update_fields=list(diff))
        retention = diff.get("retention_days")
        if retention and retention["to"] < retention["from"]:
            retention_shortened.send(
                sender=Tenant, tenant=tenant, retention_days=tenant.retention_days
            )
        audit_record(
            action="tenant.privacy_update",
            target_type="tenant",
            target_id=tenant.slug,
            tenant=tenant,
            actor=actor,
            data=diff,
        )
    return tenant


# Stored in place of a deleted tenant's key hash: not hex, so no token's SHA-256 matches it.
# Matches no SHA-256 hex digest, on purpose.
SCRUBBED_SECRET_HASH = "!deleted"  # nosec B105


@dataclass(frozen=True)
class DeletionSummary:
    """What tenant_delete removed, and the keys it kept (revoked, scrubbed) for billing."""

    tenant: str
    retained_texts_deleted: int
    memberships_deleted: int
    batches_deleted: int
    files_deleted: int
    keys_deleted: int
    keys_scrubbed: int

    def __str__(self) -> str:
        return (
            f"deleted tenant {self.tenant}: {self.retained_texts_deleted} retained texts, "
            f"{self.memberships_deleted} memberships, {self.batches_deleted} batches, "
            f"{self.files_deleted} files and {self.keys_deleted} API keys removed; "
            f"{self.keys_scrubbed} keys with usage revoked and scrubbed; usage records and "
            "invoices kept"
        )


def tenant_delete(*, tenant: Tenant, actor: User | None = None) -> DeletionSummary:
    """Delete a tenant's content, people and keys, keeping what finance needs.

    Retained text, batches and files (the tenant's own text), memberships and unused keys go.
    Keys that usage records name are revoked and scrubbed (no hash, scopes, creator or name) so
    invoices still resolve their public ids. Usage records, invoices, adjustments, budget
    alerts, the quota and the audit trail stay; the tenant row stays, deactivated and marked
    deleted. Deleting a deleted tenant is a ValidationError.
    """
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if tenant.deleted_at is not None:
            when = f"{tenant.deleted_at:%Y-%m-%d %H:%M} UTC"
            raise ValidationError({"tenant": f"tenant {tenant.slug!r} was deleted on {when}"})
        memberships, _ = Membership.objects.filter(tenant=tenant).delete()
        keys = list(ApiKey.objects.select_for_update().filter(tenant=tenant))
        # Retained text, batches and files go; billing names the keys its records keep.
        deletion = TenantDeletion(tenant=tenant, keys=keys)
        tenant_deleting.send(sender=Tenant, deletion=deletion)
        billed = deletion.keys_kept
        now = timezone.now()
        ApiKey.objects.filter(pk__in=[k.pk for k in keys if k.pk not in billed]).delete()
        ApiKey.objects.filter(pk__in=billed).update(
            name="deleted key",
            secret_hash=SCRUBBED_SECRET_HASH,
            scopes=[],
            created_by=None,
            revoked_at=Coalesce(F("revoked_at"), Value(now)),
        )
        change_publish(KEYS)
        tenant.is_active = False
        tenant.deleted_at = now
        tenant.save(update_fields=["is_active", "deleted_at"])
        summary = DeletionSummary(
            tenant=tenant.slug,
            retained_texts_deleted=deletion.retained_texts_deleted,
            memberships_deleted=memberships,
            batches_deleted=deletion.batches_deleted,
            files_deleted=deletion.files_deleted,
            keys_deleted=len(keys) - len(billed),
            keys_scrubbed=len(billed),
        )
        audit_record(
            action="tenant.delete",
            target_type="tenant",
            target_id=tenant.slug,
            tenant=tenant,
            actor=actor,
            after={
                "retained_texts_deleted": deletion.retained_texts_deleted,
                "memberships_deleted": memberships,
                "batches_deleted": deletion.batches_deleted,
                "files_deleted": deletion.files_deleted,
                "keys_deleted": sorted(k.public_id for k in keys if k.pk not in billed),
                "keys_scrubbed": sorted(k.public_id for k in keys if k.pk in billed),
            },
        )
        # Every key, deleted ones too: a frontend's cache could still admit them until its TTL.
        transaction.on_commit(
            functools.partial(
                tenant_deleted.send,
                sender=Tenant,
                tenant_id=tenant.pk,
                slug=tenant.slug,
                key_public_ids=[k.public_id for k in keys],
            )
        )
    return summary
