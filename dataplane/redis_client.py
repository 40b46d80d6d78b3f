"""Redis clients for the data plane, configured from settings."""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import redis
import redis.asyncio as aredis
from django.conf import settings
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

# What a Lua script takes as an argument.
ScriptArg = bytes | str | int | float

log = logging.getLogger(__name__)


async def _free_connections_disconnect(node: ClusterNode) -> None:
    """Disconnect a cluster node's idle connections, out of reach while they are.

    redis-py's own version disconnects the idle connections it finds while they stay in the
    node's free list: a command that takes one of them meanwhile writes on a connection the
    disconnect is closing (`'NoneType' object has no attribute 'writelines'`). It runs after
    any connection error on the node, so under a burst of commands one error failed others.
    Here they leave the free list first and come back disconnected (each connects again on its
    next use).
    """
    free = node._free  # redis-py keeps its idle connections here
    taken = list(free)
    free.clear()
    try:
        await asyncio.gather(*(c.disconnect() for c in taken), return_exceptions=True)
    finally:
        free.extend(taken)


ClusterNode.disconnect_free_connections = _free_connections_disconnect  # type: ignore[method-assign,assignment]

_packed_send = AbstractConnection._send_packed_command


async def _send_on_a_live_transport(self: AbstractConnection, command: Any) -> None:
    """Send as redis-py does; a write on a connection whose peer is gone is a connection error.

    Under uvloop a write on a transport that has closed (the server died between connecting
    and the first command) raises RuntimeError ("unable to perform operation on
    <TCPTransport closed=True ...>; the handler is closed"), which redis-py passes on as
    itself: a request admitted while a cluster primary failed over got a 500 instead of the
    503 an unreachable data plane answers. As an OSError it is what redis-py makes of a
    broken socket: the connection is dropped and a ConnectionError raised, which the callers
    handle (UNREACHABLE).
    """
    if self._writer is None:
        raise ConnectionResetError(errno.ECONNRESET, "the connection was closed")
    try:
        await _packed_send(self, command)
    except RuntimeError as exc:
        if "closed" not in str(exc):
            raise
        raise ConnectionResetError(errno.ECONNRESET, str(exc)) from exc


AbstractConnection._send_packed_command = _send_on_a_live_transport  # type: ignore[method-assign]


class _Cluster(aredis.RedisCluster):
    """redis-py's asyncio cluster client, which reads the slot map before its first command.

    redis-py routes a command before it first reads the cluster's slot map: with no node known
    yet, a keyed command is routed as a keyless one, to any primary. A new client's first burst
    (a frontend started under load, 200 admissions at once) went mostly to primaries that do
    not serve its keys; each answered MOVED, and each MOVED made the client read the map again
    and mark every connection for a reconnect, under commands still in flight on them, which
    then failed with "Connection closed by server". Pipelines already read the map first.
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


def redis_client_new() -> aredis.Redis:
    """Return a new asyncio client of the data plane's Valkey, bound to the running loop.

    With REDIS_CLUSTER it is a cluster client: every key is sent to the node serving its slot,
    and each script or pipeline stays within one slot (dataplane.keys' hash tags). Its commands
    are the plain client's, so it is typed as one.
    """
    options: dict[str, Any] = {
        # Reads block for at most a few seconds (dataplane.leases); the socket timeout exceeds
        # that.
        "socket_timeout": 30,
        "socket_connect_timeout": 5,
        # One quick retry on a fresh connection covers a pooled one the server dropped; more
        # would hold a request for seconds while Redis is down, when a fast 503 is the answer
        # (the long-running loops retry on their own, see Outage).
        "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=2),
    }
    if settings.REDIS_CLUSTER:
        return cast(
            aredis.Redis,
            _Cluster.from_url(
                settings.REDIS_URL, max_connections=4096, require_full_coverage=True, **options
            ),
        )
    return aredis.Redis.from_url(
        settings.REDIS_URL, max_connections=4096, health_check_interval=30, **options
    )


# A pipeline's scripts queued by script_into: their positions, each with its script and call.
_SCRIPTS = "_roundhouse_scripts"
_Queued = tuple[AsyncScript, Sequence[str], Sequence[ScriptArg]]


def text_of(value: bytes | str) -> str:
    """A name or id from a reply as text: redis-py answers bytes unless told to decode."""
    return value.decode() if isinstance(value, bytes) else value


def script_into(
    pipe: aredis.client.Pipeline,
    script: AsyncScript,
    *,
    keys: Sequence[str],
    args: Sequence[ScriptArg],
) -> None:
    """Queue a Lua script on a pipeline by its hash, to run in the pipeline's one round trip;
    run the pipeline with `pipeline_execute`.

    redis-py's own script call on a pipeline asks the server whether the script is loaded
    (SCRIPT EXISTS) before each execute: a round trip more on every request's hot path. EVAL
    with the script's text costs the server a hash of the text per call (measured on Valkey
    8: 37 µs a call of the 7.6 KB enqueue script against 9 µs by its hash), so the call goes
    as EVALSHA and `pipeline_execute` runs it by its text where the server does not know it.
    """
    queued: dict[int, _Queued] = pipe.__dict__.setdefault(_SCRIPTS, {})
    queued[len(pipe)] = (script, keys, args)
    # By name: a cluster pipeline blocks its evalsha method, whose NOSCRIPT it cannot handle;
    # pipeline_execute handles it, and the command goes to its first key's node as EVAL does.
    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


def commands_drop(pipe: aredis.client.Pipeline, start: int) -> None:
    """Take a pipeline's commands from position `start` on back off it, unsent."""
    del pipe.command_stack[start:]
    queued: dict[int, _Queued] = pipe.__dict__.get(_SCRIPTS, {})
    for at in [at for at in queued if at >= start]:
        del queued[at]


async def pipeline_execute(
    pipe: aredis.client.Pipeline, *, raise_on_error: bool = True
) -> list[Any]:
    """Send a pipeline's commands and return their results, in order.

    A script queued by `script_into` that the server does not know by its hash (a restarted or
    flushed server, a replica promoted in a failover) did not run: it runs again by its text,
    right after the round trip, which also teaches the server its hash. Other commands of the
    round trip ran before it then, so a script's call must not depend on commands queued
    after it. `raise_on_error` raises the first command's error, as a pipeline's own does.
    """
    queued: dict[int, _Queued] = pipe.__dict__.pop(_SCRIPTS, {})
    results = list(await pipe.execute(raise_on_error=False))
    assert max(queued, default=-1) < len(results), "its scripts were queued on this pipeline"
    unknown = [at for at in sorted(queued) if isinstance(results[at], NoScriptError)]
    if unknown:
        for at in unknown:
            script, keys, args = queued[at]
            text = script.script
            text = text if isinstance(text, str) else bytes(text).decode()
            pipe.eval(text, len(keys), *keys, *args)
        again: list[Any]
        try:
            again = list(await pipe.execute(raise_on_error=False))
        except Exception as exc:
            # The second trip broke: only the scripts it carried failed; the first trip's
            # commands ran, and their callers get their results.
            again = [exc] * len(unknown)
        for at, result in zip(unknown, again, strict=True):
            results[at] = result
    if raise_on_error:
        for result in results:
            if isinstance(result, Exception):
                raise result
    return results


def redis_sync_client() -> redis.Redis:
    """Return a blocking client of the data plane's Valkey, for management code.

    With a cluster the client is the process's one, shared (closing it does nothing).
    """
    if settings.REDIS_CLUSTER:
        return cast(redis.Redis, _sync_cluster_client(settings.REDIS_URL))
    return redis.Redis.from_url(settings.REDIS_URL)


class _SharedCluster(redis.RedisCluster):
    """The process's one blocking cluster client: a caller's close() leaves it open."""

    def close(self) -> None:
        return None


@functools.cache
def _sync_cluster_client(url: str) -> redis.RedisCluster:
    # One per process: a cluster client asks for the slot map and the command table when it
    # is made, too much for every call; it finds moved slots again by itself.
    return _SharedCluster.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def cluster_of(client: aredis.Redis) -> aredis.RedisCluster | None:
    """The client as a cluster client, or None when it speaks to one server."""
    as_any: Any = client
    return as_any if isinstance(as_any, aredis.RedisCluster) else None


class ShardedSubscriber:
    """Sharded pub/sub (SSUBSCRIBE) to channels of one slot, on one server or a cluster.

    A cluster delivers a sharded message (SPUBLISH) only to the node that owns its channel's
    slot, where a plain PUBLISH goes to every node; a subscriber listens to that node alone.
    A deployment's channels share its hash tag, so its cancels and hand-offs stay in its shard.
    """

    def __init__(self, client: aredis.Redis) -> None:
        self._cluster = cluster_of(client) is not None
        self._pubsub: Any = client.pubsub(ignore_subscribe_messages=True)

    async def subscribe(self, *channels: str) -> None:
        await self._pubsub.ssubscribe(*channels)

    async def message(self, timeout: float) -> tuple[str, bytes] | None:
        """The next message's channel and data, or None (nothing within `timeout` seconds)."""
        if self._cluster:
            found = await self._pubsub.get_sharded_message(timeout=timeout)
        else:
            found = await self._pubsub.get_message(timeout=timeout)
        if found is None or found["type"] not in ("smessage", b"smessage"):
            return None
        channel, data = found["channel"], found["data"]
        return (channel.decode() if isinstance(channel, bytes) else str(channel)), data

    async def aclose(self) -> None:
        await self._pubsub.aclose()


def slot_groups(client: aredis.Redis, keys: Sequence[str]) -> list[list[str]]:
    """Keys grouped so that a multi-key command may take each group (one slot per group)."""
    cluster = cluster_of(client)
    if cluster is None:
        return [list(keys)] if keys else []
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(cluster.keyslot(key), []).append(key)
    return list(groups.values())


async def ping_everywhere(client: aredis.Redis) -> None:
    """PING the server, or with a cluster every primary (one down fails its slots)."""
    cluster = cluster_of(client)
    if cluster is None:
        await client.ping()
    else:
        await cluster.ping(target_nodes=aredis.RedisCluster.PRIMARIES)


async def server_uptime(client: aredis.Redis, key: str) -> float:
    """Seconds since the server holding `key` started (with a cluster, its slot's primary)."""
    cluster = cluster_of(client)
    info: Any
    if cluster is None:
        info = await client.info("server")
    else:
        info = await cluster.info("server", target_nodes=cluster.get_node_from_key(key))
    return float(info.get("uptime_in_seconds", 0))


def control_client_new() -> aredis.Redis:
    """Return a new asyncio client of the control plane's Valkey (its messages)."""
    return aredis.Redis.from_url(settings.CONTROL_REDIS_URL, socket_timeout=30)


def control_sync_client() -> redis.Redis:
    """Return a blocking client of the control plane's Valkey (lockout, its messages)."""
    return redis.Redis.from_url(
        settings.CONTROL_REDIS_URL, socket_timeout=5, socket_connect_timeout=5
    )


# What a Redis outage looks like to a client: refused or dropped connections, timeouts, a
# restarted server still loading its data (BusyLoadingError is a ConnectionError), and on a
# cluster a slot with no primary for a moment: "CLUSTERDOWN" while a replica takes over a
# failed primary (MasterDownError is one), "TRYAGAIN" while a slot moves, or no node known
# for the slot. Pipelines report these as they are where single commands retry them.
UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)


class Outage:
    """Paces a loop's retries while Redis is unreachable, and logs its start and end once.

    A loop calls `failed()` when a call raises one of UNREACHABLE and sleeps for what it
    returns (0.1 s, doubling up to 1 s, so a restarted server is found again within a
    second); it calls `ok()` after a call succeeds.
    """

    def __init__(self, what: str, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self.what = what
        self.log = logger
        self.level = level
        self.since: float | None = None
        self._delay = 0.0

    def failed(self, exc: BaseException) -> float:
        if self.since is None:
            self.since = time.monotonic()
            self.log.log(self.level, "%s: Redis unreachable (%s); retrying", self.what, exc)
        self._delay = min(max(self._delay * 2, 0.1), 1.0)
        return self._delay

    def ok(self) -> None:
        if self.since is not None:
            elapsed = time.monotonic() - self.since
            self.log.log(self.level, "%s: Redis reachable again after %.1f s", self.what, elapsed)
            self.since = None
            self._delay = 0.0


# How long `until_reachable` keeps trying by default: a request's settling (giving back what
# it reserved) after Redis went away under it.
SETTLE_WITHIN_SECONDS = 60.0

T = TypeVar("T")


async def until_reachable(
    call: Callable[[], Awaitable[T]], what: str, *, within: float = SETTLE_WITHIN_SECONDS
) -> T:
    """Await `call()`, again and again while Redis is unreachable, for `within` seconds at most.

    For one-off calls that must land, such as giving back a reservation: a request admitted
    just before Redis went away still holds it, and giving it back as soon as Redis is back
    beats waiting for its admission lease (the request timeout and a minute more). Paced and
    logged (at INFO) by an `Outage`; other errors are raised at once.
    """
    outage, started = Outage(what, log, logging.INFO), time.monotonic()
    while True:
        try:
            found = await call()
        except UNREACHABLE as exc:
            if time.monotonic() - started > within:
                raise
            await asyncio.sleep(outage.failed(exc))
            continue
        outage.ok()
        return found
