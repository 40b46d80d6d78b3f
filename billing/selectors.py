"""Read-only queries over usage: tenant queries take the tenant; version SLIs are for operators."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Sum,
)
from django.db.models.functions import TruncDay, TruncMinute
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
    cache_created_tokens: int = 0  # part of prompt_tokens: written to the prefix cache
    reasoning_tokens: int = 0  # part of completion_tokens: a reasoning model's thinking


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
            created=Sum("cache_created_tokens"),
            thought=Sum("reasoning_tokens"),
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
            cache_created_tokens=row["created"] or 0,
            reasoning_tokens=row["thought"] or 0,
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
    # Serving cost: seconds on the engine (started → finished) per 1,000 tokens.
    engine_seconds_per_1k: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


_FAILED = ("error", "worker_lost", "timeout")


def version_failures(
    *,
    version: ModelVersion,
    since: dt.datetime,
    until: dt.datetime,
    tenant_ids: Collection[int] | None = None,
) -> tuple[int, int]:
    """(requests, failed requests) a version finished in a window, counted by the database:
    the cheap half of `version_slis`, for checks that run every few seconds."""
    counted = _version_rows(version, since, until, tenant_ids).aggregate(
        requests=Count("id"), errors=Count("id", filter=Q(status__in=_FAILED))
    )
    return counted["requests"], counted["errors"]


def _version_rows(
    version: ModelVersion,
    since: dt.datetime,
    until: dt.datetime | None,
    tenant_ids: Collection[int] | None = None,
) -> QuerySet[UsageRecord]:
    """A version's usage records that finished in a window, cancelled requests left out
    (of the tenants named only, when `tenant_ids` is given: a canary scoped to them)."""
    rows = UsageRecord.objects.filter(model_version=version, finished_at__gte=since).exclude(
        status="cancelled"
    )
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    return rows if until is None else rows.filter(finished_at__lt=until)


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)], 3)


def version_slis(
    *,
    version: ModelVersion,
    since: dt.datetime,
    until: dt.datetime | None = None,
    tenant_ids: Collection[int] | None = None,
) -> Slis:
    """Return a version's request SLIs over a window, shadow copies included.

    Requests the client cancelled count for neither side. TTFT runs from admission to the
    first token, so time queued for a slow version counts; inter-token latency is a request's
    mean gap between tokens. With `tenant_ids`, only those tenants' requests count.
    """
    rows = _version_rows(version, since, until, tenant_ids)
    requests = errors = 0
    prompt = completion = 0
    engine_seconds = 0.0
    ttfts: list[float] = []
    itls: list[float] = []
    for row in rows.only(
        "status", "prompt_tokens", "completion_tokens", "enqueued_at", "started_at",
        "first_token_at", "finished_at",
    ).iterator():  # fmt: skip
        requests += 1
        errors += row.status in _FAILED
        prompt += row.prompt_tokens
        completion += row.completion_tokens
        if row.started_at is not None:
            engine_seconds += max(0.0, (row.finished_at - row.started_at).total_seconds())
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
        engine_seconds_per_1k=round(engine_seconds * 1000 / tokens, 6) if tokens else None,
    )


@dataclass(frozen=True)
class ServingCost:
    """What a version's requests cost to serve over a window, in engine time."""

    requests: int
    tokens: int  # prompt + completion
    engine_seconds: float  # Σ (finished - started): each request's time on the engine

    @property
    def per_1k(self) -> float | None:
        """Engine-seconds per 1,000 tokens; None without tokens."""
        return round(self.engine_seconds * 1000 / self.tokens, 6) if self.tokens else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "engine_seconds": round(self.engine_seconds, 3),
            "engine_seconds_per_1k": self.per_1k,
        }


def version_serving_cost(
    *,
    version: ModelVersion,
    since: dt.datetime,
    until: dt.datetime,
    tenant_ids: Collection[int] | None = None,
) -> ServingCost:
    """Return a version's engine time and tokens over a window, summed by the database.

    Requests that never reached an engine (no `started_at`) count as requests, not as time.
    """
    summed = _version_rows(version, since, until, tenant_ids).aggregate(
        requests=Count("id"),
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        engine=Sum(
            ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField()),
            filter=Q(started_at__isnull=False),
        ),
    )
    engine = summed["engine"] or dt.timedelta(0)
    return ServingCost(
        requests=summed["requests"],
        tokens=(summed["prompt"] or 0) + (summed["completion"] or 0),
        engine_seconds=max(0.0, engine.total_seconds()),
    )


@dataclass(frozen=True)
class SloWindow:
    """Good and bad events of each SLO's SLI over one window (the burn-rate alerts' SLIs).

    - availability: requests, and those the platform failed (error, worker_lost, timeout);
    - ttft: interactive requests that got a first token, and those later than the objective;
    - itl: inter-token gaps (completion tokens - 1 of a request), and the gaps of requests
      whose mean gap was longer than the objective (a request's gaps are not stored apart).
    """

    seconds: float
    requests: int = 0
    failed: int = 0
    ttft_events: int = 0
    ttft_slow: int = 0
    itl_events: int = 0
    itl_slow: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def version_slo_windows(
    *,
    version: ModelVersion,
    until: dt.datetime,
    windows: Collection[float],
    ttft_ms: float,
    itl_ms: float,
    tenant_ids: Collection[int] | None = None,
) -> list[SloWindow]:
    """Return a version's SLI events over each of `windows` (seconds) before `until`.

    One query over the longest window; rows are bucketed here. Cancelled requests count for
    no SLI, as in `version_slis`.
    """
    ordered = [float(seconds) for seconds in windows]
    since = until - dt.timedelta(seconds=max(ordered))
    fields = ("requests", "failed", "ttft_events", "ttft_slow", "itl_events", "itl_slow")
    counts = [dict.fromkeys(fields, 0) for _ in ordered]
    ttft = dt.timedelta(milliseconds=ttft_ms)
    rows = _version_rows(version, since, until, tenant_ids).values_list(
        "status", "priority", "completion_tokens", "enqueued_at", "first_token_at", "finished_at"
    )
    for status, priority, completion, enqueued, first, finished in rows.iterator():
        age = (until - finished).total_seconds()
        gaps = slow_itl = 0
        if first is not None and completion > 1:
            gaps = completion - 1
            slow_itl = (finished - first).total_seconds() * 1000 / gaps > itl_ms
        for seconds, count in zip(ordered, counts, strict=True):
            if age > seconds:
                continue
            count["requests"] += 1
            count["failed"] += status in _FAILED
            if first is not None and priority == "interactive":
                count["ttft_events"] += 1
                count["ttft_slow"] += first - enqueued > ttft
            count["itl_events"] += gaps
            count["itl_slow"] += gaps if slow_itl else 0
    return [
        SloWindow(seconds=seconds, **count) for seconds, count in zip(ordered, counts, strict=True)
    ]


class _Percentile(Aggregate):
    """PostgreSQL's continuous percentile of an expression within each group."""

    function = "PERCENTILE_CONT"
    name = "Percentile"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, *, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


@dataclass(frozen=True)
class DeploymentLoad:
    """What one deployment served in one span (a minute, or the whole window)."""

    deployment: str
    start: dt.datetime | None  # the minute; None for the whole window
    requests: int
    failed: int
    completion_tokens: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None


def _load_rows(since: dt.datetime, until: dt.datetime) -> QuerySet[UsageRecord]:
    """The requests deployments finished in a window: answers from the response cache never
    reached one, so they are left out."""
    return UsageRecord.objects.filter(
        finished_at__gte=since, finished_at__lt=until, response_cache=False
    )


def _ms(value: dt.timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds() * 1000, 1)


def deployment_load(
    *, since: dt.datetime, until: dt.datetime
) -> tuple[list[DeploymentLoad], list[DeploymentLoad]]:
    """Each deployment's load over a window, for operators: per minute, and the window whole.

    Counted by the database from the usage records (an hour of a busy platform is too many
    rows to read): requests finished, those that failed on the platform's side, output
    tokens, and the time to first token from admission (p50, p95). Shadow copies count: they
    ran on the deployment.
    """
    ttft = ExpressionWrapper(F("first_token_at") - F("enqueued_at"), output_field=DurationField())
    figures = {
        "requests": Count("id"),
        "failed": Count("id", filter=Q(status__in=_FAILED)),
        "tokens": Sum("completion_tokens"),
        "p50": _Percentile(ttft, fraction=0.5, output_field=DurationField()),
        "p95": _Percentile(ttft, fraction=0.95, output_field=DurationField()),
    }
    rows = _load_rows(since, until)
    minutes = (
        rows.annotate(minute=TruncMinute("finished_at", tzinfo=dt.UTC))
        .values("deployment", "minute")
        .annotate(**figures)
        .order_by("deployment", "minute")
    )
    whole = rows.values("deployment").annotate(**figures).order_by("deployment")

    def load(row: Mapping[str, Any], start: dt.datetime | None) -> DeploymentLoad:
        return DeploymentLoad(
            deployment=row["deployment"],
            start=start,
            requests=row["requests"],
            failed=row["failed"],
            completion_tokens=row["tokens"] or 0,
            ttft_p50_ms=_ms(row["p50"]),
            ttft_p95_ms=_ms(row["p95"]),
        )

    return [load(row, row["minute"]) for row in minutes], [load(row, None) for row in whole]
