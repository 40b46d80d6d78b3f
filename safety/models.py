"""Safety policy packs, which tenant (and alias) uses which, and the interventions they made."""

from __future__ import annotations

from django.db import models

from safety.validators import (
    deny_patterns_validate,
    deny_terms_validate,
    pii_kinds_validate,
    policy_name_validate,
    toxicity_threshold_validate,
)
from tenants.models import Tenant


class PiiAction(models.TextChoices):
    REDACT = "redact"
    BLOCK = "block"


class PolicyPack(models.Model):
    """A set of checks: toxicity, PII and a deny list, on input, output or both."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    # Probability above which a sentence counts as toxic; blank turns toxicity checks off.
    toxicity_threshold = models.FloatField(
        null=True, blank=True, validators=[toxicity_threshold_validate]
    )
    pii_kinds = models.JSONField(default=list, blank=True, validators=[pii_kinds_validate])
    pii_action = models.CharField(max_length=8, choices=PiiAction.choices, default=PiiAction.REDACT)
    deny_terms = models.JSONField(default=list, blank=True, validators=[deny_terms_validate])
    deny_patterns = models.JSONField(default=list, blank=True, validators=[deny_patterns_validate])
    apply_to_input = models.BooleanField(default=True)
    apply_to_output = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(toxicity_threshold__isnull=True)
                | models.Q(toxicity_threshold__gt=0, toxicity_threshold__lte=1),
                name="policy_pack_toxicity_threshold_range",
            )
        ]

    def __str__(self) -> str:
        return self.name


class PolicyAssignment(models.Model):
    """The pack a tenant's requests use; one for an alias overrides the tenant's default."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="policy_assignments")
    # An alias or a model name: the pack covers that model, or the models the alias routes
    # to, by whatever name a request reaches them. Blank: every model no name's pack covers.
    alias = models.CharField(
        max_length=100, blank=True, default="", validators=[policy_name_validate]
    )
    pack = models.ForeignKey(PolicyPack, on_delete=models.PROTECT, related_name="assignments")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "alias"], name="policy_assignment_unique")
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.alias or '(default)'} -> {self.pack}"


class Stage(models.TextChoices):
    INPUT = "input"
    OUTPUT = "output"


class InterventionAction(models.TextChoices):
    BLOCK = "block"
    REDACT = "redact"
    STOP = "stop"


class Intervention(models.Model):
    """One finding a policy acted on: which detector, what it did, in which request.

    Never the text: a tenant that retains content finds it by the request id, encrypted, in
    the privacy app's store (and gone with it when it expires).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="interventions")
    request_id = models.CharField(max_length=64)
    stage = models.CharField(max_length=8, choices=Stage.choices)
    detector = models.CharField(max_length=32)
    action = models.CharField(max_length=8, choices=InterventionAction.choices)
    kind = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="intervention_tenant_time"),
            models.Index(fields=["request_id"], name="intervention_request"),
        ]

    def __str__(self) -> str:
        return f"{self.stage} {self.action} by {self.detector}:{self.kind} in {self.request_id}"
