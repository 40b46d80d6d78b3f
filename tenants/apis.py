"""The management REST API for tenants (staff only): one class per operation."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import NotFound
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.keys import public_id_of
from tenants.models import ApiKey, Quota, Tenant
from tenants.selectors import api_key_get
from tenants.services import (
    PRIVACY_FIELDS,
    QUOTA_FIELDS,
    api_key_models_set,
    quota_update,
    tenant_privacy_update,
)


class QuotaSerializer(serializers.ModelSerializer[Quota]):
    class Meta:
        model = Quota
        fields = [*QUOTA_FIELDS, "updated_at"]
        read_only_fields = ["updated_at"]


class TenantPrivacySerializer(serializers.ModelSerializer[Tenant]):
    class Meta:
        model = Tenant
        fields = [*PRIVACY_FIELDS, "deleted_at"]
        read_only_fields = ["deleted_at"]


class ErrorSerializer(serializers.Serializer[Any]):
    """The body of a refusal: what went wrong, in a sentence."""

    detail = serializers.CharField()


# The management API's documented refusals, shared by its three apps.
FIELD_ERRORS = OpenApiResponse(
    {"type": "object", "additionalProperties": {}},
    description="The request is invalid: each field at fault names its problem.",
)
REFUSED = OpenApiResponse(
    ErrorSerializer, description="Not signed in, or not allowed (most operations are staff only)."
)
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such object, or not one of yours.")
CONFLICT = OpenApiResponse(ErrorSerializer, description="The object's state does not allow it.")


def drf_validation_error(exc: DjangoValidationError) -> serializers.ValidationError:
    """A service's ValidationError as the API's 400, field by field where it names fields."""
    return serializers.ValidationError(
        exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
    )


@extend_schema(exclude=True)
@api_view(["GET", "POST", "PUT", "PATCH", "DELETE"])
@permission_classes([AllowAny])
def not_found(request: Request, path: str = "") -> Response:
    """Answer a path under /api/ that no route takes with a JSON 404, as every API path does."""
    raise NotFound(f"No endpoint {request.method} {request.path}.")


def _tenant(slug: str) -> Tenant:
    try:
        return Tenant.objects.get(slug=slug)
    except Tenant.DoesNotExist as exc:
        raise Http404(f"no tenant {slug!r}") from exc


class QuotaDetailApi(APIView):
    """GET a tenant's quota; PATCH some of its fields (audited)."""

    @extend_schema(responses={200: QuotaSerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, slug: str) -> Response:
        return Response(QuotaSerializer(_tenant(slug).quota).data)

    @extend_schema(
        request=QuotaSerializer,
        responses={200: QuotaSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def patch(self, request: Request, slug: str) -> Response:
        tenant = _tenant(slug)
        serializer = QuotaSerializer(tenant.quota, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        changes: dict[str, Any] = dict(serializer.validated_data)
        try:
            quota = quota_update(tenant=tenant, changes=changes, actor=request.user)  # type: ignore[arg-type]
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(QuotaSerializer(quota).data)


class TenantPrivacyApi(APIView):
    """GET a tenant's retention period and training flag; PATCH them (audited)."""

    @extend_schema(responses={200: TenantPrivacySerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, slug: str) -> Response:
        return Response(TenantPrivacySerializer(_tenant(slug)).data)

    @extend_schema(
        request=TenantPrivacySerializer,
        responses={200: TenantPrivacySerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def patch(self, request: Request, slug: str) -> Response:
        tenant = _tenant(slug)
        serializer = TenantPrivacySerializer(tenant, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        try:
            tenant = tenant_privacy_update(
                tenant=tenant,
                actor=request.user,  # type: ignore[arg-type]
                **serializer.validated_data,
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(TenantPrivacySerializer(tenant).data)


class _Text(serializers.CharField):
    """A string as sent: a number is not a name (DRF's CharField would take 7 as "7")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class KeyModelsSerializer(serializers.Serializer[Any]):
    key = serializers.CharField(read_only=True)
    allowed_models = serializers.ListField(
        child=_Text(allow_blank=True, trim_whitespace=False),
        allow_empty=True,
        help_text="aliases or model names; empty: every model the key's tenant may call",
    )


class KeyModelsApi(APIView):
    """GET the models a tenant's key is narrowed to; PUT them (audited, applied at once)."""

    @extend_schema(responses={200: KeyModelsSerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, slug: str, public_id: str) -> Response:
        key = _key(_tenant(slug), public_id)
        return Response({"key": key.public_id, "allowed_models": key.allowed_models})

    @extend_schema(
        request=KeyModelsSerializer,
        responses={200: KeyModelsSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def put(self, request: Request, slug: str, public_id: str) -> Response:
        key = _key(_tenant(slug), public_id)
        given = KeyModelsSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        try:
            key = api_key_models_set(
                key=key,
                models=given.validated_data["allowed_models"],
                actor=request.user,  # type: ignore[arg-type]
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response({"key": key.public_id, "allowed_models": key.allowed_models})


def _key(tenant: Tenant, public_id: str) -> ApiKey:
    try:
        return api_key_get(tenant=tenant, public_id=public_id_of(public_id))
    except ApiKey.DoesNotExist as exc:
        raise Http404(f"no key {public_id!r} in tenant {tenant.slug!r}") from exc
