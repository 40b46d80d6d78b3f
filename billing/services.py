"""Turn usage events into usage records, exactly once per request."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db import transaction

from billing.models import UsageRecord
from inference.types import UsageEvent
from models_registry.models import ModelVersion

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


def usage_ingest(*, events: list[UsageEvent]) -> int:
    """Write usage records for events not yet recorded; return how many were new.

    Idempotent: the request id is unique, so a replayed event (an ingester that crashed before
    acknowledging) is skipped rather than counted twice.
    """
    if not events:
        return 0
    digests = {e.model_version for e in events}
    versions = {v.digest: v for v in ModelVersion.objects.filter(digest__in=digests)}
    records = []
    for event in events:
        version = versions[event.model_version]
        records.append(
            UsageRecord(
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                api_key_id=event.api_key_id,
                model_version=version,
                deployment=event.deployment,
                endpoint=event.endpoint,
                status=str(event.status),
                finish_reason=event.finish_reason,
                error_code=event.error_code,
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                cost=usage_cost(
                    version=version,
                    prompt_tokens=event.prompt_tokens,
                    completion_tokens=event.completion_tokens,
                ),
                enqueued_at=_when(event.enqueued_at),
                started_at=_maybe_when(event.started_at),
                first_token_at=_maybe_when(event.first_token_at),
                finished_at=_when(event.finished_at),
            )
        )
    with transaction.atomic():
        before = UsageRecord.objects.filter(request_id__in=[r.request_id for r in records]).count()
        UsageRecord.objects.bulk_create(records, ignore_conflicts=True)
        after = UsageRecord.objects.filter(request_id__in=[r.request_id for r in records]).count()
    return after - before
