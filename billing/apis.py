"""The finance REST API: invoices, usage aggregates and exports, adjustments, price books.

Staff see every tenant; a tenant's `finance` and `admin` members see their own tenant only,
and another tenant's invoice is a 404. Only staff build, issue, settle or void invoices,
add adjustments and set prices.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.budgets import budget_banner
from billing.invoices import (
    adjustment_add,
    invoice_build,
    invoice_csv_rows,
    invoice_issue,
    invoice_mark_paid,
    invoice_void,
)
from billing.models import Invoice, InvoiceLine, InvoiceState
from billing.pdf import invoice_pdf
from billing.selectors import USAGE_FILTERS, USAGE_GROUPS, tenant_month_spend, usage_aggregate
from billing.services import price_book_add
from config.http import content_disposition
from models_registry.selectors import version_pinned
from tenants.apis import FIELD_ERRORS, NOT_FOUND, REFUSED, drf_validation_error
from tenants.models import Membership, Role, Tenant


def _tenants_of(request: Request) -> QuerySet[Tenant]:
    """The tenants whose money this user may see."""
    if request.user.is_staff:
        return Tenant.objects.all()
    member_of = Membership.objects.filter(
        user_id=request.user.pk or 0, role__in=[Role.FINANCE, Role.ADMIN]
    ).values("tenant_id")
    return Tenant.objects.filter(pk__in=member_of)


def _tenant(request: Request, slug: str | None) -> Tenant:
    """The tenant a query is about: named (staff must name one), or the user's only one."""
    tenants = _tenants_of(request)
    if slug:
        found = tenants.filter(slug=slug).first() if "\x00" not in slug else None
        if found is None:
            raise Http404(f"no tenant {slug!r}")
        return found
    if request.user.is_staff or tenants.count() != 1:
        raise serializers.ValidationError({"tenant": "name the tenant (?tenant=<slug>)"})
    return tenants.get()


def _invoice(request: Request, pk: int) -> Invoice:
    invoice = (
        Invoice.objects.select_related("tenant").filter(tenant__in=_tenants_of(request), pk=pk)
    ).first()
    if invoice is None:
        raise Http404(f"no invoice {pk}")
    return invoice


def _month(raw: str, field: str = "month") -> dt.date:
    try:
        return dt.datetime.strptime(raw, "%Y-%m").date()
    except ValueError as exc:
        raise serializers.ValidationError({field: "use YYYY-MM"}) from exc


def _day(raw: str | None, field: str) -> dt.datetime | None:
    if not raw:
        return None
    try:
        return dt.datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise serializers.ValidationError({field: "use YYYY-MM-DD (UTC)"}) from exc


def _csv(rows: Iterable[list[str]], filename: str) -> HttpResponse:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = content_disposition(filename)
    return response


class LineSerializer(serializers.ModelSerializer[InvoiceLine]):
    class Meta:
        model = InvoiceLine
        fields = ["description", "priority", "requests", "prompt_tokens", "cached_tokens",
                  "completion_tokens", "cached_amount", "amount"]  # fmt: skip
        extra_kwargs = {
            "prompt_tokens": {"help_text": "All prompt tokens, the cached ones included."},
            "cached_tokens": {"help_text": "Prompt tokens served from the prefix cache."},
            "cached_amount": {
                "help_text": "The part of amount the cached tokens cost (cached-input price)."
            },
        }


class InvoiceSerializer(serializers.ModelSerializer[Invoice]):
    tenant = serializers.CharField(source="tenant.slug")

    class Meta:
        model = Invoice
        fields = ["id", "number", "tenant", "period_start", "period_end", "state", "currency",
                  "usage_total", "adjustments_total", "total", "issued_at", "paid_at",
                  "voided_at"]  # fmt: skip


class InvoiceDetailSerializer(InvoiceSerializer):
    lines = LineSerializer(many=True, read_only=True)

    class Meta(InvoiceSerializer.Meta):
        fields = [*InvoiceSerializer.Meta.fields, "lines"]


def _query(name: str, description: str, **kwargs: Any) -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.STR, description=description, **kwargs)


TENANT_QUERY = _query("tenant", "The tenant's slug (staff must name one; members may omit it).")


class FinanceView(APIView):
    permission_classes = [IsAuthenticated]


class InvoiceListApi(FinanceView):
    """GET invoices (?tenant=<slug>&month=YYYY-MM&state=issued)."""

    @extend_schema(
        parameters=[
            TENANT_QUERY,
            _query("month", "The invoiced month, YYYY-MM."),
            _query("state", "Only invoices in this state.", enum=list(InvoiceState.values)),
        ],
        responses={
            200: InvoiceSerializer(many=True),
            400: FIELD_ERRORS,
            403: REFUSED,
            404: NOT_FOUND,
        },
    )
    def get(self, request: Request) -> Response:
        invoices = Invoice.objects.select_related("tenant").filter(tenant__in=_tenants_of(request))
        if request.query_params.get("tenant"):
            invoices = invoices.filter(tenant=_tenant(request, request.query_params["tenant"]))
        if request.query_params.get("month"):
            invoices = invoices.filter(period_start=_month(request.query_params["month"]))
        state = request.query_params.get("state")
        if state:
            if state not in InvoiceState.values:
                raise serializers.ValidationError({"state": f"one of {', '.join(InvoiceState)}"})
            invoices = invoices.filter(state=state)
        return Response(InvoiceSerializer(invoices[:500], many=True).data)


class InvoiceDetailApi(FinanceView):
    """GET an invoice with its lines."""

    @extend_schema(responses={200: InvoiceDetailSerializer, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, pk: int) -> Response:
        return Response(InvoiceDetailSerializer(_invoice(request, pk)).data)


class InvoiceCsvApi(FinanceView):
    """GET an invoice's lines as CSV."""

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR, 403: REFUSED, 404: NOT_FOUND})
    def get(self, request: Request, pk: int) -> HttpResponse:
        invoice = _invoice(request, pk)
        return _csv(invoice_csv_rows(invoice), f"{invoice.number or f'draft-{pk}'}.csv")


class InvoicePdfApi(FinanceView):
    """GET an invoice as a PDF."""

    @extend_schema(
        responses={(200, "application/pdf"): OpenApiTypes.BINARY, 403: REFUSED, 404: NOT_FOUND}
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        invoice = _invoice(request, pk)
        response = HttpResponse(invoice_pdf(invoice), content_type="application/pdf")
        name = invoice.number or f"draft-{pk}"
        response["Content-Disposition"] = content_disposition(f"{name}.pdf")
        return response


class InvoiceBuildSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField(help_text="The tenant's slug.")
    month = serializers.CharField(help_text="A finished month, YYYY-MM.")


class InvoiceBuildApi(APIView):
    """POST {tenant, month}: build (or rebuild) the tenant's draft for a finished month."""

    permission_classes = [IsAdminUser]

    @extend_schema(
        request=InvoiceBuildSerializer,
        responses={201: InvoiceSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def post(self, request: Request) -> Response:
        given = InvoiceBuildSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        tenant = _tenant(request, given.validated_data["tenant"])
        try:
            invoice = invoice_build(
                tenant=tenant,
                month=_month(given.validated_data["month"]),
                actor=request.user,  # type: ignore[arg-type]
            )
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(InvoiceSerializer(invoice).data, status=status.HTTP_201_CREATED)


class InvoiceActionSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(
        required=False, default="", allow_blank=True, help_text="Why (void needs one)."
    )


class InvoiceActionApi(APIView):
    """POST issue, pay or void an invoice (staff)."""

    permission_classes = [IsAdminUser]
    actions = {"issue": invoice_issue, "pay": invoice_mark_paid}

    @extend_schema(
        operation_id="finance_invoices_act",
        parameters=[
            OpenApiParameter(
                "action", OpenApiTypes.STR, OpenApiParameter.PATH, enum=["issue", "pay", "void"]
            )
        ],
        request=InvoiceActionSerializer,
        responses={200: InvoiceSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def post(self, request: Request, pk: int, action: str) -> Response:
        invoice = _invoice(request, pk)
        given = InvoiceActionSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        try:
            if action == "void":
                reason = given.validated_data["reason"]
                invoice = invoice_void(invoice=invoice, actor=request.user, reason=reason)  # type: ignore[arg-type]
            elif action in self.actions:
                invoice = self.actions[action](invoice=invoice, actor=request.user)  # type: ignore[arg-type]
            else:
                raise Http404(f"no action {action!r}")
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(InvoiceSerializer(invoice).data)


class AdjustmentSerializer(serializers.Serializer[Any]):
    tenant = serializers.SlugField()
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)
    reason = serializers.CharField(max_length=200)


class AdjustmentCreatedSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    tenant = serializers.CharField()
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)


class AdjustmentCreateApi(APIView):
    """POST {tenant, amount, reason}: a credit (negative) or charge for the next invoice."""

    permission_classes = [IsAdminUser]

    @extend_schema(
        request=AdjustmentSerializer,
        responses={
            201: AdjustmentCreatedSerializer,
            400: FIELD_ERRORS,
            403: REFUSED,
            404: NOT_FOUND,
        },
    )
    def post(self, request: Request) -> Response:
        given = AdjustmentSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        tenant = _tenant(request, given.validated_data["tenant"])
        adjustment = adjustment_add(
            tenant=tenant,
            amount=given.validated_data["amount"],
            reason=given.validated_data["reason"],
            actor=request.user,  # type: ignore[arg-type]
        )
        return Response(
            {"id": adjustment.pk, "tenant": tenant.slug, "amount": str(adjustment.amount)},
            status=status.HTTP_201_CREATED,
        )


class PriceBookSerializer(serializers.Serializer[Any]):
    version = serializers.CharField(help_text="model@label or model@<version id prefix>")
    input_per_1k = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=Decimal(0))
    output_per_1k = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=Decimal(0))
    batch_discount_pct = serializers.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal(0)
    )
    cached_input_per_1k = serializers.DecimalField(
        max_digits=12,
        decimal_places=6,
        min_value=Decimal(0),
        allow_null=True,
        default=None,
        help_text="Prompt tokens served from the prefix cache; at most input_per_1k. "
        "Left out or null: they cost input_per_1k.",
    )
    effective_from = serializers.DateTimeField()
    note = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)


class PriceBookCreatedSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    version = serializers.CharField()
    effective_from = serializers.DateTimeField()


class PriceBookCreateApi(APIView):
    """POST a version's prices from a moment on (never edits earlier ones)."""

    permission_classes = [IsAdminUser]

    @extend_schema(
        request=PriceBookSerializer,
        responses={201: PriceBookCreatedSerializer, 400: FIELD_ERRORS, 403: REFUSED},
    )
    def post(self, request: Request) -> Response:
        given = PriceBookSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = dict(given.validated_data)
        version = version_pinned(data.pop("version"))
        if version is None:
            raise serializers.ValidationError({"version": "no such version (use model@version)"})
        try:
            book = price_book_add(version=version, actor=request.user, **data)  # type: ignore[arg-type]
        except DjangoValidationError as exc:
            raise drf_validation_error(exc) from exc
        return Response(
            {"id": book.pk, "version": version.public_name,
             "effective_from": book.effective_from.isoformat()},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip


class BannerSerializer(serializers.Serializer[Any]):
    threshold = serializers.IntegerField(help_text="The percent of the budget crossed.")
    message = serializers.CharField()


class BudgetSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField()
    monthly_budget = serializers.DecimalField(max_digits=12, decimal_places=2)
    spent = serializers.DecimalField(max_digits=14, decimal_places=2)
    percent = serializers.FloatField(allow_null=True, help_text="Null without a budget.")
    banner = BannerSerializer(allow_null=True)


class BudgetApi(FinanceView):
    """GET a tenant's budget, this month's spend and its current budget alert (the banner)."""

    @extend_schema(
        parameters=[TENANT_QUERY],
        responses={200: BudgetSerializer, 400: FIELD_ERRORS, 403: REFUSED, 404: NOT_FOUND},
    )
    def get(self, request: Request) -> Response:
        tenant = _tenant(request, request.query_params.get("tenant"))
        budget = tenant.quota.monthly_budget
        spent = tenant_month_spend(tenant_id=tenant.pk)
        banner = budget_banner(tenant=tenant)
        return Response(
            {
                "tenant": tenant.slug,
                "monthly_budget": str(budget),
                "spent": str(spent.quantize(Decimal("0.01"))),
                "percent": round(float(spent * 100 / budget), 1) if budget else None,
                "banner": {"threshold": banner.threshold, "message": banner.message}
                if banner
                else None,
            }
        )


class UsageRowSerializer(serializers.Serializer[Any]):
    # The row's group, named by group_by: one of these is present.
    day = serializers.CharField(required=False, help_text="A UTC day, YYYY-MM-DD.")
    model = serializers.CharField(required=False)
    version = serializers.CharField(required=False)
    key = serializers.CharField(required=False)
    user = serializers.CharField(required=False)
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]  # a field: DRF moves it off the class
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField(help_text="Part of prompt_tokens.")
    cache_created_tokens = serializers.IntegerField(
        help_text="Part of prompt_tokens: computed and written to the prefix cache (not priced "
        "apart)."
    )
    reasoning_tokens = serializers.IntegerField(
        help_text="Part of completion_tokens: a reasoning model's thinking (billed as output)."
    )
    cost = serializers.DecimalField(max_digits=14, decimal_places=8)
    cached_cost = serializers.DecimalField(
        max_digits=14, decimal_places=8, help_text="The part of cost the cached tokens paid."
    )


class UsageSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField()
    group_by = serializers.ChoiceField(choices=list(USAGE_GROUPS))
    rows = UsageRowSerializer(many=True)


class UsageApi(FinanceView):
    """GET usage aggregated by day, model, version, key or user (?export=csv for a file).

    Filters: tenant (staff must name one), from / to (UTC days, `to` exclusive), model, key,
    user. Shadow copies are not usage and never appear.
    """

    @extend_schema(
        parameters=[
            TENANT_QUERY,
            _query("group_by", "What a row sums (default day).", enum=list(USAGE_GROUPS)),
            _query("from", "The first UTC day, YYYY-MM-DD."),
            _query("to", "The UTC day after the last, YYYY-MM-DD."),
            _query("model", "Only this model's usage."),
            _query("key", "Only this API key's usage (its public id)."),
            _query("user", "Only this user tag's usage."),
            _query("export", "csv: the rows as a CSV file.", enum=["csv"]),
        ],
        responses={
            (200, "application/json"): UsageSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            400: FIELD_ERRORS,
            403: REFUSED,
            404: NOT_FOUND,
        },
    )
    def get(self, request: Request) -> Response | HttpResponse:
        params = request.query_params
        tenant = _tenant(request, params.get("tenant"))
        group = params.get("group_by", "day")
        if group not in USAGE_GROUPS:
            raise serializers.ValidationError({"group_by": f"one of {', '.join(USAGE_GROUPS)}"})
        filters = {name: params[name] for name in USAGE_FILTERS if params.get(name)}
        for name, value in filters.items():
            if "\x00" in value:
                raise serializers.ValidationError({name: "cannot contain the NUL character"})
        rows = usage_aggregate(
            tenant_id=tenant.pk,
            group=group,
            since=_day(params.get("from"), "from"),
            until=_day(params.get("to"), "to"),
            filters=filters,
        )
        data = [
            {
                group: row.label,
                "requests": row.requests,
                "errors": row.errors,
                "prompt_tokens": row.prompt_tokens,
                "completion_tokens": row.completion_tokens,
                "cached_tokens": row.cached_tokens,
                "cache_created_tokens": row.cache_created_tokens,
                "reasoning_tokens": row.reasoning_tokens,
                "cost": str(row.cost),
                "cached_cost": str(row.cached_cost),
            }
            for row in rows
        ]
        if params.get("export") == "csv":
            header = [group, "requests", "errors", "prompt_tokens", "completion_tokens",
                      "cached_tokens", "cache_created_tokens", "reasoning_tokens", "cost",
                      "cached_cost"]  # fmt: skip
            # A column, not a comment line above the header: CSV has no comments, so a "#" line
            # breaks spreadsheets, csv.DictReader and loaders, while a column survives sorting,
            # filtering and concatenating exports of several tenants.
            body = [[*(str(row[h]) for h in header), tenant.training_use] for row in data]
            return _csv([[*header, "training_use"], *body], f"usage-{tenant.slug}-by-{group}.csv")
        return Response({"tenant": tenant.slug, "group_by": group, "rows": data})
