"""Pools: one model version served by several deployments, and which one a request joins.

A version can be served by pools of different hardware (an H100 pool and an L4 pool, a GPU
pool and a CPU pool, an on-demand pool and a spot pool): each is a deployment with its own
queue, workers and measured throughput. A frontend reads each pool's load (`pool_loads`, one
pipelined round trip) and picks one per request (`pool_pick`):

- only pools with a live worker take requests (with none anywhere, the first pool is
  returned and answers 503 as a lone deployment does);
- a batch request goes to a spot pool when one is alive: preemptible capacity is for work
  that can wait;
- among the pools whose backlog clears within their target wait at their measured rate, one is
  drawn with odds in proportion to that rate, so each pool serves its share of the version's
  traffic in proportion to what it can serve within the objective; when none clears in time,
  the one that clears soonest.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from dataplane.keys import deployment_keys


@dataclass(frozen=True)
class PoolLoad:
    """What a pool's queue and workers say now."""

    deployment: str
    live_workers: int
    tokens_per_second: float  # reserved tokens per second its live workers measured, summed
    backlog_tokens: int  # reserved tokens waiting in its queue


@dataclass(frozen=True)
class PoolSpec:
    """What the control plane says of a pool: its deployment, whether it is preemptible, and
    how long a request may wait in its queue (its time-to-first-token objective)."""

    deployment: str
    spot: bool = False
    target_wait_seconds: float = 2.0


async def pool_loads(client: aredis.Redis, deployments: Sequence[str]) -> dict[str, PoolLoad]:
    """Read each pool's live workers, measured rates and backlog in one pipelined round trip."""
    now = time.time()
    async with client.pipeline(transaction=False) as pipe:
        for deployment in deployments:
            keys = deployment_keys(deployment)
            pipe.zrangebyscore(keys.workers, now, "+inf")
            pipe.hgetall(keys.rate)
            pipe.hget(keys.depth, "tok")
        found: list[Any] = await pipe.execute()
    loads: dict[str, PoolLoad] = {}
    for i, deployment in enumerate(deployments):
        live, rates, tokens = found[3 * i : 3 * i + 3]
        alive = {w.decode() for w in live}
        rate = sum(float(v) for w, v in rates.items() if w.decode() in alive)
        loads[deployment] = PoolLoad(
            deployment=deployment,
            live_workers=len(alive),
            tokens_per_second=rate,
            backlog_tokens=int(tokens or 0),
        )
    return loads


def pool_pick(
    pools: Sequence[PoolSpec],
    loads: dict[str, PoolLoad],
    *,
    priority: str,
    draw: random.Random | None = None,
) -> str:
    """The deployment a request joins among a version's pools (see the module's docstring)."""
    alive = [p for p in pools if loads.get(p.deployment, _NONE).live_workers > 0]
    if not alive:
        return pools[0].deployment
    if priority == "batch" and any(p.spot for p in alive):
        alive = [p for p in alive if p.spot]
    # A pool that has not measured its rate yet counts as its workers times the mean rate of
    # the measured workers elsewhere (or one token per second each when none has measured).
    measured = [loads[p.deployment] for p in alive if loads[p.deployment].tokens_per_second > 0]
    per_worker = (
        sum(m.tokens_per_second for m in measured) / sum(m.live_workers for m in measured)
        if measured
        else 1.0
    )
    rates = {
        p.deployment: loads[p.deployment].tokens_per_second
        or loads[p.deployment].live_workers * per_worker
        for p in alive
    }
    waits = {d: loads[d].backlog_tokens / rate for d, rate in rates.items()}
    target = {p.deployment: p.target_wait_seconds for p in alive}
    in_time = [d for d in rates if waits[d] <= target[d]]
    if not in_time:
        return min(waits, key=lambda d: waits[d])
    chooser = draw or random.Random()  # nosec B311: load spreading, not security
    return chooser.choices(in_time, weights=[rates[d] for d in in_time])[0]


_NONE = PoolLoad(deployment="", live_workers=0, tokens_per_second=0.0, backlog_tokens=0)
