"""A worker's Prometheus series (docs/metrics.md), served on its own port
(`dataplane.metrics.metrics_serve`, which labels vLLM's own `vllm:*` series with the deployment).

The engine adapter reports each finished request's engine stages (`EngineStats`); the worker
loop reports each request's platform-side timings and engine time when it ends, the seconds its
engine ran nothing, each restart of a dead engine, and with each heartbeat what each tenant
holds on the worker; the dynamic batcher reports its batches. The series a zone's loss or a
zone's cost shows in carry the worker's zone (ROUNDHOUSE_ZONE).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping

from django.conf import settings
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from billing.metrics import TenantLabels
from dataplane.metrics import LATENCY_BUCKETS, TTFT_BUCKETS, stage_seconds
from dataplane.types import Job, UsageEvent

log = logging.getLogger(__name__)

platform_ttft = Histogram(
    "roundhouse_time_to_first_token_seconds",
    "First token minus admission: the TTFT the objective is about.",
    ["deployment", "priority"],
    buckets=TTFT_BUCKETS,
)
requests_ended = Counter(
    "roundhouse_worker_requests", "Requests a worker ended, by status.", ["deployment", "status"]
)
generated_tokens = Counter(
    "roundhouse_generated_tokens", "Completion tokens produced.", ["deployment"]
)
# A request's time on the engine (finished - started, the worker's clock) and its tokens, per
# version: their ratio is the serving cost the canary analysis compares (docs/metrics.md).
engine_seconds = Counter(
    "roundhouse_engine_seconds",
    "Seconds requests ran on a worker's engine: finished minus started, per version.",
    ["deployment", "version", "zone"],
)
served_tokens = Counter(
    "roundhouse_served_tokens",
    "Prompt and completion tokens of the requests a worker's engine ran, per version.",
    ["deployment", "version", "zone"],
)
idle_seconds = Counter(
    "roundhouse_worker_idle_seconds",
    "Seconds a worker's engine had no request running.",
    ["deployment", "zone"],
)
ENGINE_DEATHS = ("crash", "oom")  # workers.engine.engine_death_reason
engine_restarts = Counter(
    "roundhouse_engine_restarts",
    "Engines a worker found dead and started again, by why they died (crash, oom).",
    ["deployment", "zone", "reason"],
)
batch_size = Histogram(
    "roundhouse_encoder_batch_size",
    "Inputs per forward pass.",
    ["deployment"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
batch_fill = Histogram(
    "roundhouse_encoder_batch_fill_ratio",
    "Inputs per forward pass over max_batch_size.",
    ["deployment"],
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
)
batch_seconds = Histogram(
    "roundhouse_encoder_batch_seconds",
    "One forward pass.",
    ["deployment"],
    buckets=LATENCY_BUCKETS,
)


# Tenant ids to their slugs, for the `tenant` label (a database read, off the event loop).
SlugsOf = Callable[[Collection[int]], Mapping[int, str]]


class _TenantsHeld(Collector):
    """Each tenant's KV-cache blocks on this process's workers, as their last heartbeat said.

    Read when scraped, in the metrics server's thread: a tenant first seen then has its slug
    looked up once. `tenant` is capped as every tenant label is (docs/metrics.md).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[dict[int, int], SlugsOf]] = {}
        self._slugs: dict[int, str] = {}
        self._labels: TenantLabels | None = None

    def hold(self, deployment: str, blocks: dict[int, int], slugs_of: SlugsOf) -> None:
        self._held[deployment] = (blocks, slugs_of)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "roundhouse_worker_tenant_kv_blocks",
            "KV-cache blocks a tenant's sequences hold on this worker's engine.",
            labels=["deployment", "tenant"],
        )
        with self._lock:
            if self._labels is None:
                self._labels = TenantLabels(settings.ROUNDHOUSE_METRICS_MAX_TENANTS)
            for deployment, (blocks, slugs_of) in list(self._held.items()):
                unknown = blocks.keys() - self._slugs.keys()
                if unknown:
                    try:
                        self._slugs.update(slugs_of(unknown))
                    except Exception:  # the database is away: those tenants wait a scrape
                        log.warning("could not name tenants %s for the KV series", sorted(unknown))
                sums: dict[str, int] = {}
                for tenant, count in blocks.items():
                    slug = self._slugs.get(tenant)
                    if slug is not None:
                        label = self._labels(slug)
                        sums[label] = sums.get(label, 0) + count
                for label, count in sorted(sums.items()):
                    family.add_metric([deployment, label], count)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


tenants_held = _TenantsHeld()
REGISTRY.register(tenants_held)


class WorkerMetrics:
    """The series of one deployment's worker process, with its labels bound.

    `slugs_of` names tenants for the per-tenant series (None: that series stays empty).
    """

    def __init__(self, *, deployment: str, slugs_of: SlugsOf | None = None) -> None:
        self.deployment = deployment
        self._slugs_of = slugs_of
        self._engine_queue = stage_seconds.labels(stage="engine_queue", deployment=deployment)
        self._prefill = stage_seconds.labels(stage="prefill", deployment=deployment)
        self._decode = stage_seconds.labels(stage="decode", deployment=deployment)
        self._platform_queue = stage_seconds.labels(stage="platform_queue", deployment=deployment)
        self._generated = generated_tokens.labels(deployment=deployment)
        self._batch_size = batch_size.labels(deployment=deployment)
        self._batch_fill = batch_fill.labels(deployment=deployment)
        self._batch_seconds = batch_seconds.labels(deployment=deployment)
        self.zone = settings.ROUNDHOUSE_ZONE
        self._idle = idle_seconds.labels(deployment=deployment, zone=self.zone)
        # At 0 from the start: the first restart is then an increase, which alerts can see.
        for reason in ENGINE_DEATHS:
            engine_restarts.labels(deployment=deployment, zone=self.zone, reason=reason)

    # --- engine (EngineStats) ----------------------------------------------------------

    def finished(
        self,
        *,
        queued: float,
        prefill: float,
        decode: float,
        request_id: str = "",
        preemptions: int = 0,
    ) -> None:
        # Preemptions are vLLM's own series (vllm:num_preemptions); the request id labels none.
        self._engine_queue.observe(queued)
        self._prefill.observe(prefill)
        self._decode.observe(decode)

    # --- the worker loop ---------------------------------------------------------------

    def request_ended(self, job: Job, usage: UsageEvent) -> None:
        """Count a request's end and observe the timings only the platform knows."""
        requests_ended.labels(deployment=self.deployment, status=str(usage.status)).inc()
        if usage.completion_tokens:
            self._generated.inc(usage.completion_tokens)
        if usage.started_at is not None:
            self._platform_queue.observe(max(usage.started_at - job.enqueued_at, 0.0))
            self._served(usage, started_at=usage.started_at)
        if usage.first_token_at is not None:
            platform_ttft.labels(deployment=self.deployment, priority=job.priority).observe(
                max(usage.first_token_at - job.enqueued_at, 0.0)
            )

    def _served(self, usage: UsageEvent, *, started_at: float) -> None:
        """Count a started request's engine seconds and tokens against its version.

        The same sums as the usage records' Σ(finished_at - started_at) and Σ tokens, shadow
        copies included: a run handed on from another worker counts from its first start.
        """
        # The short version id clients pin (`name@version`), as the billing series carry it.
        version = usage.model_version[:12]
        labels = {"deployment": self.deployment, "version": version, "zone": self.zone}
        engine_seconds.labels(**labels).inc(max(usage.finished_at - started_at, 0.0))
        served_tokens.labels(**labels).inc(usage.prompt_tokens + usage.completion_tokens)

    def idle(self, seconds: float) -> None:
        """Count seconds the engine had nothing running."""
        self._idle.inc(seconds)

    def engine_restarted(self, reason: str) -> None:
        """Count an engine found dead and started again (`crash` or `oom`)."""
        engine_restarts.labels(deployment=self.deployment, zone=self.zone, reason=reason).inc()

    def tenants_held(self, loads: Mapping[int, tuple[int, int]]) -> None:
        """Note what each tenant holds on the worker now: (sequences, KV-cache blocks).

        Tenants holding no blocks leave the series.
        """
        if self._slugs_of is not None:
            blocks = {tenant: kv for tenant, (_, kv) in loads.items() if kv > 0}
            tenants_held.hold(self.deployment, blocks, self._slugs_of)

    # --- the dynamic batcher -----------------------------------------------------------

    def batch(
        self, *, inputs: int, max_batch_size: int, seconds: float, waits: list[float]
    ) -> None:
        """Observe one forward pass: its size and time, and how long its inputs waited."""
        self._batch_size.observe(inputs)
        self._batch_fill.observe(inputs / max(max_batch_size, 1))
        self._batch_seconds.observe(seconds)
        for wait in waits:
            self._engine_queue.observe(wait)
            self._prefill.observe(seconds)
