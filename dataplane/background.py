"""Work on the running event loop that outlives what started it: one-off and long-lived.

A long-lived loop (a reply reader, a worker's heartbeat or flusher, the usage ingester) runs
under `supervise`: an exception it did not expect is logged, counted in
`roundhouse_loop_failures_total{loop}` and the loop starts again after a short pause, instead
of its task dying silently while everything that depended on it waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dataplane.metrics import loop_failures

log = logging.getLogger(__name__)

_running: set[asyncio.Task[Any]] = set()

# A failed loop waits this long before it starts again, doubling up to the most while it keeps
# failing (a loop that failed on its first step would otherwise spin and flood the log).
RESTART_FIRST_SECONDS = 0.1
RESTART_MOST_SECONDS = 5.0

# Loops that failed and have not yet run well since: name -> monotonic time of the failure.
_failing: dict[str, float] = {}
_passing: set[asyncio.Task[Any]] = set()


def spawn(
    work: Coroutine[Any, Any, Any], *, name: str | None = None, lasting: bool = False
) -> asyncio.Task[Any]:
    """Run a coroutine without waiting for it, even from a task that is being cancelled.

    `lasting` marks a loop that runs as long as its process; `settle` waits for the others.
    """
    task = asyncio.get_running_loop().create_task(work, name=name)
    # The loop keeps only weak references to tasks; this set keeps them until they finish.
    _running.add(task)
    task.add_done_callback(_running.discard)
    if not lasting:
        _passing.add(task)
        task.add_done_callback(_passing.discard)
    return task


async def event_wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; return whether it is set.

    Not asyncio.wait_for, which on Python 3.11 swallows a cancel that lands in the same turn
    as the event: the waiting task went on, so a client's cancel or a loop's stop was lost.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def settle(*, timeout: float) -> int:
    """Wait up to `timeout` for the running loop's spawned work (not its lasting loops).

    For a loop about to end (`asyncio.run` in a Celery task): what its work spawned, such as
    ending a request whose submission was cut off, would otherwise be cancelled half-way.
    Returns how many tasks were still running when the time was up.
    """
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    waiting = {t for t in _passing if t.get_loop() is loop and t is not current}
    if not waiting:
        return 0
    _, pending = await asyncio.wait(waiting, timeout=timeout)
    return len(pending)


async def supervise(
    name: str,
    loop: Callable[[], Awaitable[None]],
    *,
    on_failure: Callable[[BaseException], None] | None = None,
) -> None:
    """Run a long-lived loop until it returns, starting it again after any exception.

    `name` is the loop's kind, or `kind:instance` (`replies:tiny-chat`); the failure counter
    is labelled by kind. From a failure until the loop calls `loop_ok(name)` (or returns) the
    loop counts as failing (`loops_failing`). `on_failure` runs at once after each failure,
    to end what the loop was serving with an error rather than leave it waiting.
    """
    delay = RESTART_FIRST_SECONDS
    try:
        while True:
            try:
                await loop()
                return
            except Exception as exc:
                if name not in _failing:
                    delay = RESTART_FIRST_SECONDS  # it ran well since its last failure
                loop_failed(name, exc)
                if on_failure is not None:
                    on_failure(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MOST_SECONDS)
    finally:
        _failing.pop(name, None)


def loop_failed(name: str, exc: BaseException) -> None:
    """Log and count a long-lived loop's failure; it is failing until `loop_ok(name)`.

    For a loop that catches its own exceptions and carries on; `supervise` calls it for the rest.
    """
    log.error("%s failed; restarting it", name, exc_info=exc)
    loop_failures.labels(loop=name.partition(":")[0]).inc()
    _failing.setdefault(name, time.monotonic())


def loop_ok(name: str) -> None:
    """Record that a loop completed a step well: it is no longer failing."""
    if _failing:
        _failing.pop(name, None)


def loops_failing(kind: str) -> dict[str, float]:
    """Return the loops of a kind that failed and have not run well since (name -> since)."""
    return {
        name: since
        for name, since in _failing.items()
        if name == kind or name.startswith(f"{kind}:")
    }
