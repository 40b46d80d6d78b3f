"""The management REST API for the registry (staff only): one class per operation.

Rollouts and a version's SLIs have theirs in rollouts.apis, which names versions and aliases
the way this module does (version_named, alias_named).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dataplane.redis_client import redis_sync_client
from dataplane.snapshots import live_workers_sync
from models_registry.models import Alias, Deployment, Model, ModelVersion
from models_registry.selectors import model_access_get, version_pinned
from models_registry.services import (
    alias_fallback_set,
    alias_shadow_set,
    alias_split_set,
    model_grant,
    model_limit_set,
    model_owner_set,
    model_revoke,
)
from tenants.apis import FIELD_ERRORS, NOT_FOUND, REFUSED, drf_validation_error
from tenants.models import Tenant
from tenants.selectors import tenants_by_slug


def version_named(field: str, ref: str) -> ModelVersion:
    """Return the version a body's field names (model@label or model@<id prefix>), else a 400."""
    version = version_pinned(ref) if "@" in ref else None
    if version is None:
        raise serializers.ValidationError(
            {field: f"no version {ref!r}: name one as model@label or model@<8+ id characters>"}
        )
    return version


def tenants_named(field: str, slugs: list[str]) -> list[Tenant]:
    """Return the tenants a body's field names by slug, in its order, else a 400 naming those
    that do not exist."""
    tenants, missing = tenants_by_slug(slugs=slugs)
    if missing:
        raise serializers.ValidationError({field: f"no tenants {missing}"})
    return tenants


TENANTS_HELP = (
    "Slugs of the tenants this targets: only their traffic is split, each tenant's users "
    "sticky as before; empty: every tenant not targeted otherwise."
)


def alias_named(name: str) -> Alias:
    """Return the alias a path names, else a 404."""
    try:
        return Alias.objects.select_related("version__model", "fallback").get(name=name)
    except Alias.DoesNotExist as exc:
        raise Http404(f"no alias {name!r}") from exc


class ShareSerializer(serializers.Serializer[Any]):
    version = serializers.CharField(allow_null=True)
    percent = serializers.FloatField(min_value=0, max_value=100)
    reason = serializers.CharField(required=False, default="", allow_blank=True)


class SplitSerializer(ShareSerializer):
    tenants = serializers.ListField(
        child=serializers.SlugField(max_length=64), default=list, max_length=1000,
        help_text=TENANTS_HELP,
    )  # fmt: skip


class ShareBodySerializer(serializers.Serializer[Any]):
    version = serializers.CharField()
    percent = serializers.FloatField()


class AliasSerializer(serializers.Serializer[Any]):
    """An alias as the API shows it (built by _alias_body)."""

    name = serializers.CharField()
    primary = serializers.CharField()
    splits = ShareBodySerializer(many=True, help_text="Every tenant not in `targets`.")
    targets = serializers.DictField(
        child=ShareBodySerializer(many=True),
        help_text="Tenant slug -> the splits of that tenant's traffic alone.",
    )
    shadow = ShareBodySerializer(allow_null=True)
    fallback = serializers.CharField(allow_null=True)


def _alias_body(alias: Alias) -> dict[str, Any]:
    shadow = getattr(alias, "shadow", None)
    splits = list(alias.splits.select_related("version__model", "tenant"))
    targets: dict[str, list[dict[str, Any]]] = {}
    for split in splits:
        if split.tenant is not None:
            share = {"version": split.version.public_name, "percent": split.percent}
            targets.setdefault(split.tenant.slug, []).append(share)
    return {
        "name": alias.name,
        "primary": alias.version.public_name,
        "splits": [
            {"version": s.version.public_name, "percent": s.percent}
            for s in splits
            if s.tenant is None
        ],
        "targets": targets,
        "shadow": {"version": shadow.version.public_name, "percent": shadow.buckets / 100}
        if shadow
        else None,
        "fallback": alias.fallback.name if alias.fallback is not None else None,
    }


class AliasDetailApi(APIView):
    """GET an alias: its primary version, splits and shadow."""

    @extend_schema(responses={200: AliasSerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, name: str) -> Response:
        return Response(_alias_body(alias_named(name)))


class AliasSplitApi(APIView):
    """PUT a version's share of an alias, or of named tenants' traffic (percent 0 removes it)."""

    @extend_schema(
        request=SplitSerializer,
        responses={200: AliasSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def put(self, request: Request, name: str) -> Response:
        alias = alias_named(name)
        given = SplitSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        version = version_named("version", given.validated_data["version"] or "")
        tenants = tenants_named("tenants", given.validated_data["tenants"])
        try:
            alias_split_set(
                alias=alias,
                version=version,
                percent=given.validated_data["percent"],
                tenants=tenants,
                actor=request.user,  # type: ignore[arg-type]
                reason=given.validated_data["reason"],
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(_alias_body(alias_named(name)))


class AliasShadowApi(APIView):
    """PUT the shadow of an alias (version null or percent 0 stops it)."""

    @extend_schema(
        request=ShareSerializer,
        responses={200: AliasSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def put(self, request: Request, name: str) -> Response:
        alias = alias_named(name)
        given = ShareSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        ref = given.validated_data["version"]
        version = version_named("version", ref) if ref else None
        try:
            alias_shadow_set(
                alias=alias,
                version=version,
                percent=given.validated_data["percent"],
                actor=request.user,  # type: ignore[arg-type]
                reason=given.validated_data["reason"],
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(_alias_body(alias_named(name)))


class FallbackSerializer(serializers.Serializer[Any]):
    alias = serializers.CharField(allow_null=True)
    reason = serializers.CharField(required=False, default="", allow_blank=True)


class AliasFallbackApi(APIView):
    """PUT the alias an alias's interactive requests go to when it cannot take them (null: none)."""

    @extend_schema(
        request=FallbackSerializer,
        responses={200: AliasSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def put(self, request: Request, name: str) -> Response:
        alias = alias_named(name)
        given = FallbackSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        ref = given.validated_data["alias"]
        fallback = None
        if ref is not None:
            fallback = Alias.objects.select_related("version__model").filter(name=ref).first()
        if ref is not None and fallback is None:
            raise serializers.ValidationError({"alias": f"no alias {ref!r}"})
        try:
            alias_fallback_set(
                alias=alias,
                fallback=fallback,
                actor=request.user,  # type: ignore[arg-type]
                reason=given.validated_data["reason"],
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(_alias_body(alias_named(name)))


class DeploymentSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    version = serializers.CharField()
    state = serializers.CharField()
    live_workers = serializers.IntegerField()
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)


class DeploymentListApi(APIView):
    """GET every deployment with its state and live workers (the worker registry)."""

    @extend_schema(responses={200: DeploymentSerializer(many=True), 403: REFUSED})
    def get(self, request: Request) -> Response:
        client = redis_sync_client()
        body = [
            {
                "name": d.name,
                "version": d.version.public_name,
                "state": d.state,
                "live_workers": live_workers_sync(client, d.name),
                "last_heartbeat_at": d.last_heartbeat_at,
            }
            for d in Deployment.objects.select_related("version__model").order_by("name")
        ]
        return Response(body)


# --- who may call a model (docs/model-access.md) ---------------------------------------------


class ModelAccessSerializer(serializers.Serializer[Any]):
    """Who may call a model (built by _access_body)."""

    model = serializers.CharField()
    owner = serializers.CharField(allow_null=True, help_text="the tenant that alone may call it")
    limited = serializers.BooleanField(help_text="platform-wide, but only for its grants")
    grants = serializers.ListField(child=serializers.CharField())
    adapter_on = serializers.ListField(child=serializers.CharField())
    aliases = serializers.ListField(child=serializers.CharField())


class ModelAccessChangeSerializer(serializers.Serializer[Any]):
    owner = serializers.CharField(
        required=False, allow_null=True, help_text="a tenant's slug; null: platform-wide"
    )
    limited = serializers.BooleanField(required=False)
    reason = serializers.CharField(required=False, default="", allow_blank=True)


class ReasonSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, default="", allow_blank=True)


def _access_body(name: str) -> dict[str, Any]:
    access = model_access_get(name=name)
    if access is None:
        raise Http404(f"no model {name!r}")
    return {
        "model": access.model.name,
        "owner": access.model.owner.slug if access.model.owner else None,
        "limited": access.model.limited,
        "grants": list(access.grants),
        "adapter_on": list(access.bases),
        "aliases": list(access.aliases),
    }


def _model_named(name: str) -> Model:
    model = Model.objects.filter(name=name).first() if "\x00" not in name else None
    if model is None:
        raise Http404(f"no model {name!r}")
    return model


def _tenant_named(field: str, slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first() if "\x00" not in slug else None
    if tenant is None:
        raise serializers.ValidationError({field: f"no tenant {slug!r}"})
    return tenant


def _tenant_in_path(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise Http404(f"no tenant {slug!r}")
    return tenant


class ModelAccessApi(APIView):
    """GET who may call a model; PATCH its owner or whether it is limited (audited)."""

    @extend_schema(responses={200: ModelAccessSerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, name: str) -> Response:
        return Response(_access_body(name))

    @extend_schema(
        request=ModelAccessChangeSerializer,
        responses={200: ModelAccessSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def patch(self, request: Request, name: str) -> Response:
        model = _model_named(name)
        given = ModelAccessChangeSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        actor = request.user
        try:
            with transaction.atomic():
                if "owner" in data:
                    owner = _tenant_named("owner", data["owner"]) if data["owner"] else None
                    model = model_owner_set(
                        model=model,
                        owner=owner,
                        actor=actor,  # type: ignore[arg-type]
                        reason=data["reason"],
                    )
                if "limited" in data:
                    model_limit_set(
                        model=model,
                        limited=data["limited"],
                        actor=actor,  # type: ignore[arg-type]
                        reason=data["reason"],
                    )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(_access_body(name))


class ModelGrantApi(APIView):
    """PUT a tenant's grant of a limited platform-wide model; DELETE it (both audited)."""

    @extend_schema(
        request=ReasonSerializer,
        responses={200: ModelAccessSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def put(self, request: Request, name: str, slug: str) -> Response:
        model, tenant = _model_named(name), _tenant_in_path(slug)
        given = ReasonSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        try:
            model_grant(
                model=model,
                tenant=tenant,
                actor=request.user,  # type: ignore[arg-type]
                reason=given.validated_data["reason"],
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(_access_body(name))

    @extend_schema(
        request=ReasonSerializer,
        responses={200: ModelAccessSerializer, 403: REFUSED, 404: NOT_FOUND},
    )
    def delete(self, request: Request, name: str, slug: str) -> Response:
        model, tenant = _model_named(name), _tenant_in_path(slug)
        given = ReasonSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        model_revoke(
            model=model,
            tenant=tenant,
            actor=request.user,  # type: ignore[arg-type]
            reason=given.validated_data["reason"],
        )
        return Response(_access_body(name))
