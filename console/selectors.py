"""What the console's pages read: every query of a console page, and nothing that writes.

A tenant page's query takes the tenant, so it cannot read another tenant's rows; operator pages
read across tenants (the views check staff first). Querysets come back unevaluated where a page
paginates them.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.selectors import month_start
from inference.models import Conversation, StoredResponse
from models_registry.models import (
    Alias,
    AliasSplit,
    Deployment,
    ModelVersion,
    Rollout,
    RolloutDecision,
)
from tenants.models import AuditEvent, Membership, Tenant

# --- tenants and who belongs to them ---------------------------------------------------------


def tenant_get(*, slug: str) -> Tenant | None:
    """The tenant with this slug, with its quota, or None."""
    if "\x00" in slug:
        return None  # no slug holds one, and PostgreSQL cannot compare text that does
    return Tenant.objects.filter(slug=slug).select_related("quota").first()


def membership_get(*, tenant: Tenant, user_id: int) -> Membership | None:
    """The user's membership of the tenant, or None."""
    return Membership.objects.filter(tenant=tenant, user_id=user_id).first()


def membership_first(*, user_id: int) -> Membership | None:
    """One of the user's memberships, with its tenant, or None when they belong nowhere."""
    return Membership.objects.filter(user_id=user_id).select_related("tenant").first()


def tenant_list() -> QuerySet[Tenant]:
    """Every tenant with its quota, by slug."""
    return Tenant.objects.select_related("quota").order_by("slug")


def tenant_month_usage(*, tenant_ids: list[int]) -> dict[int, dict[str, Any]]:
    """This month's requests, tokens and cost of each of the tenants that used anything."""
    rows = (
        UsageRecord.objects.filter(
            shadow=False, finished_at__gte=month_start(), tenant_id__in=tenant_ids
        )
        .values("tenant_id")
        .annotate(
            requests=Count("id"),
            tokens=Sum("prompt_tokens") + Sum("completion_tokens"),
            cost=Sum("cost"),
        )
    )
    return {row["tenant_id"]: dict(row) for row in rows}


def audit_event_list(*, action: str = "", target: str = "") -> QuerySet[AuditEvent]:
    """Audit events, newest first: actions starting with `action`, targets holding `target`."""
    events = AuditEvent.objects.select_related("actor", "tenant").order_by("-id")
    if action:
        events = events.filter(action__startswith=action)
    if target:
        events = events.filter(target_id__icontains=target)
    return events


# --- a tenant's requests and invoices --------------------------------------------------------


def usage_record_list(*, tenant: Tenant) -> QuerySet[UsageRecord]:
    """The tenant's requests (not shadow traffic), most recently finished first."""
    return (
        UsageRecord.objects.filter(tenant=tenant, shadow=False)
        .select_related("model_version__model", "api_key")
        .order_by("-finished_at")
    )


def invoice_list(*, tenant: Tenant) -> QuerySet[Invoice]:
    """The tenant's invoices, latest period first."""
    return Invoice.objects.filter(tenant=tenant).order_by("-period_start")


def invoice_get(*, tenant: Tenant, pk: int) -> Invoice | None:
    """The tenant's invoice with this id, or None."""
    return Invoice.objects.filter(tenant=tenant, pk=pk).first()


def invoice_line_list(*, invoice: Invoice) -> QuerySet[InvoiceLine]:
    """The invoice's lines."""
    return invoice.lines.all()


# --- deployments, aliases, rollouts and versions ---------------------------------------------


def deployment_list() -> QuerySet[Deployment]:
    """Every deployment with its version and model, by name."""
    return Deployment.objects.select_related("version__model").order_by("name")


def alias_list() -> QuerySet[Alias]:
    """Every alias with its version and model, by name."""
    return Alias.objects.select_related("version__model").order_by("name")


def alias_get(*, name: str) -> Alias | None:
    """The alias with this name, with its version and model, or None."""
    if "\x00" in name:
        return None  # no name holds one, and PostgreSQL cannot compare text that does
    return Alias.objects.select_related("version__model", "fallback").filter(name=name).first()


def alias_split_list(*, alias: Alias) -> list[AliasSplit]:
    """The alias's traffic splits that name no tenant, with their versions."""
    return list(alias.splits.filter(tenant__isnull=True).select_related("version__model"))


def alias_targeting_list(*, alias: Alias) -> list[dict[str, Any]]:
    """The alias's tenant-targeted splits by tenant, each with the active rollout that holds
    it (None: an operator's split)."""
    active = Rollout.objects.filter(alias=alias, state__in=["running", "paused"], scoped=True)
    held: dict[tuple[int | None, int], Rollout] = {
        (tenant_id, rollout.canary_id): rollout
        for rollout in active.prefetch_related("tenants")
        for tenant_id in (t.pk for t in rollout.tenants.all())
    }
    splits = alias.splits.filter(tenant__isnull=False).select_related("version__model", "tenant")
    return [
        {"split": split, "rollout": held.get((split.tenant_id, split.version_id))}
        for split in splits.order_by("tenant__slug", "id")
    ]


def rollout_shown_list(*, alias: Alias) -> list[Rollout]:
    """The alias's active rollouts, oldest first, or else its most recent one (or none)."""
    rollouts = (
        Rollout.objects.filter(alias=alias)
        .select_related("canary__model", "baseline__model")
        .prefetch_related("tenants")
    )
    active = list(rollouts.filter(state__in=["running", "paused"]).order_by("id"))
    latest = rollouts.order_by("-id").first()
    return active or ([latest] if latest is not None else [])


def rollout_get(*, alias_name: str, pk: int) -> Rollout | None:
    """The rollout with this id of the alias with this name, or None."""
    return Rollout.objects.filter(pk=pk, alias__name=alias_name).first()


def rollout_decision_list(*, rollout: Rollout, limit: int = 20) -> QuerySet[RolloutDecision]:
    """The rollout's latest decisions, newest first."""
    return rollout.decisions.order_by("-id")[:limit]


def version_list() -> QuerySet[ModelVersion]:
    """Every model version with its model and base, newest first."""
    return ModelVersion.objects.select_related("model", "base__model").order_by("-created_at")


# --- stored responses (the Responses API's) ----------------------------------------------------


def stored_response_list(*, tenant: Tenant) -> QuerySet[StoredResponse]:
    """The tenant's stored responses that have not expired, newest first (unevaluated)."""
    return StoredResponse.objects.filter(tenant=tenant, expires_at__gt=timezone.now()).order_by(
        "-created_at", "-id"
    )


# --- conversations (the Conversations API's) --------------------------------------------------


def conversation_list(*, tenant: Tenant) -> QuerySet[Any, Any]:
    """The tenant's conversations that have not expired, the latest changed first: each one's
    id, times and how many items it holds (unevaluated)."""
    return (
        Conversation.objects.filter(tenant=tenant, expires_at__gt=timezone.now())
        .annotate(items_held=Count("items"))
        .order_by("-updated_at", "-id")
        .values("id", "created_at", "updated_at", "items_held")
    )
