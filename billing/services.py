"""Turn usage events into usage records, exactly once per request."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction

from billing.models import UsageRecord
from inference.types import UsageEvent
from models_registry.models import ModelVersion
from tenants.models import ApiKey, Tenant

_THOUSAND = Decimal(1000)


def _when(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC)


def _maybe_when(ts: float | None) -> dt.datetime | None:
    return _when(ts) if ts is not None else None


def usage_cost(*, version: ModelVersion, prompt_tokens: int, completion_tokens: int) -> Decimal:
    """Return what a request costs at its version's prices."""
    return (
        version.price_input_per_1k * prompt_tokens + version.price_output_per_1k * completion_tokens
    ) / _THOUSAND


@dataclass(frozen=True)
class IngestResult:
    recorded: int
    refused: list[UsageEvent]
    costs: dict[str, Decimal]  # request id -> cost, for every event not refused


def usage_ingest(*, events: list[UsageEvent]) -> IngestResult:
    """Write usage records for events not yet recorded.

    Idempotent: the request id is unique, so a replayed event (an ingester that crashed before
    acknowledging) is skipped rather than counted twice. Events whose tenant or version no
    longer exists are returned as refused instead of failing the whole batch.
    """
    if not events:
        return IngestResult(recorded=0, refused=[], costs={})
    versions = {
        v.digest: v
        for v in ModelVersion.objects.filter(digest__in={e.model_version for e in events})
    }
    tenants = set(
        Tenant.objects.filter(pk__in={e.tenant_id for e in events}).values_list("pk", flat=True)
    )
    keys = set(
        ApiKey.objects.filter(pk__in={e.api_key_id for e in events}).values_list("pk", flat=True)
    )
    records = []
    refused = []
    for event in events:
        version = versions.get(event.model_version)
        if version is None or event.tenant_id not in tenants:
            refused.append(event)
            continue
        records.append(
            UsageRecord(
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                api_key_id=event.api_key_id if event.api_key_id in keys else None,
                model_version=version,
                deployment=event.deployment,
                endpoint=event.endpoint,
                status=str(event.status),
                finish_reason=event.finish_reason,
                error_code=event.error_code,
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                cost=Decimal(0)
                if event.shadow
                else usage_cost(
                    version=version,
                    prompt_tokens=event.prompt_tokens,
                    completion_tokens=event.completion_tokens,
                ),
                shadow=event.shadow,
                enqueued_at=_when(event.enqueued_at),
                started_at=_maybe_when(event.started_at),
                first_token_at=_maybe_when(event.first_token_at),
                finished_at=_when(event.finished_at),
            )
        )
    ids = [r.request_id for r in records]
    with transaction.atomic():
        before = UsageRecord.objects.filter(request_id__in=ids).count()
        UsageRecord.objects.bulk_create(records, ignore_conflicts=True)
        after = UsageRecord.objects.filter(request_id__in=ids).count()
    costs = {r.request_id: r.cost for r in records}
    return IngestResult(recorded=after - before, refused=refused, costs=costs)
