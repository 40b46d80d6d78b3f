"""The data plane's cluster client sends even its very first commands to the slot's owner.

redis-py's asyncio cluster client routed a command before it had read the slot map: a new
client's first burst went to any primary, which answered MOVED, and the client's recovery from
those redirects broke commands still in flight (under 200 concurrent admissions, "Connection
closed by server", about once in 40 bursts on the embedded cluster).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import redis

from dataplane.redis_client import redis_client_new
from embedded.valkey_cluster import Cluster, primary_of


def _redirects(cluster: Cluster) -> int:
    """How many MOVED answers the cluster's primaries have given since they started."""
    total = 0
    for node in cluster.nodes:
        if node.primary or cluster.pid(node.name) is None:
            continue
        single = redis.Redis(host=node.host, port=node.port)
        try:
            stats = single.info("errorstats")
        finally:
            single.close()
        total += int(stats.get("errorstat_MOVED", {}).get("count", 0))
    return total


async def test_a_new_clients_first_burst_goes_where_its_keys_live(
    cluster: Cluster, settings: Any
) -> None:
    settings.REDIS_URL, settings.REDIS_CLUSTER = cluster.url, True
    seed = cluster.nodes[0].name
    key = next(
        k
        for k in (f"{{burst-{uuid.uuid4().hex}}}:n" for _ in range(1000))
        if primary_of(cluster, k).name != seed  # a key the seed node does not serve
    )
    before = _redirects(cluster)
    client = redis_client_new()
    try:
        counts = await asyncio.gather(*(client.incr(key) for _ in range(50)))
    finally:
        await client.aclose()
    assert sorted(counts) == list(range(1, 51))
    assert _redirects(cluster) == before
