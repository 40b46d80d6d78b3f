"""The data plane's own Prometheus series (docs/metrics.md); every process that runs its loops
exports them. A worker or an ingester serves its process's series on a port of its own."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.conf import settings
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dataplane.identity import host_name

log = logging.getLogger(__name__)

# Seconds, from a cache hit to a long generation; shared by every latency series (the frontend's
# and the workers') so that stages add up bucket by bucket.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Time to first token: the SLO thresholds an operator may pick are bucket boundaries, so a
# latency objective is an exact ratio of two counters.
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip

# A request's stages: the frontend observes auth, preprocess, admission and relay; the worker
# that runs it the queues, prefill and decode. One series, so a request's path reads as one.
STAGES = (
    "auth", "preprocess", "admission", "platform_queue", "engine_queue", "prefill", "decode",
    "relay",
)  # fmt: skip

stage_seconds = Histogram(
    "roundhouse_stage_seconds",
    "Time a request spent in one stage of its path.",
    ["stage", "deployment"],
    buckets=LATENCY_BUCKETS,
)

loop_failures = Counter(
    "roundhouse_loop_failures",
    "Exceptions that stopped a long-lived loop of this process, which then started again.",
    ["loop"],
)


class _WithDeployment(Collector):
    """This process's series, vLLM's (`vllm:*`) labelled with the deployment they serve."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment

    def collect(self) -> Iterator[Metric]:
        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                relabelled = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    labels = {**sample.labels, "deployment": self.deployment}
                    relabelled.add_sample(sample.name, labels, sample.value, sample.timestamp)
                family = relabelled
            yield family


host_info = Info(
    "roundhouse_host", "The host a worker or ingester runs on and its zone (ROUNDHOUSE_ZONE)."
)


def metrics_serve(port: int, *, what: str, deployment: str = "") -> None:
    """Serve this process's series on a port (0: not at all); a busy port is only a warning.

    With a deployment, vLLM's series carry it as a label. The series include the host's name
    and zone (`roundhouse_host_info`), so a dashboard can sum a zone's workers.
    """
    if port <= 0:
        return
    host_info.info({"host": host_name(), "zone": settings.ROUNDHOUSE_ZONE})
    registry = REGISTRY
    if deployment:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_WithDeployment(deployment))
    try:
        start_http_server(port, addr=settings.ROUNDHOUSE_BIND_ADDRESS, registry=registry)
    except OSError as exc:
        log.warning("%s metrics not served on port %d: %s", what, port, exc)
        return
    log.info("%s metrics on %s:%d/metrics", what, settings.ROUNDHOUSE_BIND_ADDRESS, port)
