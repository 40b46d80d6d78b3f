"""The management REST API of rollouts and versions' SLIs (staff only): one class per operation."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.selectors import version_slis
from models_registry.apis import TENANTS_HELP, alias_named, tenants_named, version_named
from models_registry.models import Rollout, RolloutDecision
from models_registry.selectors import version_pinned
from rollouts.services import RolloutConflict, rollout_act, rollout_start
from tenants.apis import CONFLICT, FIELD_ERRORS, NOT_FOUND, REFUSED, drf_validation_error


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def _rollouts() -> QuerySet[Rollout]:
    return Rollout.objects.select_related(
        "alias", "canary__model", "baseline__model"
    ).prefetch_related("tenants")


def _rollout(pk: int) -> Rollout:
    try:
        return _rollouts().get(pk=pk)
    except Rollout.DoesNotExist as exc:
        raise Http404(f"no rollout {pk}") from exc


class DecisionSerializer(serializers.ModelSerializer[RolloutDecision]):
    # Null for the decisions the analysis makes on its own.
    actor: serializers.StringRelatedField[Any] = serializers.StringRelatedField(allow_null=True)

    class Meta:
        model = RolloutDecision
        fields = ["id", "action", "percent", "reason", "evidence", "actor", "created_at"]


class RolloutSerializer(serializers.ModelSerializer[Rollout]):
    alias = serializers.CharField(source="alias.name")
    baseline = serializers.CharField(source="baseline.public_name")
    canary = serializers.CharField(source="canary.public_name")
    percent = serializers.FloatField()
    tenants: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        many=True,
        read_only=True,
        slug_field="slug",
        help_text="The tenants a scoped rollout still targets (none: every tenant).",
    )

    class Meta:
        model = Rollout
        fields = [
            "id", "alias", "baseline", "canary", "state", "percent", "scoped", "tenants",
            "steps", "step_index", "step_started_at", "min_samples", "min_step_seconds",
            "guardrails", "short_window_seconds", "long_window_seconds", "breach_checks",
            "breaches", "cost_held", "created_at", "finished_at",
        ]  # fmt: skip


class RolloutDetailSerializer(RolloutSerializer):
    decisions = DecisionSerializer(many=True, read_only=True)

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "decisions"]


class RolloutStartSerializer(serializers.Serializer[Any]):
    alias = serializers.CharField()
    canary = serializers.CharField(help_text="model@label or model@<version id prefix>")
    steps = serializers.ListField(child=serializers.FloatField(), required=False)
    min_samples = serializers.IntegerField(min_value=1, default=200)
    min_step_seconds = serializers.IntegerField(min_value=0, default=300)
    guardrails = serializers.DictField(child=serializers.FloatField(), required=False)
    short_window_seconds = serializers.IntegerField(min_value=1, default=10)
    long_window_seconds = serializers.IntegerField(min_value=1, default=60)
    breach_checks = serializers.IntegerField(min_value=1, default=3)
    tenants = serializers.ListField(
        child=serializers.SlugField(max_length=64), default=list, max_length=1000,
        help_text=TENANTS_HELP,
    )  # fmt: skip
    reason = serializers.CharField(required=False, default="", allow_blank=True)


class RolloutListApi(APIView):
    """GET recent rollouts; POST starts one (the canary gets the first step's share)."""

    @extend_schema(responses={200: RolloutSerializer(many=True), 403: REFUSED})
    def get(self, request: Request) -> Response:
        return Response(RolloutSerializer(_rollouts()[:100], many=True).data)

    @extend_schema(
        request=RolloutStartSerializer,
        responses={
            201: RolloutSerializer,
            400: FIELD_ERRORS,
            403: REFUSED,
            404: NOT_FOUND,
            409: CONFLICT,
        },
    )
    def post(self, request: Request) -> Response:
        given = RolloutStartSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = dict(given.validated_data)
        alias = alias_named(data.pop("alias"))
        canary = version_named("canary", data.pop("canary"))
        tenants = tenants_named("tenants", data.pop("tenants"))
        try:
            rollout = rollout_start(
                alias=alias,
                canary=canary,
                tenants=tenants,
                actor=request.user,  # type: ignore[arg-type]
                **data,
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        except RolloutConflict as exc:
            raise Conflict(str(exc)) from exc
        return Response(RolloutSerializer(rollout).data, status=status.HTTP_201_CREATED)


class RolloutDetailApi(APIView):
    """GET a rollout with every decision and the numbers behind it."""

    @extend_schema(responses={200: RolloutDetailSerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, pk: int) -> Response:
        return Response(RolloutDetailSerializer(_rollout(pk)).data)


class RolloutActionSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, default="", allow_blank=True)
    tenants = serializers.ListField(
        child=serializers.SlugField(max_length=64), default=list, max_length=1000,
        help_text="rollback only: these tenants of a scoped rollout go back to the primary "
        "alone, the others carry on (all of them: the whole rollout is rolled back)",
    )  # fmt: skip


class RolloutActionApi(APIView):
    """POST promote, pause, resume or rollback, with an optional reason (and for a rollback,
    optionally the tenants of a scoped rollout to roll back alone)."""

    @extend_schema(
        operation_id="rollouts_act",
        parameters=[
            OpenApiParameter(
                "action",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                enum=["promote", "pause", "resume", "rollback"],
            )
        ],
        request=RolloutActionSerializer,
        responses={
            200: RolloutSerializer,
            400: FIELD_ERRORS,
            403: REFUSED,
            404: NOT_FOUND,
            409: CONFLICT,
        },
    )
    def post(self, request: Request, pk: int, action: str) -> Response:
        if action not in ("promote", "pause", "resume", "rollback"):
            raise Http404(f"no action {action!r}")
        rollout = _rollout(pk)
        given = RolloutActionSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        reason = given.validated_data["reason"]
        tenants = tenants_named("tenants", given.validated_data["tenants"])
        try:
            rollout = rollout_act(
                rollout,
                action=action,
                actor=request.user,  # type: ignore[arg-type]
                reason=reason,
                tenants=tenants,
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        except RolloutConflict as exc:
            raise Conflict(str(exc)) from exc
        return Response(RolloutSerializer(_rollout(rollout.pk)).data)


class SlisSerializer(serializers.Serializer[Any]):
    version = serializers.CharField()
    minutes = serializers.FloatField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]  # a field: DRF moves it off the class
    error_rate_pct = serializers.FloatField()
    ttft_p95_ms = serializers.FloatField(allow_null=True)
    itl_p95_ms = serializers.FloatField(allow_null=True)
    cost_per_1k = serializers.FloatField(allow_null=True)
    engine_seconds_per_1k = serializers.FloatField(allow_null=True)


class VersionSlisApi(APIView):
    """GET a version's SLIs over the last `minutes` (default 60), shadow copies included."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "ref", OpenApiTypes.STR, OpenApiParameter.PATH, description="model@version"
            ),
            OpenApiParameter(
                "minutes",
                OpenApiTypes.FLOAT,
                description="The window, more than 0 and at most 44640 (31 days).",
            ),
        ],
        responses={200: SlisSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def get(self, request: Request, ref: str) -> Response:
        version = version_pinned(ref) if "@" in ref else None
        if version is None:
            raise Http404(f"no version {ref!r}")
        try:
            minutes = float(request.query_params.get("minutes", "60"))
        except ValueError as exc:
            raise serializers.ValidationError({"minutes": "must be a number"}) from exc
        if not 0 < minutes <= 60 * 24 * 31:
            raise serializers.ValidationError({"minutes": "must be between 0 and 44640"})
        since = timezone.now() - dt.timedelta(minutes=minutes)
        slis = version_slis(version=version, since=since)
        return Response({"version": version.public_name, "minutes": minutes, **slis.as_dict()})
