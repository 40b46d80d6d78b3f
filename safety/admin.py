from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest

from safety.models import Intervention, PolicyAssignment, PolicyPack
from safety.services import (
    policy_assign,
    policy_pack_delete,
    policy_pack_save,
    policy_unassign,
)
from tenants.admin import ReadOnlyAdmin


def _actor(request: HttpRequest) -> User | None:
    return request.user if isinstance(request.user, User) else None


@admin.register(PolicyPack)
class PolicyPackAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "toxicity_threshold",
        "pii_action",
        "apply_to_input",
        "apply_to_output",
        "updated_at",
    ]

    def save_model(self, request: HttpRequest, obj: PolicyPack, form: Any, change: bool) -> None:
        # Through the service, so every change is audited; the form already validated it.
        saved = policy_pack_save(
            pack=obj if change else None,
            name=obj.name,
            description=obj.description,
            toxicity_threshold=obj.toxicity_threshold,
            pii_kinds=obj.pii_kinds,
            pii_action=obj.pii_action,
            deny_terms=obj.deny_terms,
            deny_patterns=obj.deny_patterns,
            apply_to_input=obj.apply_to_input,
            apply_to_output=obj.apply_to_output,
            actor=_actor(request),
        )
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: PolicyPack) -> None:
        policy_pack_delete(pack=obj, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[PolicyPack]) -> None:
        for pack in queryset:
            policy_pack_delete(pack=pack, actor=_actor(request))


@admin.register(PolicyAssignment)
class PolicyAssignmentAdmin(admin.ModelAdmin):
    list_display = ["tenant", "alias", "pack", "updated_at"]
    list_filter = ["pack"]

    def save_model(
        self, request: HttpRequest, obj: PolicyAssignment, form: Any, change: bool
    ) -> None:
        if change and {"tenant", "alias"} & set(form.changed_data):
            # Moving an assignment is removing the old one and making a new one.
            old = PolicyAssignment.objects.select_related("tenant").get(pk=obj.pk)
            policy_unassign(tenant=old.tenant, alias=old.alias, actor=_actor(request))
        saved = policy_assign(
            tenant=obj.tenant, pack=obj.pack, alias=obj.alias, actor=_actor(request)
        )
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: PolicyAssignment) -> None:
        policy_unassign(tenant=obj.tenant, alias=obj.alias, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[PolicyAssignment]) -> None:
        for assignment in queryset.select_related("tenant"):
            policy_unassign(tenant=assignment.tenant, alias=assignment.alias, actor=_actor(request))


INTERVENTION_FIELDS = (
    "created_at",
    "tenant",
    "request_id",
    "stage",
    "detector",
    "kind",
    "action",
)


@admin.register(Intervention)
class InterventionAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "tenant", "request_id", "stage", "detector", "kind", "action"]
    list_filter = ["stage", "action", "detector"]
    search_fields = ["request_id"]
    # Read-only: a record of what happened to a request.
    fields = INTERVENTION_FIELDS
    readonly_fields = INTERVENTION_FIELDS
