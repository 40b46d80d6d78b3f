"""Read-only queries over tenants and keys; every one takes the tenant explicitly."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import QuerySet

from tenants.models import ApiKey, Tenant


def tenant_get(*, slug: str) -> Tenant:
    """Return a tenant by slug (raises Tenant.DoesNotExist)."""
    return Tenant.objects.get(slug=slug)


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    """Return a tenant's keys, newest first."""
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at")


def api_key_get(*, tenant: Tenant, public_id: str) -> ApiKey:
    """Return one of a tenant's keys; a foreign key is DoesNotExist, like a missing one."""
    return ApiKey.objects.get(tenant=tenant, public_id=public_id)


def tenants_by_slug(*, slugs: Sequence[str]) -> tuple[list[Tenant], list[str]]:
    """Return the tenants named by slug (each once, in the order named) and the missing slugs."""
    # No slug holds a NUL, and PostgreSQL cannot compare text that does.
    asked = [slug for slug in slugs if "\x00" not in slug]
    found = {t.slug: t for t in Tenant.objects.filter(slug__in=asked)}
    missing = [slug for slug in slugs if slug not in found]
    return [found[slug] for slug in dict.fromkeys(slugs) if slug in found], missing
