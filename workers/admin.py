from __future__ import annotations

from django.contrib import admin

from tenants.admin import ReadOnlyAdmin
from workers.models import ThroughputPoint


@admin.register(ThroughputPoint)
class ThroughputPointAdmin(ReadOnlyAdmin):
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
