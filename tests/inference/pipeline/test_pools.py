"""The frontend's pick of a pool: a route's pools weighed by what the data plane says now."""

from __future__ import annotations

import collections
import dataclasses
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from dataplane.leases import Leases
from inference.pipeline import submission as pools
from inference.pipeline.clients import dispatch_get
from inference.pipeline.submission import pool_route
from models_registry.selectors import Pool, Route


def _route(names: list[str], spot: set[str]) -> Route:
    pool_list = tuple(
        Pool(
            deployment=name,
            spot=name in spot,
            accelerator="",
            max_queued=10 + i,
            max_queued_tokens=1000 + i,
            target_wait_seconds=2.0,
        )
        for i, name in enumerate(names)
    )
    return Route(
        requested="m", model_name="m", version="v1", version_digest="d", deployment=names[0],
        context_length=2048, artifact_dir=Path("."), sampling_defaults={},
        price_input_per_1k=Decimal(0), price_output_per_1k=Decimal(0), max_queued=10,
        max_queued_tokens=1000, pools=pool_list,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_loads(monkeypatch):
    monkeypatch.setattr(pools, "_loads", {})
    monkeypatch.setattr(pools, "REFRESH_SECONDS", 0.0)


async def test_requests_join_the_pools_in_proportion_to_their_live_workers_rates():
    big, small = (f"pool-{uuid.uuid4().hex[:8]}" for _ in range(2))
    leases = Leases(dispatch_get().redis)
    await leases.heartbeat(deployment=big, worker="w", ttl=60, tokens_per_second=3000.0)
    await leases.heartbeat(deployment=small, worker="w", ttl=60, tokens_per_second=1000.0)
    route = _route([big, small], spot=set())
    chosen = [await pool_route(route, priority="interactive") for _ in range(600)]
    shares = collections.Counter(r.deployment for r in chosen)
    assert 0.65 < shares[big] / 600 < 0.85
    # The route a request takes carries its pool's own queue limits.
    joined_small = next(r for r in chosen if r.deployment == small)
    assert (joined_small.max_queued, joined_small.max_queued_tokens) == (11, 1001)
    assert dataclasses.replace(joined_small, deployment=big, max_queued=10,
                               max_queued_tokens=1000) == route  # fmt: skip


async def test_batch_requests_join_the_spot_pool_while_it_has_workers():
    steady, spot = (f"pool-{uuid.uuid4().hex[:8]}" for _ in range(2))
    leases = Leases(dispatch_get().redis)
    await leases.heartbeat(deployment=steady, worker="w", ttl=60, tokens_per_second=3000.0)
    await leases.heartbeat(deployment=spot, worker="w", ttl=60, tokens_per_second=100.0)
    route = _route([steady, spot], spot={spot})
    assert {(await pool_route(route, priority="batch")).deployment for _ in range(50)} == {spot}
    await leases.leave(deployment=spot, worker="w")  # preempted
    assert {(await pool_route(route, priority="batch")).deployment for _ in range(50)} == {steady}
