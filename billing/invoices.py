"""Monthly invoices: built from usage records, issued once, then never changed.

Months are UTC calendar months: a request belongs to the month in which it finished. A draft
can be rebuilt any number of times (it is replaced, lines and all); issuing numbers it and
freezes it, in the database as well as here. Corrections after issue are adjustments, which
land on the next invoice built.

Amounts: each line's exact cost (the sum of its requests' stored costs) is rounded to the
cent so that the lines add up to the month's exact total rounded half-up, the largest
remainders taking the spare cents. So the invoice total is the sum of the usage costs to
the cent, and the lines add up to it. A line's cached input tokens (prompt tokens served from
the prefix cache, counted in its prompt tokens too) show their own amount, at the
cached-input price: the rounding runs over every line's cached and other parts, so a line's
amount is its two parts added, and the parts of every line add up to the total as well.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from billing.models import Adjustment, Invoice, InvoiceLine, InvoiceState, UsageRecord
from models_registry.models import ModelVersion
from tenants.models import Tenant
from tenants.services import audit_record

CENT = Decimal("0.01")
_NUMBERING_LOCK = 0x5359_0000_0000  # advisory lock keys: this + the month's ordinal


def month_bounds(month: dt.date) -> tuple[dt.date, dt.date]:
    """Return the first day of a date's month and the first day of the next one."""
    start = month.replace(day=1)
    following = (start + dt.timedelta(days=32)).replace(day=1)
    return start, following


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


@dataclass(frozen=True)
class _Usage:
    version_id: int
    priority: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: Decimal
    cached_cost: Decimal


def _usage(tenant: Tenant, start: dt.date, end: dt.date) -> list[_Usage]:
    rows = (
        UsageRecord.objects.filter(
            tenant=tenant,
            shadow=False,
            finished_at__gte=_midnight(start),
            finished_at__lt=_midnight(end),
        )
        .values("model_version_id", "priority")
        .annotate(
            requests=Count("id"),
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_tokens"),
            completion=Sum("completion_tokens"),
            cost=Sum("cost"),
            cached_cost=Sum("cached_cost"),
        )
        .order_by("model_version_id", "priority")
    )
    return [
        _Usage(
            r["model_version_id"],
            r["priority"],
            r["requests"],
            r["prompt"] or 0,
            r["cached"] or 0,
            r["completion"] or 0,
            r["cost"] or Decimal(0),
            r["cached_cost"] or Decimal(0),
        )
        for r in rows
    ]


def cents_allocate(amounts: list[Decimal]) -> list[Decimal]:
    """Round amounts to cents so that they add up to their exact sum rounded half-up.

    Each is rounded down, then the spare cents go to the largest remainders (ties to the
    earlier amount), so no line is off by more than a cent and the total is exact.
    """
    target = sum(amounts, Decimal(0)).quantize(CENT, rounding=ROUND_HALF_UP)
    floors = [a.quantize(CENT, rounding=ROUND_DOWN) for a in amounts]
    spare = int((target - sum(floors, Decimal(0))) / CENT)
    order = sorted(range(len(amounts)), key=lambda i: (-(amounts[i] - floors[i]), i))
    step = CENT if spare >= 0 else -CENT
    for i in order[: abs(spare)]:
        floors[i] += step
    return floors


def invoice_build(*, tenant: Tenant, month: dt.date, actor: User | None = None) -> Invoice:
    """Build (or rebuild) a tenant's draft invoice for a month; an issued one is returned as is.

    A tenant with no usage gets a zero invoice, so every active tenant has one per month.
    """
    start, end = month_bounds(month)
    if _midnight(end) > timezone.now():
        raise ValidationError({"month": f"{start:%Y-%m} has not ended yet"})
    with transaction.atomic():
        Tenant.objects.select_for_update().get(pk=tenant.pk)
        invoice = (
            Invoice.objects.filter(tenant=tenant, period_start=start)
            .exclude(state=InvoiceState.VOID)
            .first()
        )
        if invoice is not None and invoice.state != InvoiceState.DRAFT:
            return invoice
        if invoice is None:
            invoice = Invoice.objects.create(tenant=tenant, period_start=start, period_end=end)
        invoice.lines.all().delete()
        usage = _usage(tenant, start, end)
        versions = ModelVersion.objects.select_related("model").in_bulk(
            {u.version_id for u in usage}
        )
        # Adjustments not yet on an invoice go on the one built next, whatever their date.
        adjustments = list(
            Adjustment.objects.filter(tenant=tenant, invoice__isnull=True)
            | Adjustment.objects.filter(invoice=invoice)
        )
        # Rounded as parts, so a line's cached amount plus its other part is exactly its amount.
        parts = cents_allocate([p for u in usage for p in (u.cost - u.cached_cost, u.cached_cost)])
        rests, cached = parts[0::2], parts[1::2]
        amounts = [rest + part for rest, part in zip(rests, cached, strict=True)]
        lines = [
            InvoiceLine(
                invoice=invoice,
                description=f"{versions[u.version_id].public_name} ({u.priority})",
                model_version_id=u.version_id,
                priority=u.priority,
                requests=u.requests,
                prompt_tokens=u.prompt_tokens,
                cached_tokens=u.cached_tokens,
                completion_tokens=u.completion_tokens,
                cached_amount=cached_amount,
                amount=amount,
            )
            for u, cached_amount, amount in zip(usage, cached, amounts, strict=True)
        ]
        lines += [
            InvoiceLine(invoice=invoice, description=f"Adjustment: {a.reason}", amount=a.amount)
            for a in adjustments
        ]
        InvoiceLine.objects.bulk_create(lines)
        Adjustment.objects.filter(pk__in=[a.pk for a in adjustments]).update(invoice=invoice)
        invoice.usage_total = sum(amounts, Decimal(0))
        invoice.adjustments_total = sum((a.amount for a in adjustments), Decimal(0))
        invoice.total = invoice.usage_total + invoice.adjustments_total
        invoice.save()
        audit_record(
            action="invoice.build",
            target_type="invoice",
            target_id=str(invoice.pk),
            tenant=tenant,
            actor=actor,
            after={"month": f"{start:%Y-%m}", "total": str(invoice.total)},
        )
    return invoice


def invoices_build(*, month: dt.date) -> list[Invoice]:
    """Build the month's draft invoice of every active tenant.

    A tenant deleted during or after the month is billed for it too: its last invoice.
    """
    start, _ = month_bounds(month)
    billed = Q(is_active=True) | Q(deleted_at__gte=_midnight(start))
    return [
        invoice_build(tenant=tenant, month=month)
        for tenant in Tenant.objects.filter(billed).order_by("pk")
    ]


def _transition(invoice: Invoice, *, to: str, actor: User | None, reason: str = "") -> Invoice:
    allowed = {
        InvoiceState.DRAFT: {InvoiceState.ISSUED, InvoiceState.VOID},
        InvoiceState.ISSUED: {InvoiceState.PAID, InvoiceState.VOID},
    }
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if to not in allowed.get(InvoiceState(invoice.state), set()):
            raise ValidationError({"state": f"a {invoice.state} invoice cannot become {to}"})
        before = invoice.state
        now = timezone.now()
        if to == InvoiceState.ISSUED:
            invoice.number = _number(invoice)
            invoice.issued_at = now
        elif to == InvoiceState.PAID:
            invoice.paid_at = now
        else:
            invoice.voided_at = now
            # A voided invoice's adjustments go to the next one built.
            Adjustment.objects.filter(invoice=invoice).update(invoice=None)
        invoice.state = to
        invoice._transition = True  # type: ignore[attr-defined]
        try:
            invoice.save()
        finally:
            del invoice._transition  # type: ignore[attr-defined]
        audit_record(
            action=f"invoice.{to}",
            target_type="invoice",
            target_id=str(invoice.pk),
            tenant=invoice.tenant,
            actor=actor,
            reason=reason,
            before={"state": before},
            after={"state": to, "number": invoice.number, "total": str(invoice.total)},
        )
    return invoice


def _number(invoice: Invoice) -> str:
    """The month's next invoice number; called inside the issuing transaction."""
    prefix = f"SY-{invoice.period_start:%Y%m}-"
    with connection.cursor() as cursor:
        # Issuers of one month take turns until their transactions end: no two get one number.
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s)", [_NUMBERING_LOCK + invoice.period_start.toordinal()]
        )
    taken = Invoice.objects.filter(number__startswith=prefix).count()
    return f"{prefix}{taken + 1:05d}"


def invoice_issue(*, invoice: Invoice, actor: User | None = None) -> Invoice:
    return _transition(invoice, to=InvoiceState.ISSUED, actor=actor)


def invoice_mark_paid(*, invoice: Invoice, actor: User | None = None) -> Invoice:
    return _transition(invoice, to=InvoiceState.PAID, actor=actor)


def invoice_void(*, invoice: Invoice, actor: User | None = None, reason: str = "") -> Invoice:
    return _transition(invoice, to=InvoiceState.VOID, actor=actor, reason=reason)


def adjustment_add(
    *, tenant: Tenant, amount: Decimal, reason: str, actor: User | None = None
) -> Adjustment:
    """Record a credit (negative) or a charge; it lands on the next invoice built."""
    if not reason.strip():
        raise ValidationError({"reason": "say why"})
    amount = amount.quantize(CENT, rounding=ROUND_HALF_UP)
    with transaction.atomic():
        adjustment = Adjustment.objects.create(
            tenant=tenant, amount=amount, reason=reason, created_by=actor
        )
        audit_record(
            action="adjustment.add",
            target_type="tenant",
            target_id=tenant.slug,
            tenant=tenant,
            actor=actor,
            reason=reason,
            after={"amount": str(amount)},
        )
    return adjustment


def invoice_csv_rows(invoice: Invoice) -> Iterator[list[str]]:
    """Yield an invoice as CSV rows: a header, one row per line, then the totals.

    `prompt_tokens` include `cached_tokens`; `cached_amount` is the part of `amount` those
    cost at the cached-input price. Like the invoice number, tenant and period, the tenant's
    training flag is on every row (the last column), so a row read on its own still says it.
    """
    yield ["invoice", "tenant", "period", "description", "requests", "prompt_tokens",
           "completion_tokens", "amount", "cached_tokens", "cached_amount", "currency",
           "training_use"]  # fmt: skip
    period = f"{invoice.period_start:%Y-%m}"
    number = invoice.number or f"draft-{invoice.pk}"
    training_use = invoice.tenant.training_use
    for line in invoice.lines.all():
        yield [number, invoice.tenant.slug, period, line.description, str(line.requests),
               str(line.prompt_tokens), str(line.completion_tokens), str(line.amount),
               str(line.cached_tokens), str(line.cached_amount), invoice.currency,
               training_use]  # fmt: skip
    yield [number, invoice.tenant.slug, period, "TOTAL", "", "", "", str(invoice.total), "", "",
           invoice.currency, training_use]  # fmt: skip
