"""Read-only queries over safety policies: which pack a tenant's request runs under."""

from __future__ import annotations

from django.db.models import Q

from safety.models import PolicyAssignment
from safety.policy import Policy, policy_compile


def policy_load(*, tenant_id: int, alias: str) -> Policy | None:
    """Return the compiled policy for a tenant's request to a model name, or None.

    An assignment for the alias wins over the tenant's default (blank alias). One query.
    """
    assignments = (
        PolicyAssignment.objects.filter(Q(alias=alias) | Q(alias=""), tenant_id=tenant_id)
        .select_related("pack")
        .order_by("-alias")  # the alias's own ("x" > "") first
    )
    chosen = assignments.first()
    return policy_compile(chosen.pack) if chosen is not None else None
