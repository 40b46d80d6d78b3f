from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from models_registry.models import Alias, Deployment, Model, ModelVersion


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "task", "owner", "limited", "created_at"]
    # Who may call it changes through the audited services (console, CLI, API), which
    # refuse an owner that would route a tenant where it may not go.
    readonly_fields = ["owner", "limited"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model", "max_model_len", "price_input_per_1k", "created_at"]
    readonly_fields = [f.name for f in ModelVersion._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Alias)
class AliasAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "fallback", "updated_at"]
    # Set through the API, which refuses loops and fallbacks of another kind of model.
    readonly_fields = ["fallback"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "state", "max_num_seqs", "last_heartbeat_at"]
