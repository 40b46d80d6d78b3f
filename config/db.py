"""Database access from the async data plane.

Django closes stale connections on every request through the request_started and
request_finished signals, which in async mode costs a thread hop per request even when the
request never touches the database. The API's requests are served from caches almost always,
so the data plane skips those signals (see InferenceConfig.ready) and instead does the same
housekeeping here, in the thread that is about to use the connection.

The calls run on a few long-lived threads of their own, each keeping its connection (Django's
connections are per thread) for CONN_MAX_AGE. Thread-sensitive `sync_to_async` would run them
in a thread per request context instead: a new thread, and a new connection to PostgreSQL, for
each cache reload, which stalled the event loop while it connected.

Those threads serve every tenant. A call a tenant drives (its file downloads, lists, batch
reads) goes through `tenant_db_call`, which lets each tenant run at most
ROUNDHOUSE_DB_CALLS_PER_TENANT calls at once: the rest of its calls wait their turn outside
the pool, so one tenant's many downloads leave threads free for every other tenant.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from config.turns import Turns

P = ParamSpec("P")
R = TypeVar("R")

# Enough for a cache miss to load while reloads run; every thread holds one connection.
DB_THREADS = 4
_executor = concurrent.futures.ThreadPoolExecutor(DB_THREADS, thread_name_prefix="db")


def _fresh(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    close_old_connections()
    return fn(*args, **kwargs)


async def db_call(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a synchronous ORM function off the event loop on a healthy connection."""
    return await sync_to_async(_fresh, thread_sensitive=False, executor=_executor)(
        fn, *args, **kwargs
    )


def tenant_share() -> int:
    """How many database calls one tenant may run at once: fewer than the threads there are."""
    return max(1, min(int(settings.ROUNDHOUSE_DB_CALLS_PER_TENANT), DB_THREADS - 1))


# Each tenant's calls running now, at most its share of the threads.
_shares = Turns(tenant_share)


async def tenant_db_call(
    tenant_id: int, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """Run a tenant's ORM function as `db_call` does, within the tenant's share of the threads.

    Use it for every call a tenant's request drives: a tenant with many such calls at once
    waits for its own, never for another tenant's.
    """
    over = await _shares.take(tenant_id)
    # The share is held until the call's thread is done, even if its caller stops waiting
    # for it: a thread still busy with the tenant's work is still the tenant's.
    running = asyncio.ensure_future(db_call(fn, *args, **kwargs))
    running.add_done_callback(functools.partial(_done, over))
    return await asyncio.shield(running)


def _done(over: Callable[[], None], running: asyncio.Future[Any]) -> None:
    if not running.cancelled():
        running.exception()  # seen here: the caller that would have seen it may be gone
    over()
