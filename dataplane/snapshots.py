"""What control-plane code reads of a deployment's queue, synchronously, and the retire flag.

The console, the autoscaler and the metrics scrape read depth, workers, rates and a whole
`QueueSnapshot` here; `depth` is the asynchronous read a retiring worker polls. The control
plane asks a deployment's workers to retire with `retire_request_sync`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio as aredis

from dataplane.keys import deployment_keys, gauges_key, heartbeats_key, retire_key
from dataplane.types import job_decoder


@dataclass(frozen=True)
class Depth:
    requests: int
    tokens: int


async def depth(client: aredis.Redis, deployment: str) -> Depth:
    """Return how many requests and reserved tokens wait in a deployment's queues."""
    found: Any = await client.hmget(deployment_keys(deployment).depth, ["n", "tok"])
    return Depth(requests=int(found[0] or 0), tokens=int(found[1] or 0))


def depth_sync(client: redis.Redis, deployment: str) -> tuple[int, int]:
    """Return (requests, reserved tokens) waiting in a deployment's queues, for control code."""
    found: Any = client.hmget(deployment_keys(deployment).depth, ["n", "tok"])
    return int(found[0] or 0), int(found[1] or 0)


def kv_cache_usage_sync(client: redis.Redis, deployment: str) -> float | None:
    """Return the highest KV-cache use any live worker of a deployment last reported."""
    values: Any = client.hvals(gauges_key(deployment))
    return max((float(v) for v in values), default=None)


def rate_sync(client: redis.Redis, deployment: str) -> float:
    """Return the reserved tokens per second a deployment's workers last measured (summed)."""
    values: Any = client.hvals(deployment_keys(deployment).rate)
    return sum(float(v) for v in values)


def live_workers_sync(client: redis.Redis, deployment: str) -> int:
    """Return how many workers of a deployment are alive, for control-plane code."""
    return int(client.zcount(heartbeats_key(deployment), time.time(), "+inf"))


def retire_request_sync(client: redis.Redis, deployment: str, *, retire: bool) -> None:
    """Ask a deployment's workers to drain and leave (or, with retire=False, to stay)."""
    if retire:
        client.set(retire_key(deployment), str(time.time()))
    else:
        client.delete(retire_key(deployment))


@dataclass(frozen=True)
class QueueSnapshot:
    """What a deployment's shared state in Redis says now, for metrics and autoscaling."""

    waiting: dict[str, int]  # priority class -> queued jobs
    oldest_age: dict[str, float]  # priority class -> seconds the oldest queued job has waited
    backlog_tokens: int
    running: int  # jobs claimed by workers and not finished
    live_workers: int
    slots_per_worker: float  # shared slots, mean over live workers
    tokens_per_second: float | None  # measured capacity of one worker, mean; None if unknown
    ingest_lag_events: int
    ingest_lag_seconds: float
    retiring: bool = False  # the control plane asked its workers to drain and leave


# Oldest-job ages are read from at most this many queued jobs per class (the queue is bounded
# by max_queued, so this only matters for very deep batch queues).
_SNAPSHOT_SCAN = 5000


def queue_snapshot_sync(client: redis.Redis, deployment: str) -> QueueSnapshot:
    """Read a deployment's queues, workers and usage stream in two round trips."""
    keys = deployment_keys(deployment)
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.depth, "tok")
    for queue in (keys.queue_interactive, keys.queue_batch):
        pipe.zcard(queue)
        pipe.zrange(queue, 0, _SNAPSHOT_SCAN - 1)
    pipe.zcard(keys.leases)
    pipe.zrangebyscore(keys.workers, now, "+inf")
    pipe.hgetall(keys.slots)
    pipe.hgetall(keys.rate)
    pipe.xrange(keys.usage, "-", "+", count=1)
    pipe.xlen(keys.usage)
    pipe.exists(retire_key(deployment))
    tok, n_i, members_i, n_b, members_b, running, live, slots, rates, first, length, retire = (
        pipe.execute()
    )
    oldest: dict[str, str] = {}
    for cls, members in (("interactive", members_i), ("batch", members_b)):
        if members:
            # Members are "<tenant:10>:<seq:16>:<request id>"; the global sequence orders them.
            oldest[cls] = min((m.decode() for m in members), key=lambda m: m[11:27])[28:]
    ages = dict.fromkeys(("interactive", "batch"), 0.0)
    if oldest:
        encoded = client.hmget(keys.jobs, list(oldest.values()))
        for cls, payload in zip(oldest, cast(list[bytes | None], encoded), strict=True):
            if payload is not None:
                ages[cls] = max(now - job_decoder.decode(payload).enqueued_at, 0.0)
    alive = {w.decode() for w in live}
    shared = [float(v.split()[0]) for w, v in _decoded(slots).items() if w in alive]
    rate = [float(v) for w, v in _decoded(rates).items() if w in alive]
    lag_seconds = 0.0
    if first:
        # Stream ids start with their append time in milliseconds.
        lag_seconds = max(now - int(first[0][0].decode().split("-")[0]) / 1000, 0.0)
    return QueueSnapshot(
        waiting={"interactive": int(n_i), "batch": int(n_b)},
        oldest_age=ages,
        backlog_tokens=int(tok or 0),
        running=int(running),
        live_workers=len(alive),
        slots_per_worker=sum(shared) / len(shared) if shared else 0.0,
        tokens_per_second=sum(rate) / len(rate) if rate else None,
        ingest_lag_events=int(length),
        ingest_lag_seconds=lag_seconds,
        retiring=bool(retire),
    )


def _decoded(values: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in values.items()}
