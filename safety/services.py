"""Services that change safety packs and assignments, and record interventions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from safety.detectors import Finding
from safety.metrics import interventions_counted
from safety.models import (
    Intervention,
    InterventionAction,
    PiiAction,
    PolicyAssignment,
    PolicyPack,
    Stage,
)
from safety.validators import policy_name_validate
from tenants.models import Tenant
from tenants.services import audit_record

PACK_FIELDS = (
    "name",
    "description",
    "toxicity_threshold",
    "pii_kinds",
    "pii_action",
    "deny_terms",
    "deny_patterns",
    "apply_to_input",
    "apply_to_output",
)


def _pack_state(pack: PolicyPack) -> dict[str, Any]:
    return {name: getattr(pack, name) for name in PACK_FIELDS}


def policy_pack_save(
    *,
    name: str,
    description: str = "",
    toxicity_threshold: float | None = None,
    pii_kinds: Sequence[str] = (),
    pii_action: str = PiiAction.REDACT,
    deny_terms: Sequence[str] = (),
    deny_patterns: Sequence[str] = (),
    apply_to_input: bool = True,
    apply_to_output: bool = True,
    pack: PolicyPack | None = None,
    actor: User | None = None,
    reason: str = "",
) -> PolicyPack:
    """Create a pack, or change `pack` (else the pack named `name`) to these settings.

    Raises ValidationError naming the field (a deny pattern that does not compile, a threshold
    outside (0, 1], an unknown PII kind). Frontends pick changes up within their policy cache.
    """
    with transaction.atomic():
        if pack is not None:
            current: PolicyPack | None = PolicyPack.objects.select_for_update().get(pk=pack.pk)
        else:
            current = PolicyPack.objects.select_for_update().filter(name=name).first()
        saved = current or PolicyPack()
        before = _pack_state(saved) if current is not None else None
        saved.name = name
        saved.description = description
        saved.toxicity_threshold = toxicity_threshold
        saved.pii_kinds = list(pii_kinds)
        saved.pii_action = pii_action
        saved.deny_terms = list(deny_terms)
        saved.deny_patterns = list(deny_patterns)
        saved.apply_to_input = apply_to_input
        saved.apply_to_output = apply_to_output
        saved.full_clean()
        after = _pack_state(saved)
        if after == before:
            return saved
        saved.save()
        audit_record(
            action="policy_pack.save",
            target_type="policy_pack",
            target_id=name,
            actor=actor,
            reason=reason,
            before=before,
            after=after,
        )
    return saved


def policy_pack_delete(*, pack: PolicyPack, actor: User | None = None, reason: str = "") -> None:
    """Delete a pack no tenant uses."""
    with transaction.atomic():
        pack = PolicyPack.objects.select_for_update().get(pk=pack.pk)
        users = sorted({a.tenant.slug for a in pack.assignments.select_related("tenant")})
        if users:
            raise ValidationError({"pack": f"{pack.name} is assigned to {', '.join(users)}"})
        before = _pack_state(pack)
        pack.delete()
        audit_record(
            action="policy_pack.delete",
            target_type="policy_pack",
            target_id=before["name"],
            actor=actor,
            reason=reason,
            before=before,
        )


def _alias_clean(alias: str) -> str:
    alias = alias.strip()
    if len(alias) > PolicyAssignment._meta.get_field("alias").max_length:  # type: ignore[operator]
        raise ValidationError({"alias": "at most 100 characters"})
    return alias


def _covered_check(alias: str) -> None:
    """Refuse an assignment to a name that covers no model (safety.validators)."""
    try:
        policy_name_validate(alias)
    except ValidationError as exc:
        raise ValidationError({"alias": exc.messages}) from None


def _assignment_locked(*, tenant: Tenant, alias: str) -> PolicyAssignment | None:
    """Return a tenant's assignment for an alias, locked for the transaction, or None."""
    return (
        PolicyAssignment.objects.select_for_update()
        .select_related("pack")
        .filter(tenant=tenant, alias=alias)
        .first()
    )


def policy_assign(
    *,
    tenant: Tenant,
    pack: PolicyPack,
    alias: str = "",
    actor: User | None = None,
    reason: str = "",
) -> PolicyAssignment:
    """Make a tenant's requests (to `alias`, or by default) use a pack.

    `alias` names an alias or a model; the pack then covers that model (an alias: the models
    it routes to) whatever name a request reaches it by (safety.selectors.policy_load).
    """
    alias = _alias_clean(alias)
    _covered_check(alias)
    with transaction.atomic():
        current = _assignment_locked(tenant=tenant, alias=alias)
        if current is not None and current.pack_id == pack.pk:
            return current
        assignment, _ = PolicyAssignment.objects.update_or_create(
            tenant=tenant, alias=alias, defaults={"pack": pack}
        )
        audit_record(
            action="policy.assign",
            target_type="tenant",
            target_id=tenant.slug,
            tenant=tenant,
            actor=actor,
            reason=reason,
            data={"alias": alias, "pack": pack.name},
            before={"pack": current.pack.name} if current is not None else None,
            after={"pack": pack.name},
        )
    return assignment


def policy_unassign(
    *, tenant: Tenant, alias: str = "", actor: User | None = None, reason: str = ""
) -> None:
    """Remove a tenant's pack for `alias` (or its default); removing none is a no-op."""
    alias = _alias_clean(alias)
    with transaction.atomic():
        current = _assignment_locked(tenant=tenant, alias=alias)
        if current is None:
            return
        current.delete()
        audit_record(
            action="policy.unassign",
            target_type="tenant",
            target_id=tenant.slug,
            tenant=tenant,
            actor=actor,
            reason=reason,
            data={"alias": alias, "pack": current.pack.name},
            before={"pack": current.pack.name},
        )


def interventions_record(
    *,
    tenant_id: int,
    request_id: str,
    stage: str,
    findings: Sequence[Finding],
    action: str,
) -> None:
    """Record what a policy did to a request, one row per finding, and count it.

    No text is stored: only which detector found what kind, and what was done.
    """
    if stage not in Stage.values:
        raise ValueError(f"unknown stage {stage!r}")
    if action not in InterventionAction.values:
        raise ValueError(f"unknown action {action!r}")
    if not findings:
        return
    Intervention.objects.bulk_create(
        Intervention(
            tenant_id=tenant_id,
            request_id=request_id,
            stage=stage,
            detector=f.detector,
            action=action,
            kind=f.kind,
        )
        for f in findings
    )
    for detector, count in Counter(f.detector for f in findings).items():
        interventions_counted(stage=stage, detector=detector, action=action, count=count)
