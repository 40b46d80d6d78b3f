"""Usage records, price books, adjustments and invoices: the money side of the platform."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models

from models_registry.models import ModelVersion
from tenants.models import ApiKey, AppendOnlyError, Tenant


class UsageRecord(models.Model):
    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage")
    # A key with usage is revoked, never deleted: its records keep pointing at it.
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.PROTECT)
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT)
    deployment = models.CharField(max_length=100)
    endpoint = models.CharField(max_length=32)
    status = models.CharField(max_length=16)
    finish_reason = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()
    cost = models.DecimalField(max_digits=14, decimal_places=8)
    # The part of `cost` the cached tokens paid, at the cached-input price (discounts applied).
    cached_cost = models.DecimalField(max_digits=14, decimal_places=8, default=Decimal(0))
    # A shadow copy's record: kept for comparing versions, never billed (cost 0).
    shadow = models.BooleanField(default=False)
    user = models.CharField(max_length=64, blank=True)  # the client's `user` tag
    priority = models.CharField(max_length=16, default="interactive")
    cached_tokens = models.PositiveIntegerField(default=0)
    # Part of prompt_tokens: computed and written to the prefix cache (not priced apart).
    cache_created_tokens = models.PositiveIntegerField(default=0)
    # Part of completion_tokens: a reasoning model's thinking (billed as output).
    reasoning_tokens = models.PositiveIntegerField(default=0)
    # The W3C trace the request ran under: finds its log lines and spans from a bill line.
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # Answered from the tenant's response cache (no engine time), billed at its quota's share.
    response_cache = models.BooleanField(default=False)
    # The alias the client named, when it could not take the request and its fallback answered
    # (the model version is the fallback's); empty otherwise.
    fallback_from = models.CharField(max_length=100, blank=True, default="")
    # The max_tokens admission capped the request to, below the client's, so that it finished
    # before its deadline (its tenant opted in to output capping); null: not capped.
    capped_max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The price book in force when the request was admitted; null: the version's own price.
    price_book = models.ForeignKey(
        "billing.PriceBook", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    first_token_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(db_index=True)
    ingested_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "finished_at"]),
            models.Index(fields=["model_version", "finished_at"]),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("usage records are append-only")
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.request_id} {self.status} {self.prompt_tokens}+{self.completion_tokens}"


class PriceBook(models.Model):
    """A version's prices from a moment on. A new price is a new row; history never changes."""

    model_version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="price_books"
    )
    input_per_1k = models.DecimalField(max_digits=12, decimal_places=6)
    output_per_1k = models.DecimalField(max_digits=12, decimal_places=6)
    # Prompt tokens served from the prefix cache; null: they cost the input price (no discount).
    cached_input_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True
    )
    # Batch-class requests (the Batch API, service_tier "flex") pay this much less.
    batch_discount_pct = models.DecimalField(max_digits=5, decimal_places=2, default=Decimal(0))
    effective_from = models.DateTimeField()
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model_version", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_version", "effective_from"], name="price_book_one_per_moment"
            ),
            models.CheckConstraint(
                condition=models.Q(cached_input_per_1k__isnull=True)
                | models.Q(
                    cached_input_per_1k__gte=0, cached_input_per_1k__lte=models.F("input_per_1k")
                ),
                name="price_book_cached_input_at_most_input",
            ),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("price books never change; add one effective from later")
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.model_version} from {self.effective_from:%Y-%m-%d %H:%M}"


class InvoiceState(models.TextChoices):
    DRAFT = "draft"
    ISSUED = "issued"
    PAID = "paid"
    VOID = "void"


class IssuedInvoiceError(AppendOnlyError):
    """An issued invoice (or one of its lines) cannot change; correct it on the next one."""


class Invoice(models.Model):
    """A tenant's bill for one UTC calendar month. Immutable once issued."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    period_start = models.DateField()  # the first day of the month (UTC)
    period_end = models.DateField()  # the first day of the next month, exclusive
    state = models.CharField(max_length=8, choices=InvoiceState.choices, default=InvoiceState.DRAFT)
    number = models.CharField(max_length=32, unique=True, null=True, blank=True)
    currency = models.CharField(max_length=3, default="USD")
    usage_total = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0))
    adjustments_total = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0))
    total = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0))
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    issued_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-period_start", "tenant_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period_start"],
                condition=~models.Q(state="void"),
                name="invoice_one_per_tenant_month",
            )
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            stored = Invoice.objects.filter(pk=self.pk).values("state").first()
            if (
                stored
                and stored["state"] != InvoiceState.DRAFT
                and not getattr(self, "_transition", False)
            ):
                raise IssuedInvoiceError(f"invoice {self.number} is {stored['state']}")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        if self.state != InvoiceState.DRAFT:
            raise IssuedInvoiceError(f"invoice {self.number} is {self.state}")
        return super().delete(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.number or 'draft'} {self.tenant} {self.period_start:%Y-%m}"


class InvoiceLine(models.Model):
    """Usage of one version at one priority class in an invoice's month, or an adjustment."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    description = models.CharField(max_length=200)
    model_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    priority = models.CharField(max_length=16, blank=True)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)  # cached ones included
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    # The part of `amount` the cached tokens cost, at the cached-input price.
    cached_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal(0))
    amount = models.DecimalField(max_digits=14, decimal_places=2)

    class Meta:
        ordering = ["id"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.invoice.state != InvoiceState.DRAFT:
            raise IssuedInvoiceError(f"invoice {self.invoice.number} is {self.invoice.state}")
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.description}: {self.amount}"


class Adjustment(models.Model):
    """A credit (negative) or charge for a tenant, billed on the next invoice built."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="adjustments")
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    reason = models.CharField(max_length=200)
    invoice = models.ForeignKey(
        Invoice, null=True, blank=True, on_delete=models.SET_NULL, related_name="adjustments"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.amount} ({self.reason})"


class BudgetAlert(models.Model):
    """A tenant's month spend crossed a share of its budget; sent once per threshold."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="budget_alerts")
    month = models.DateField()  # the first day of the month (UTC)
    threshold = models.PositiveSmallIntegerField()  # percent: 50, 80, 100
    spent = models.DecimalField(max_digits=14, decimal_places=2)
    budget = models.DecimalField(max_digits=12, decimal_places=2)
    recipients = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-month", "-threshold"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "month", "threshold"], name="budget_alert_once"
            )
        ]

    @property
    def message(self) -> str:
        if self.threshold >= 100:
            return (
                f"{self.tenant.slug} has spent {self.spent} of its {self.budget} monthly budget: "
                "new requests are refused (budget_exceeded) until the budget is raised or the "
                "month ends."
            )
        return (
            f"{self.tenant.slug} has spent {self.spent} of its {self.budget} monthly budget "
            f"({self.threshold}% reached)."
        )

    def __str__(self) -> str:
        return f"{self.tenant} {self.month:%Y-%m} {self.threshold}%"
