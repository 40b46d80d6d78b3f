"""The usage ingester: moves usage events from Redis into Postgres and reclaims lapsed leases.

Nothing on the request path writes to Postgres; this loop does, in batches. An event is
acknowledged only after its record is committed, so a crash replays it and the unique
request id makes the replay harmless. When its loop starts, starts again after a failure or
finds Redis again after an outage, it first takes up the events it read itself and did not
acknowledge; events another ingester left are claimed once idle for STALE_PENDING_MS.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from decimal import Decimal

import redis
import redis.asyncio as aredis
from django.conf import settings
from django.db import DatabaseError

from billing.metrics import TenantLabels, usage_recorded
from billing.services import IngestResult, usage_ingest
from config.db import db_call
from dataplane.background import loop_failed, loop_ok, supervise
from dataplane.quotas import MICROS, Quotas, Usage
from dataplane.reaper import Reaper
from dataplane.redis_client import UNREACHABLE, Outage
from dataplane.types import UsageEvent
from dataplane.usage import UsageStream
from models_registry.models import Deployment

log = logging.getLogger(__name__)

BATCH = 4000
STALE_PENDING_MS = 30_000
GATHER_SECONDS = 0.25


def _deployment_names() -> list[str]:
    return list(Deployment.objects.values_list("name", flat=True))


class Ingester:
    def __init__(
        self,
        *,
        client: aredis.Redis,
        consumer: str,
        reply_ttl: int = 900,
        tenant_labels: TenantLabels | None = None,
    ) -> None:
        self.usage = UsageStream(client)
        self.reaper = Reaper(
            client, reply_ttl=reply_ttl, lease_seconds=settings.ROUNDHOUSE_LEASE_SECONDS
        )
        self.tenant_labels = tenant_labels or TenantLabels(settings.ROUNDHOUSE_METRICS_MAX_TENANTS)
        self.quotas = Quotas(client)
        self.consumer = consumer
        self._stopping = asyncio.Event()
        self._deployments: list[str] = []
        self._deployments_at = 0.0
        self._finishing: asyncio.Task[None] | None = None
        self._reap_at = 0.0  # monotonic time of the next reap
        # Whether to take up this consumer's own unacknowledged events before new ones: set
        # whenever the loop (re)starts or finds Redis again.
        self._own_pending_due = False
        self.ingested = 0

    async def _settle(self, events: list[UsageEvent], costs: dict[str, Decimal]) -> None:
        """Settle the quota reservations of ended requests whose frontend did not."""
        await self.quotas.release_many(
            [
                (
                    event.tenant_id,
                    event.request_id,
                    event.enqueued_at,
                    Usage(
                        tokens=event.prompt_tokens + event.completion_tokens,
                        cost_micros=math.ceil(costs[event.request_id] * MICROS),
                    ),
                )
                for event in events
                # A shadow copy reserved nothing; a refused event has no cost.
                if event.request_id in costs and not event.shadow
            ]
        )

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Ingest until stopped; the loop starts again after any failure (see background)."""
        await supervise("ingester", self._run)
        await self._finished()  # stopping: the last batch is settled and acknowledged first

    async def _run(self) -> None:
        # While one batch is settled and acknowledged in Redis, the next is read and written
        # to PostgreSQL: two stages, one batch each, so neither server waits for the other.
        outage = Outage("ingesting usage", log)
        # Started, or started again after a failure: a batch this consumer recorded but did not
        # settle and acknowledge is taken up at once, not after STALE_PENDING_MS.
        self._own_pending_due = True
        while not self._stopping.is_set():
            try:
                await self._step()
                if outage.since is not None:
                    # Found again: give the workers a whole lease from now to renew theirs.
                    self._reap_at = time.monotonic() + settings.ROUNDHOUSE_LEASE_SECONDS
                outage.ok()
                loop_ok("ingester")
            except UNREACHABLE as exc:
                # Leases lapse while Redis is down though their workers live; the workers renew
                # them within a quarter lease of its return, so reaping waits a whole lease
                # (counted again from the first call that succeeds, above).
                self._reap_at = max(
                    self._reap_at, time.monotonic() + settings.ROUNDHOUSE_LEASE_SECONDS
                )
                self._own_pending_due = True
                await asyncio.sleep(outage.failed(exc))
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # Redis came back without its data (no persistence): make the groups again.
                log.error("usage consumer groups are gone; creating them again")
                self._deployments_at = 0.0
                self._deployments = []

    async def _step(self) -> None:
        """Reap when due, then read a batch of usage events and record it."""
        deployments = await self._refresh_deployments()
        if self._own_pending_due:
            await self._finished()
            own = await self.usage.read_usage(
                deployments=deployments, consumer=self.consumer, count=BATCH, pending=True
            )
            if own:
                log.warning("taking up %d usage events read before and not settled", len(own))
                await self._ingest(own)
            self._own_pending_due = len(own) >= BATCH  # more of them: on the next step
        if time.monotonic() >= self._reap_at:
            self._reap_at = time.monotonic() + 1.0
            await self._finished()
            await self._reap(deployments)
        entries = await self.usage.read_usage(
            deployments=deployments, consumer=self.consumer, count=BATCH, block_ms=500
        )
        if not entries:
            if not deployments:
                await asyncio.sleep(0.5)
            return
        recorded = await self._record(entries)
        await self._finished()
        self._finishing = asyncio.create_task(self._finish(entries, recorded))
        if len(entries) < BATCH:
            # Let a few more events gather: one insert per fraction of a second instead of
            # one per request keeps the ingester's CPU off the machine's hot path.
            await asyncio.sleep(GATHER_SECONDS)

    async def _finished(self) -> None:
        """Wait for the batch being settled; if that failed, raise it here, once.

        A batch left unacknowledged by a failure is taken over as stale and recorded once.
        """
        finishing, self._finishing = self._finishing, None
        if finishing is not None:
            await finishing

    async def _refresh_deployments(self) -> list[str]:
        if time.monotonic() - self._deployments_at > 5.0:
            try:
                names = await db_call(_deployment_names)
            except DatabaseError as exc:
                # PostgreSQL stalled or restarting: the usage of the deployments known so far
                # is read on (and written once it is back); the list is asked for again later.
                log.warning("could not list deployments (%s); using the last list", exc)
                self._deployments_at = time.monotonic()
                return self._deployments
            for name in set(names) - set(self._deployments):
                await self.usage.ensure_groups(name)
            self._deployments = names
            self._deployments_at = time.monotonic()
        return self._deployments

    async def _reap(self, deployments: list[str]) -> None:
        reaped = True
        for name in deployments:
            try:
                reclaimed = await self.reaper.reclaim_expired(deployment=name)
                if reclaimed:
                    log.warning("reclaimed %d jobs with lapsed leases on %s", reclaimed, name)
                overdue = await self.reaper.expire_queued(deployment=name)
                if overdue:
                    log.info("ended %d queued jobs past their deadline on %s", overdue, name)
                stale = await self.usage.reclaim_usage(
                    deployment=name, consumer=self.consumer, min_idle_ms=STALE_PENDING_MS
                )
                if stale:
                    await self._ingest(stale)
            except Exception as exc:
                # One deployment's failure does not hold up the others' reaping.
                loop_failed("reaper", exc)
                reaped = False
        if reaped:
            loop_ok("reaper")

    async def _ingest(self, entries: list[tuple[str, str, UsageEvent]]) -> None:
        await self._finish(entries, await self._record(entries))

    async def _record(self, entries: list[tuple[str, str, UsageEvent]]) -> IngestResult:
        """Write a batch's usage records (committed when this returns)."""
        events = [event for _, _, event in entries]
        while True:
            try:
                return await db_call(usage_ingest, events=events)
            except Exception:
                # Postgres is unavailable: keep the batch unacknowledged and retry.
                log.exception("usage ingest failed; retrying")
                await asyncio.sleep(1.0)

    async def _finish(
        self, entries: list[tuple[str, str, UsageEvent]], result: IngestResult
    ) -> None:
        """Settle a recorded batch's reservations, then acknowledge it."""
        events = [event for _, _, event in entries]
        deployments = {event.request_id: deployment for deployment, _, event in entries}
        for event in result.refused:
            log.error("usage of %s refused: its tenant or version is gone", event.request_id)
            await self.usage.dead_letter_usage(
                deployment=deployments[event.request_id], event=event, reason="unknown owner"
            )
        outage = Outage("settling usage", log)
        while True:
            try:
                # Settling is idempotent per request, so a retry after a half-done try is safe.
                await self._settle(events, result.costs)
                await self.usage.ack_usage(entries=[(d, e) for d, e, _ in entries])
                break
            except UNREACHABLE as exc:
                if self._stopping.is_set():
                    # Left pending: the next ingester takes it over and records it once.
                    return
                await asyncio.sleep(outage.failed(exc))
        outage.ok()
        self.ingested += result.recorded
        usage_recorded(
            result.tenant_tokens,
            recorded=result.recorded,
            labels=self.tenant_labels,
            billed=result.version_billed,
        )
