from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from privacy.models import RetainedContent


@admin.register(RetainedContent)
class RetainedContentAdmin(admin.ModelAdmin):
    list_display = ["request_id", "tenant", "created_at", "expires_at"]
    list_filter = ["tenant"]
    search_fields = ["request_id"]
    # Which requests are kept and until when; never the text, sealed or not.
    fields = ("request_id", "tenant", "created_at", "expires_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
