"""The data plane's own Prometheus series (docs/metrics.md); every process that runs its loops
exports them."""

from __future__ import annotations

from prometheus_client import Counter

loop_failures = Counter(
    "switchyard_loop_failures",
    "Exceptions that stopped a long-lived loop of this process, which then started again.",
    ["loop"],
)
