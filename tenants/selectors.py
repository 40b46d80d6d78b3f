"""Read-only queries over tenants and keys; every one takes the tenant explicitly."""

from __future__ import annotations

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
