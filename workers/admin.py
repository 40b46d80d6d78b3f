from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from workers.models import ThroughputPoint


@admin.register(ThroughputPoint)
class ThroughputPointAdmin(admin.ModelAdmin):
    """Curves are written by capacity_measure; here they are read."""

    list_display = [
        "deployment",
        "measured_at",
        "run",
        "concurrency",
        "workers",
        "requests_per_second",
        "output_tokens_per_second",
        "total_tokens_per_second",
        "ttft_p95_seconds",
        "itl_p95_seconds",
        "errors",
    ]
    list_filter = ["deployment"]
    list_select_related = ["deployment"]
    search_fields = ["run", "deployment__name", "version_digest"]
    readonly_fields = [f.name for f in ThroughputPoint._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
