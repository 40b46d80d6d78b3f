"""A cluster node's idle connections are out of reach while they are being disconnected.

redis-py's asyncio cluster client disconnects a node's idle connections after any connection
error on it; a command that took one of them meanwhile wrote on a closing connection and
failed (`'NoneType' object has no attribute 'writelines'`, seen twice under 200 concurrent
admissions on the embedded cluster). dataplane.redis_client replaces that step.
"""

from __future__ import annotations

import asyncio

from redis.asyncio.cluster import ClusterNode

import dataplane.redis_client  # noqa: F401 (installs the replacement)


class Idle:
    """An idle connection whose disconnect takes a while."""

    is_connected = False  # what the node asks of its connections when it is dropped

    def __init__(self, release: asyncio.Event) -> None:
        self.release = release
        self.disconnected = False

    async def disconnect(self) -> None:
        await self.release.wait()
        self.disconnected = True


async def test_no_command_takes_an_idle_connection_while_it_is_disconnected():
    node = ClusterNode("127.0.0.1", 1, max_connections=8)
    release = asyncio.Event()
    idle = [Idle(release), Idle(release)]
    node._free.extend(idle)  # type: ignore[arg-type]
    node._connections.extend(idle)  # type: ignore[arg-type]

    closing = asyncio.create_task(node.disconnect_free_connections())
    await asyncio.sleep(0)
    taken = node.acquire_connection()  # a command arriving meanwhile
    assert taken not in idle  # a new connection, not one being closed

    release.set()
    await closing
    assert all(c.disconnected for c in idle)
    assert list(node._free) == idle  # back, to connect again on their next use
