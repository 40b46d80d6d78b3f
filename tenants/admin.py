from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenants.models import ApiKey, AuditEvent, Membership, Quota, Tenant


class QuotaInline(admin.StackedInline):
    model = Quota


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    inlines = [QuotaInline, MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["public_id", "name", "tenant", "created_at", "expires_at", "revoked_at"]
    list_filter = ["tenant"]
    # Keys are issued by the service (which shows the token once), never typed in here.
    readonly_fields = ["public_id", "secret_hash", "created_at", "created_by"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["id", "created_at", "action", "target_type", "target_id", "tenant", "actor"]
    list_filter = ["action"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
