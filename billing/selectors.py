"""Read-only queries over usage: tenant queries take the tenant; version SLIs are for operators."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDay
from django.utils import timezone

from billing.models import UsageRecord
from billing.services import usage_cost
from models_registry.models import ModelVersion


def month_start(now: dt.datetime | None = None) -> dt.datetime:
    """Return the start of the UTC calendar month of a moment (default: now)."""
    now = (now or timezone.now()).astimezone(dt.UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def tenant_month_spend(*, tenant_id: int, now: dt.datetime | None = None) -> Decimal:
    """Return what a tenant's usage has cost this UTC month so far."""
    since = month_start(now)
    total = UsageRecord.objects.filter(tenant_id=tenant_id, finished_at__gte=since).aggregate(
        total=Sum("cost")
    )["total"]
    return total or Decimal(0)


def tenant_month_spend_micros(*, tenant_id: int) -> int:
    """Return what a tenant's usage records cost this calendar month (UTC), in micros."""
    return math.ceil(tenant_month_spend(tenant_id=tenant_id) * 1_000_000)


USAGE_GROUPS = {
    "day": "day",
    "model": "model_version__model__name",
    "version": "model_version__digest",
    "key": "api_key__public_id",
    "user": "user",
}
USAGE_FILTERS = {"model": "model_version__model__name", "key": "api_key__public_id", "user": "user"}


@dataclass(frozen=True)
class UsageRow:
    label: str  # the group's value: a UTC day, model name, version id, key id or user tag
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # part of prompt_tokens
    cost: Decimal
    cached_cost: Decimal  # the part of cost the cached tokens paid


def usage_aggregate(
    *,
    tenant_id: int,
    group: str,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    filters: dict[str, str] | None = None,
    limit: int | None = None,
) -> list[UsageRow]:
    """Return a tenant's usage summed by one of USAGE_GROUPS (shadow copies are not usage).

    `filters` maps USAGE_FILTERS names to exact values; `until` is exclusive.
    """
    column = USAGE_GROUPS[group]
    rows = UsageRecord.objects.filter(tenant_id=tenant_id, shadow=False)
    if since is not None:
        rows = rows.filter(finished_at__gte=since)
    if until is not None:
        rows = rows.filter(finished_at__lt=until)
    for name, value in (filters or {}).items():
        rows = rows.filter(**{USAGE_FILTERS[name]: value})
    if group == "day":
        rows = rows.annotate(day=TruncDay("finished_at", tzinfo=dt.UTC))
    aggregated = (
        rows.values(column)
        .annotate(
            requests=Count("id"),
            errors=Count("id", filter=~Q(status="ok")),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            cached=Sum("cached_tokens"),
            spent=Sum("cost"),
            cached_spent=Sum("cached_cost"),
        )
        .order_by(column)
    )
    if limit is not None:
        aggregated = aggregated[:limit]
    return [
        UsageRow(
            label=row[column].date().isoformat() if group == "day" else row[column] or "",
            requests=row["requests"],
            errors=row["errors"],
            prompt_tokens=row["prompt"] or 0,
            completion_tokens=row["completion"] or 0,
            cached_tokens=row["cached"] or 0,
            cost=row["spent"] or Decimal(0),
            cached_cost=row["cached_spent"] or Decimal(0),
        )
        for row in aggregated
    ]


@dataclass(frozen=True)
class Slis:
    """What one version's requests looked like over a window: the canary's yardstick."""

    requests: int
    errors: int
    error_rate_pct: float
    ttft_p95_ms: float | None
    itl_p95_ms: float | None
    cost_per_1k: float | None  # money per 1,000 tokens (prompt + completion) at its prices

    def as_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


_FAILED = ("error", "worker_lost", "timeout")


def version_failures(
    *, version: ModelVersion, since: dt.datetime, until: dt.datetime
) -> tuple[int, int]:
    """(requests, failed requests) a version finished in a window, counted by the database:
    the cheap half of `version_slis`, for checks that run every few seconds."""
    counted = _version_rows(version, since, until).aggregate(
        requests=Count("id"), errors=Count("id", filter=Q(status__in=_FAILED))
    )
    return counted["requests"], counted["errors"]


def _version_rows(
    version: ModelVersion, since: dt.datetime, until: dt.datetime | None
) -> QuerySet[UsageRecord]:
    """A version's usage records that finished in a window, cancelled requests left out."""
    rows = UsageRecord.objects.filter(model_version=version, finished_at__gte=since).exclude(
        status="cancelled"
    )
    return rows if until is None else rows.filter(finished_at__lt=until)


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)], 3)


def version_slis(
    *, version: ModelVersion, since: dt.datetime, until: dt.datetime | None = None
) -> Slis:
    """Return a version's request SLIs over a window, shadow copies included.

    Requests the client cancelled count for neither side. TTFT runs from admission to the
    first token, so time queued for a slow version counts; inter-token latency is a request's
    mean gap between tokens.
    """
    rows = _version_rows(version, since, until)
    requests = errors = 0
    prompt = completion = 0
    ttfts: list[float] = []
    itls: list[float] = []
    for row in rows.only(
        "status", "prompt_tokens", "completion_tokens", "enqueued_at", "first_token_at",
        "finished_at",
    ).iterator():  # fmt: skip
        requests += 1
        errors += row.status in _FAILED
        prompt += row.prompt_tokens
        completion += row.completion_tokens
        if row.first_token_at is not None:
            ttfts.append((row.first_token_at - row.enqueued_at).total_seconds() * 1000)
            if row.completion_tokens > 1:
                gaps = row.completion_tokens - 1
                itls.append((row.finished_at - row.first_token_at).total_seconds() * 1000 / gaps)
    # Priced once for the window: cost is linear in tokens (shadow rows are stored at 0).
    tokens = prompt + completion
    cost = usage_cost(version=version, prompt_tokens=prompt, completion_tokens=completion)
    return Slis(
        requests=requests,
        errors=errors,
        error_rate_pct=round(100 * errors / requests, 3) if requests else 0.0,
        ttft_p95_ms=_p95(ttfts),
        itl_p95_ms=_p95(itls),
        cost_per_1k=float(round(cost * 1000 / tokens, 6)) if tokens else None,
    )
