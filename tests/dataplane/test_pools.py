"""Pools of one version: each pool's load read from the data plane, and the pick among them."""

from __future__ import annotations

import collections
import random
import uuid

from dataplane.frontdoor import FrontDoor
from dataplane.leases import Leases
from dataplane.pools import PoolLoad, PoolSpec, pool_loads, pool_pick
from dataplane.redis_client import redis_client_new
from tests.jobs import job_new


def _load(name: str, workers: int, rate: float, backlog: int = 0) -> PoolLoad:
    return PoolLoad(
        deployment=name, live_workers=workers, tokens_per_second=rate, backlog_tokens=backlog
    )


def _shares(pools, loads, priority="interactive", n=4000) -> dict[str, float]:
    draw = random.Random(7)
    picks = collections.Counter(
        pool_pick(pools, loads, priority=priority, draw=draw) for _ in range(n)
    )
    return {name: count / n for name, count in picks.items()}


def test_a_version_s_traffic_is_shared_in_proportion_to_each_pool_s_rate():
    pools = [PoolSpec("h100"), PoolSpec("l4")]
    loads = {"h100": _load("h100", 2, 3000.0), "l4": _load("l4", 2, 1000.0)}
    shares = _shares(pools, loads)
    assert abs(shares["h100"] - 0.75) < 0.03 and abs(shares["l4"] - 0.25) < 0.03


def test_a_pool_without_live_workers_takes_nothing_and_none_alive_leaves_the_first():
    pools = [PoolSpec("a"), PoolSpec("b")]
    assert _shares(pools, {"a": _load("a", 0, 0.0), "b": _load("b", 1, 10.0)}) == {"b": 1.0}
    assert _shares(pools, {"a": _load("a", 0, 0.0), "b": _load("b", 0, 0.0)}) == {"a": 1.0}
    assert _shares(pools, {}) == {"a": 1.0}


def test_batch_work_goes_to_a_live_spot_pool_first():
    pools = [PoolSpec("on-demand"), PoolSpec("spot", spot=True)]
    loads = {"on-demand": _load("on-demand", 4, 4000.0), "spot": _load("spot", 1, 500.0)}
    assert _shares(pools, loads, priority="batch") == {"spot": 1.0}
    assert 0 < _shares(pools, loads)["spot"] < 0.2  # interactive work by rate alone
    loads["spot"] = _load("spot", 0, 0.0)  # preempted: batch work goes on elsewhere
    assert _shares(pools, loads, priority="batch") == {"on-demand": 1.0}


def test_a_pool_whose_backlog_misses_its_objective_is_skipped_while_another_meets_it():
    pools = [PoolSpec("busy", target_wait_seconds=2.0), PoolSpec("idle", target_wait_seconds=2.0)]
    # busy: 10,000 tokens queued at 1,000/s is 10 s of waiting.
    loads = {"busy": _load("busy", 1, 1000.0, 10_000), "idle": _load("idle", 1, 200.0, 100)}
    assert _shares(pools, loads) == {"idle": 1.0}
    # When every pool misses it, the one that clears soonest.
    loads["idle"] = _load("idle", 1, 200.0, 4_000)  # 20 s
    assert _shares(pools, loads) == {"busy": 1.0}


def test_a_pool_that_has_not_measured_its_rate_counts_as_the_others_per_worker_rate():
    pools = [PoolSpec("measured"), PoolSpec("new")]
    loads = {"measured": _load("measured", 2, 2000.0), "new": _load("new", 1, 0.0)}
    shares = _shares(pools, loads)
    assert abs(shares["new"] - 1 / 3) < 0.03  # one worker at the others' 1,000/s each


async def test_each_pool_s_load_is_read_from_its_queue_and_live_workers():
    client = redis_client_new()
    try:
        fast, slow, gone = (f"pool-{uuid.uuid4().hex[:8]}" for _ in range(3))
        leases = Leases(client)
        await leases.heartbeat(deployment=fast, worker="w1", ttl=60, tokens_per_second=900.0)
        await leases.heartbeat(deployment=fast, worker="w2", ttl=60, tokens_per_second=600.0)
        await leases.heartbeat(deployment=slow, worker="w1", ttl=60, tokens_per_second=100.0)
        # A worker whose heartbeat lapsed counts for nothing, its last rate included.
        await leases.heartbeat(deployment=slow, worker="old", ttl=-1, tokens_per_second=5000.0)
        assert await FrontDoor(client, reply_ttl=60).enqueue(job_new(slow)) is None
        loads = await pool_loads(client, [fast, slow, gone])
        assert loads[fast] == _load(fast, 2, 1500.0, 0)
        assert loads[slow].live_workers == 1 and loads[slow].tokens_per_second == 100.0
        assert loads[slow].backlog_tokens == 3 + 8  # the job's prompt and max_tokens
        assert loads[gone] == _load(gone, 0, 0.0, 0)
    finally:
        await client.aclose()
