"""Tenants, their people, their API keys, their quotas, and the audit trail."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models
from django.utils import timezone

from tenants.keys import PREFIX


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Prompt and completion text is kept only when a tenant asks for it: 0 stores none. At most
    # ten years, so an expiry date always fits a datetime.
    retention_days = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(3650)])
    # Opt-in, not opt-out: a tenant's data is not used for training unless it says so, because
    # the safe default for text we did not ask permission for is not to use it.
    no_training = models.BooleanField(default=True)
    # Set by tenant_delete; the row stays because usage records and invoices point at it.
    deleted_at = models.DateTimeField(null=True, blank=True)

    @property
    def training_use(self) -> str:
        """What exports print about training on this tenant's data."""
        return "not permitted" if self.no_training else "permitted"

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    ADMIN = "admin"
    MEMBER = "member"
    FINANCE = "finance"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class Scope(models.TextChoices):
    INFERENCE = "inference"
    MODELS_READ = "models:read"


class ApiKey(models.Model):
    """A tenant's API key; only its public id and the SHA-256 of the whole token are stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    public_id = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    # The model names (aliases or models; a model covers its pinned versions) the key may
    # call, among those its tenant may: empty, every one of them (docs/model-access.md).
    allowed_models = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    @property
    def status(self) -> str:
        """active, expired or revoked: what the API does with the key now."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "expired"
        return "active"

    def __str__(self) -> str:
        return f"{PREFIX}{self.public_id}… ({self.name})"


class Quota(models.Model):
    """What a tenant bought; admission enforces it."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    requests_per_minute = models.PositiveIntegerField()
    tokens_per_minute = models.PositiveIntegerField()
    max_concurrency = models.PositiveIntegerField()
    max_tokens_per_request = models.PositiveIntegerField()
    max_context_tokens = models.PositiveIntegerField()
    monthly_budget = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"))
    priority_weight = models.PositiveIntegerField(default=1)
    # The longest a request may take, end to end; a client's x-request-timeout can only shorten it.
    max_request_seconds = models.PositiveIntegerField(default=600)
    # Response cache (opt-in): how long a deterministic request's answer is reused for this
    # tenant's identical requests (0: off), and what share of the full price a reuse bills.
    response_cache_seconds = models.PositiveIntegerField(default=0)
    response_cache_bill_percent = models.PositiveSmallIntegerField(
        default=100, validators=[MaxValueValidator(100)]
    )
    # The bytes of request bodies of 1 MiB or more it may send the inference endpoints a
    # minute; unset: the platform's ROUNDHOUSE_LARGE_BODY_BYTES_PER_MINUTE; 0: no limit.
    large_body_bytes_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    # Output capping (opt-in): a request that would finish after its deadline runs with the
    # max_tokens that fits before it, and says so, instead of being cut at the deadline
    # (inference/pipeline/capping.py).
    output_capping = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.tenant}"


class AppendOnlyError(Exception):
    """Raised when code tries to change or delete an append-only record."""


class AuditEvent(models.Model):
    """One change to keys, quotas, prices or deployments; hash-chained and never changed.

    The database refuses UPDATE, DELETE and TRUNCATE on this table (migration 0003); the guards
    below only make the mistake fail early in Python. The chain itself lives in tenants.audit.
    """

    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT)
    # PROTECT, not SET_NULL: the actor is hashed and the row cannot change; deactivate users.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    reason = models.TextField(blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    # Set by audit_record before hashing (not auto_now_add), so the stored value is the hashed one.
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["id"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise AppendOnlyError("audit events are append-only")

    def __str__(self) -> str:
        return f"{self.action} {self.target_type}:{self.target_id}"
