from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.http import HttpRequest

from tenants.models import ApiKey, AuditEvent, Membership, Quota, Tenant
from tenants.services import PRIVACY_FIELDS, QUOTA_FIELDS, quota_update, tenant_privacy_update


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin page that shows records and lets nobody add, change or delete them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class QuotaInline(admin.StackedInline):
    model = Quota
    # Edited on the Quota page, where every change goes through the audited service.
    readonly_fields = list(QUOTA_FIELDS)
    can_delete = False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "is_active",
        "retention_days",
        "no_training",
        "deleted_at",
        "created_at",
    ]
    list_filter = ["is_active", "no_training"]
    readonly_fields = ["deleted_at"]
    inlines = [QuotaInline, MembershipInline]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # `manage.py tenant_delete` deletes a tenant: usage and invoices must keep their row.
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A deleted tenant stays deleted: reactivating it would bring back a tenant without
        # keys, members or text, and its privacy settings can no longer change.
        if obj is not None and obj.deleted_at is not None:
            return False
        return super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        privacy = {name: getattr(obj, name) for name in form.changed_data if name in PRIVACY_FIELDS}
        if not change or not privacy:
            super().save_model(request, obj, form, change)
            return
        others = [name for name in form.changed_data if name not in PRIVACY_FIELDS]
        if others:
            obj.save(update_fields=others)
        # Through the service, so the change is validated and audited like any other.
        user = request.user if isinstance(request.user, User) else None
        tenant_privacy_update(tenant=obj, actor=user, **privacy)


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrency",
        "monthly_budget",
        "updated_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a quota is created with its tenant

    def save_model(self, request: HttpRequest, obj: Quota, form: Any, change: bool) -> None:
        # Through the service, so the change is validated and audited like any other.
        changes = {name: getattr(obj, name) for name in form.changed_data if name in QUOTA_FIELDS}
        user = request.user if isinstance(request.user, User) else None
        quota_update(tenant=obj.tenant, changes=changes, actor=user)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["public_id", "name", "tenant", "created_at", "expires_at", "revoked_at"]
    list_filter = ["tenant"]
    # Keys are issued by the service (which shows the token once), never typed in here.
    # Narrowed through its service (audited, applied on every frontend at once).
    readonly_fields = ["public_id", "secret_hash", "allowed_models", "created_at", "created_by"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


AUDIT_EVENT_FIELDS = (
    "created_at",
    "action",
    "target_type",
    "target_id",
    "tenant",
    "actor",
    "reason",
    "data",
    "before",
    "after",
    "prev_hash",
    "hash",
)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "created_at",
        "action",
        "target_type",
        "target_id",
        "tenant",
        "actor",
        "reason",
    ]
    list_filter = ["action"]
    # Read-only: the database refuses changes anyway; this page only shows what was recorded.
    fields = AUDIT_EVENT_FIELDS
    readonly_fields = AUDIT_EVENT_FIELDS
