"""What a Prometheus scrape of a frontend returns: this host's series and the platform's state.

Request series come from every process of the frontend (multi-process files when
PROMETHEUS_MULTIPROC_DIR is set, else this process). Queue depth, backlog, workers, ingest lag,
SLOs and the autoscaling signal are read from Redis at scrape time, so every frontend reports
the same values; dashboards and rules aggregate them with `max`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dataplane.autoscale import Autoscaler, ScalingPolicy
from dataplane.redis_client import redis_sync_client
from dataplane.snapshots import queue_snapshot_sync
from models_registry.models import Deployment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Objectives:
    name: str
    model_name: str
    ttft_p95_seconds: float
    itl_p95_seconds: float
    availability: float
    min_replicas: int
    max_replicas: int


def _deployments() -> list[_Objectives]:
    # Stopped ones too: a deployment whose workers all left (scaled to zero) still has a queue
    # and an autoscaling signal; a retired one reports 0 desired replicas.
    rows = Deployment.objects.select_related("version__model")
    return [
        _Objectives(
            name=d.name,
            model_name=d.version.model.name,
            ttft_p95_seconds=d.slo_ttft_p95_ms / 1000,
            itl_p95_seconds=d.slo_itl_p95_ms / 1000,
            availability=float(d.slo_availability),
            min_replicas=d.min_replicas,
            max_replicas=d.max_replicas,
        )
        for d in rows
    ]


class PlatformCollector(Collector):
    """Gauges of every live deployment's shared state, read when scraped."""

    # The deployment list changes rarely; Redis is read on every scrape.
    deployments_ttl = 10.0

    def __init__(self) -> None:
        self._client = redis_sync_client()
        self._autoscaler = Autoscaler(
            self._client, scale_down_seconds=settings.ROUNDHOUSE_SCALE_DOWN_SECONDS
        )
        self._cached: list[_Objectives] = []
        self._cached_at = -1e9

    def _objectives(self) -> list[_Objectives]:
        if time.monotonic() - self._cached_at > self.deployments_ttl:
            self._cached = _deployments()
            self._cached_at = time.monotonic()
        return self._cached

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "roundhouse_queue_depth",
            "Jobs waiting for a worker.",
            labels=["deployment", "priority"],
        )
        age = GaugeMetricFamily(
            "roundhouse_queue_oldest_age_seconds",
            "Age of the oldest waiting job (0 when none waits).",
            labels=["deployment", "priority"],
        )
        backlog = GaugeMetricFamily(
            "roundhouse_backlog_tokens",
            "Reserved tokens (prompt + max_tokens) waiting.",
            labels=["deployment"],
        )
        workers = GaugeMetricFamily(
            "roundhouse_deployment_workers", "Live workers.", labels=["deployment"]
        )
        rate = GaugeMetricFamily(
            "roundhouse_deployment_tokens_per_second",
            "Measured capacity of one worker while full (reserved tokens/s).",
            labels=["deployment"],
        )
        desired = GaugeMetricFamily(
            "roundhouse_deployment_desired_replicas",
            "Workers the deployment needs to keep its backlog within its TTFT objective.",
            labels=["deployment"],
        )
        slo = GaugeMetricFamily(
            "roundhouse_deployment_slo",
            "The deployment's service level objectives.",
            labels=["deployment", "objective"],
        )
        lag = GaugeMetricFamily(
            "roundhouse_usage_ingest_lag_events",
            "Usage events written by workers and not yet in PostgreSQL.",
            labels=["deployment"],
        )
        lag_age = GaugeMetricFamily(
            "roundhouse_usage_ingest_lag_seconds",
            "Age of the oldest usage event not yet in PostgreSQL.",
            labels=["deployment"],
        )
        try:
            deployments = self._objectives()
        except Exception:
            log.warning("metrics: could not list deployments", exc_info=True)
            deployments = []
        now = time.time()
        for d in deployments:
            name = d.name
            slo.add_metric([name, "ttft_p95_seconds"], d.ttft_p95_seconds)
            slo.add_metric([name, "itl_p95_seconds"], d.itl_p95_seconds)
            slo.add_metric([name, "availability"], d.availability)
            try:
                snap = queue_snapshot_sync(self._client, name)
                wanted = self._autoscaler.desired(
                    deployment=name,
                    snapshot=snap,
                    policy=ScalingPolicy(
                        target_wait_seconds=d.ttft_p95_seconds,
                        min_replicas=d.min_replicas,
                        max_replicas=d.max_replicas,
                    ),
                    now=now,
                )
            except Exception:
                log.warning("metrics: could not read deployment %s", name, exc_info=True)
                continue
            for priority, n in snap.waiting.items():
                depth.add_metric([name, priority], n)
                age.add_metric([name, priority], snap.oldest_age[priority])
            backlog.add_metric([name], snap.backlog_tokens)
            workers.add_metric([name], snap.live_workers)
            if snap.tokens_per_second is not None:
                rate.add_metric([name], snap.tokens_per_second)
            desired.add_metric([name], wanted)
            lag.add_metric([name], snap.ingest_lag_events)
            lag_age.add_metric([name], snap.ingest_lag_seconds)
        yield from (depth, age, backlog, workers, rate, desired, slo, lag, lag_age)


_platform: PlatformCollector | None = None


def _registry() -> CollectorRegistry:
    """This frontend's series: every process's (multi-process mode) or this process's."""
    global _platform
    if _platform is None:
        _platform = PlatformCollector()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Forward(REGISTRY))
    registry.register(_platform)
    return registry


class _Forward(Collector):
    """Yield another registry's metrics (this process's default one)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from self.source.collect()


def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the Prometheus text format."""
    payload = generate_latest(_registry())
    return HttpResponse(payload, content_type="text/plain; version=0.0.4; charset=utf-8")
