"""A write on a connection whose transport has closed is a connection error, not a crash.

Under uvloop, writing on a transport the server closed raises RuntimeError, which redis-py
passed on as itself: during a cluster failover an admission got a 500 (seen once in the
cluster pass). dataplane.redis_client turns it into what a broken socket raises.
"""

from __future__ import annotations

import pytest
import redis
from redis.asyncio.connection import Connection

import dataplane.redis_client  # noqa: F401 (installs the replacement)


class ClosedTransportWriter:
    """A stream writer whose transport uvloop has closed."""

    def writelines(self, data: object) -> None:
        raise RuntimeError(
            "unable to perform operation on <TCPTransport closed=True reading=False "
            "0x562f3b7f9560>; the handler is closed"
        )

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def wait_closed(self) -> None:
        return None


class BrokenWriter(ClosedTransportWriter):
    def writelines(self, data: object) -> None:
        raise RuntimeError("something else went wrong")


def _connection(writer: object) -> Connection:
    connection = Connection(host="127.0.0.1", port=1, socket_timeout=5)
    connection._writer = writer  # type: ignore[assignment]
    connection._reader = object()  # type: ignore[assignment]
    return connection


async def test_a_write_on_a_closed_transport_is_a_connection_error():
    connection = _connection(ClosedTransportWriter())
    with pytest.raises(redis.ConnectionError, match="handler is closed"):
        await connection.send_packed_command(b"PING\r\n", check_health=False)
    assert not connection.is_connected  # dropped, to connect again on its next use


async def test_a_send_without_a_writer_is_a_broken_socket():
    """What redis-py makes a ConnectionError of, not an AttributeError on None."""
    connection = _connection(None)
    with pytest.raises(ConnectionResetError):
        await connection._send_packed_command([b"PING\r\n"])


async def test_another_runtime_error_is_left_as_it_is():
    connection = _connection(BrokenWriter())
    with pytest.raises(RuntimeError, match="something else"):
        await connection.send_packed_command(b"PING\r\n", check_health=False)
