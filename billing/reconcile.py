"""Reconcile, per deployment and admission hour, three independent counts of the same requests.

- admitted: requests the data plane queued (the enqueue script counts them as it queues);
- finished: requests finished exactly once, with their tokens (the finish script counts them,
  whether a worker, the reaper or a cancel finished them);
- recorded: usage records in PostgreSQL for requests admitted in that hour.

All three should agree once an hour's requests have all ended. A difference names the hour
and deployment and what is missing where: a lost usage event (finished > recorded), a
request that never ended (admitted > finished), or a record nobody admitted.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, Sum
from django.db.models.functions import TruncHour

from billing.models import UsageRecord
from dataplane.keys import ledger_hour, ledger_key
from dataplane.redis_client import redis_sync_client
from models_registry.models import Deployment

LEDGER_DAYS = 8  # hours older than this are pruned from the ledger


@dataclass
class HourCount:
    deployment: str
    hour: str  # YYYYMMDDHH, UTC
    admitted: int = 0
    finished: int = 0
    finished_tokens: int = 0
    recorded: int = 0
    recorded_tokens: int = 0
    settled: bool = True  # every request admitted in the hour must have ended by now

    @property
    def problems(self) -> list[str]:
        found = []
        if self.settled and self.admitted != self.finished:
            found.append(f"admitted {self.admitted} but finished {self.finished}")
        if self.finished != self.recorded:
            found.append(f"finished {self.finished} but {self.recorded} usage records")
        if self.finished_tokens != self.recorded_tokens:
            found.append(
                f"finished {self.finished_tokens} tokens but records hold {self.recorded_tokens}"
            )
        return found


def usage_reconcile(*, hours: int = 24, now: dt.datetime | None = None) -> list[HourCount]:
    """Return every deployment's counts for the last `hours` admission hours, oldest first."""
    now = now or dt.datetime.now(dt.UTC)
    since = (now - dt.timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)
    # An hour is settled once its last request's longest possible life has passed.
    settled_before = now - dt.timedelta(seconds=settings.ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS + 60)
    prune_before = ledger_hour((now - dt.timedelta(days=LEDGER_DAYS)).timestamp())
    since_hour = ledger_hour(since.timestamp())
    client = redis_sync_client()
    counts: dict[tuple[str, str], HourCount] = {}

    def count(deployment: str, hour: str) -> HourCount:
        key = (deployment, hour)
        if key not in counts:
            start = dt.datetime.strptime(hour, "%Y%m%d%H").replace(tzinfo=dt.UTC)
            settled = start + dt.timedelta(hours=1) <= settled_before
            counts[key] = HourCount(deployment, hour, settled=settled)
        return counts[key]

    for name in Deployment.objects.values_list("name", flat=True):
        ledger: dict[bytes, bytes] = client.hgetall(ledger_key(name))  # type: ignore[assignment]
        stale = []
        fields: dict[str, dict[str, int]] = defaultdict(dict)
        for raw_field, raw_value in ledger.items():
            hour, _, what = raw_field.decode().partition(":")
            if hour < prune_before:
                stale.append(raw_field)
            fields[hour][what] = int(raw_value)
        if stale:
            client.hdel(ledger_key(name), *stale)
        for hour, values in fields.items():
            if hour >= since_hour:
                ledgered = count(name, hour)
                ledgered.admitted = values.get("admitted", 0)
                ledgered.finished = values.get("finished", 0)
                ledgered.finished_tokens = values.get("tokens", 0)
    recorded = (
        UsageRecord.objects.filter(enqueued_at__gte=since)
        .annotate(hour=TruncHour("enqueued_at", tzinfo=dt.UTC))
        .values("deployment", "hour")
        .annotate(n=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    for row in recorded:
        hourly = count(row["deployment"], ledger_hour(row["hour"].timestamp()))
        hourly.recorded = row["n"]
        hourly.recorded_tokens = (row["prompt"] or 0) + (row["completion"] or 0)
    return sorted(counts.values(), key=lambda c: (c.hour, c.deployment))
