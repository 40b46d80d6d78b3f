from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from billing.models import Adjustment, Invoice, InvoiceLine, PriceBook, UsageRecord
from tenants.admin import ReadOnlyAdmin


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "request_id",
        "tenant",
        "model_version",
        "status",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "cost",
        "finished_at",
    ]
    list_filter = ["status", "tenant"]


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = readonly_fields = ("description", "priority", "requests", "prompt_tokens",
                                "cached_tokens", "completion_tokens", "cached_amount",
                                "amount")  # fmt: skip

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    """Invoices are built, issued and settled by the billing services; here they are read."""

    list_display = ["__str__", "tenant", "period_start", "state", "total", "issued_at"]
    list_filter = ["state", "period_start"]
    readonly_fields = [f.name for f in Invoice._meta.fields]
    inlines = [InvoiceLineInline]


@admin.register(PriceBook)
class PriceBookAdmin(admin.ModelAdmin):
    list_display = ["model_version", "input_per_1k", "cached_input_per_1k", "output_per_1k",
                    "batch_discount_pct", "effective_from"]  # fmt: skip
    readonly_fields = [f.name for f in PriceBook._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # through the finance API: audited, validated, never back-dated silently

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Adjustment)
class AdjustmentAdmin(admin.ModelAdmin):
    list_display = ["tenant", "amount", "reason", "invoice", "created_at"]
    readonly_fields = [f.name for f in Adjustment._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
