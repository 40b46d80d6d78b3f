"""The safety checks' Prometheus series (docs/metrics.md), multi-process safe like the others."""

from __future__ import annotations

from prometheus_client import Counter

# Exposed as roundhouse_safety_interventions_total (prometheus_client adds the suffix).
interventions_total = Counter(
    "roundhouse_safety_interventions",
    "Findings a safety policy acted on.",
    ["stage", "detector", "action"],
)


def interventions_counted(*, stage: str, detector: str, action: str, count: int = 1) -> None:
    interventions_total.labels(stage=stage, detector=detector, action=action).inc(count)
