"""Which pool of a version a request joins, on the frontend (dataplane/pools.py decides).

A version with one deployment costs nothing here. With several, each frontend process reads
the pools' load from Redis at most every quarter second per version and picks a pool per
request; the staleness is bounded, and the draw in proportion to each pool's rate keeps
requests from herding onto one pool between two reads.
"""

from __future__ import annotations

import dataclasses
import time

from dataplane.pools import PoolLoad, pool_loads, pool_pick
from dataplane.redis_client import UNREACHABLE
from inference.pipeline.clients import dispatch_get
from models_registry.selectors import Route

REFRESH_SECONDS = 0.25

_loads: dict[tuple[str, ...], tuple[float, dict[str, PoolLoad]]] = {}


async def pool_route(route: Route, *, priority: str) -> Route:
    """The route with the pool this request joins as its deployment."""
    if len(route.pools) < 2:
        return route
    names = tuple(p.deployment for p in route.pools)
    cached = _loads.get(names)
    if cached is not None and time.monotonic() - cached[0] < REFRESH_SECONDS:
        loads = cached[1]
    else:
        try:
            loads = await pool_loads(dispatch_get().redis, names)
        except UNREACHABLE:
            return route  # admission meets the same outage and answers 503
        _loads[names] = (time.monotonic(), loads)
    chosen = pool_pick(route.pools, loads, priority=priority)
    if chosen == route.deployment:
        return route
    pool = next(p for p in route.pools if p.deployment == chosen)
    return dataclasses.replace(
        route,
        deployment=pool.deployment,
        max_queued=pool.max_queued,
        max_queued_tokens=pool.max_queued_tokens,
    )
