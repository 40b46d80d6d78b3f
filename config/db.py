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
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

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
