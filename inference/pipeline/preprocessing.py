"""A request's CPU-heavy preparation (chat template, tokenizer) off the event loop, in turn.

Rendering a long conversation or tokenising a long prompt holds the interpreter for tens of
milliseconds: on the event loop, every stream on the frontend would wait for it. Such steps
run on a few threads of their own, and each tenant has at most
ROUNDHOUSE_PREPROCESS_PER_TENANT of them at a time per frontend: a tenant that sends many heavy
requests at once queues behind its own, and every other tenant finds a thread free. A step
whose client went away keeps its tenant's turn until it ends, so a tenant cannot pile up more
running work than its share by hanging up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import sys
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.conf import settings

from config.turns import Turns

P = ParamSpec("P")
R = TypeVar("R")

_turns = Turns(lambda: int(settings.ROUNDHOUSE_PREPROCESS_PER_TENANT))
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_made = threading.Lock()


# How long a busy thread may keep the interpreter while the event loop waits for it. Python's
# default, 5 ms, is paid by every wake-up of the loop while a preprocessing thread renders or
# parses: measured, the loop woke 5.3 ms late at the median beside a thread rendering a long
# conversation, 1.3 ms at 1 ms. A request's trip wakes the loop several times.
SWITCH_INTERVAL_SECONDS = 0.001


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_made:
        if _executor is None:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_SECONDS))
            _executor = concurrent.futures.ThreadPoolExecutor(
                max(1, int(settings.ROUNDHOUSE_PREPROCESS_THREADS)),
                thread_name_prefix="preprocess",
            )
        return _executor


async def preprocessed(
    tenant_id: int, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """Run a preparation step on the preprocessing threads, in one of its tenant's turns."""
    over = await _turns.take(tenant_id)
    try:
        # In the caller's context, as asyncio.to_thread runs a call: whose request it is (the
        # schemas it compiles are kept per tenant) and its log fields go with it.
        context = contextvars.copy_context()
        done = _pool().submit(context.run, functools.partial(fn, *args, **kwargs))
    except BaseException:
        over()
        raise
    loop = asyncio.get_running_loop()
    # The turn ends when the step does, even if its caller stopped waiting for it.
    done.add_done_callback(lambda _: loop.call_soon_threadsafe(over))
    return await asyncio.wrap_future(done)


def tenants_waiting() -> set[int]:
    """The tenants with a preparation step running or waiting on this frontend."""
    return _turns.tenants()
