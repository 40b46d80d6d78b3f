"""The data plane's own Prometheus series (docs/metrics.md); every process that runs its loops
exports them. A worker or an ingester serves its process's series on a port of its own."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

loop_failures = Counter(
    "switchyard_loop_failures",
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


def metrics_serve(port: int, *, what: str, deployment: str = "") -> None:
    """Serve this process's series on a port (0: not at all); a busy port is only a warning.

    With a deployment, vLLM's series carry it as a label.
    """
    if port <= 0:
        return
    registry = REGISTRY
    if deployment:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_WithDeployment(deployment))
    try:
        start_http_server(port, registry=registry)
    except OSError as exc:
        log.warning("%s metrics not served on port %d: %s", what, port, exc)
        return
    log.info("%s metrics on :%d/metrics", what, port)
