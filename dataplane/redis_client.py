"""Redis clients for the data plane, configured from settings."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import redis
import redis.asyncio as aredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript

# What a Lua script takes as an argument.
ScriptArg = bytes | str | int | float


def redis_client_new() -> aredis.Redis:
    """Return a new asyncio Redis client bound to the running event loop."""
    # Reads block for at most a few seconds (see dataplane.leases); the socket timeout exceeds that.
    return aredis.Redis.from_url(
        settings.REDIS_URL,
        max_connections=4096,
        socket_timeout=30,
        socket_connect_timeout=5,
        health_check_interval=30,
        # One quick retry on a fresh connection covers a pooled one the server dropped; more
        # would hold a request for seconds while Redis is down, when a fast 503 is the answer
        # (the long-running loops retry on their own, see Outage).
        retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=2),
    )


def script_into(
    pipe: aredis.client.Pipeline,
    script: AsyncScript,
    *,
    keys: Sequence[str],
    args: Sequence[ScriptArg],
) -> None:
    """Queue a Lua script on a pipeline, to run in the pipeline's one round trip.

    redis-py's own script call on a pipeline asks the server whether the script is loaded
    (SCRIPT EXISTS) before each execute: a round trip more on every request's hot path. EVAL
    carries the script's text instead, a few KiB on loopback; the server keeps the compiled
    script by its hash, and a restarted server never answers NOSCRIPT to it.
    """
    text = script.script
    pipe.eval(text if isinstance(text, str) else bytes(text).decode(), len(keys), *keys, *args)


def redis_sync_client() -> redis.Redis:
    """Return a blocking Redis client for management code."""
    return redis.Redis.from_url(settings.REDIS_URL)


# What a Redis outage looks like to a client: refused or dropped connections, timeouts, and a
# restarted server still loading its data (BusyLoadingError is a ConnectionError).
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


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
