"""The autoscaling signal: how many workers a deployment needs (docs/metrics.md).

`replicas_needed` is the arithmetic; `Autoscaler.desired` adds the hysteresis, with its state
in Redis so every frontend that is scraped reports the same value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from dataplane.keys import autoscale_key
from dataplane.scripts import AUTOSCALE_HYSTERESIS
from dataplane.snapshots import QueueSnapshot


@dataclass(frozen=True)
class ScalingPolicy:
    target_wait_seconds: float  # the backlog should clear within this (the TTFT objective)
    min_replicas: int
    max_replicas: int


def replicas_needed(snapshot: QueueSnapshot, policy: ScalingPolicy) -> int:
    """Return the workers the current load needs, before hysteresis.

    busy: the replicas' worth of requests running; drain: the workers that clear the backlog
    within the target wait at the measured rate. Without a measured rate the signal holds
    at the workers alive (never below the warm pool). A retired deployment (a rolled-back
    canary) wants none.
    """
    if snapshot.retiring:
        return 0
    rate = snapshot.tokens_per_second
    if not rate or snapshot.slots_per_worker <= 0:
        raw = snapshot.live_workers
    else:
        busy = snapshot.running / snapshot.slots_per_worker
        drain = snapshot.backlog_tokens / (rate * max(policy.target_wait_seconds, 1e-3))
        raw = math.ceil(busy + drain - 1e-9)
    if snapshot.live_workers == 0 and sum(snapshot.waiting.values()) > 0:
        raw = max(raw, 1)  # work waits and nobody serves it: at least one worker
    return min(max(raw, policy.min_replicas), policy.max_replicas)


class Autoscaler:
    """The desired replica count of deployments, with scale-down hysteresis kept in Redis."""

    def __init__(self, client: redis.Redis, *, scale_down_seconds: float) -> None:
        self.scale_down_seconds = scale_down_seconds
        self._script = client.register_script(AUTOSCALE_HYSTERESIS)

    def desired(
        self, *, deployment: str, snapshot: QueueSnapshot, policy: ScalingPolicy, now: float
    ) -> int:
        raw = replicas_needed(snapshot, policy)
        result = self._script(
            keys=[autoscale_key(deployment)], args=[raw, now, self.scale_down_seconds]
        )
        return int(result)
