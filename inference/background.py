"""Fire-and-forget work on the running event loop, kept alive until it is done."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

_running: set[asyncio.Task[Any]] = set()


def spawn(work: Coroutine[Any, Any, Any]) -> None:
    """Run a coroutine without waiting for it, even from a task that is being cancelled."""
    task = asyncio.get_running_loop().create_task(work)
    # The loop keeps only weak references to tasks; this set keeps them until they finish.
    _running.add(task)
    task.add_done_callback(_running.discard)
