"""The data plane's database threads: one tenant's calls take only its share of them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from config.db import DB_THREADS, tenant_db_call

# The threads check their connections before each call (an earlier test may have left one).
pytestmark = pytest.mark.django_db


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


def test_a_tenants_calls_take_its_share_of_the_threads_and_leave_the_rest_to_others(settings):
    settings.ROUNDHOUSE_DB_CALLS_PER_TENANT = 2
    let_go = threading.Event()
    lock = threading.Lock()
    running = most = 0

    def slow(n: int) -> int:
        """A call that holds its thread until the test lets it go (a long download's read)."""
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        let_go.wait(60)
        with lock:
            running -= 1
        return n

    async def scenario() -> tuple[list[int], str]:
        hogs = [asyncio.create_task(tenant_db_call(1, slow, n)) for n in range(2 * DB_THREADS)]
        await _until(lambda: running == 2, "two of the tenant's calls run")
        # The first tenant holds its share; another tenant's call is answered meanwhile.
        other = await asyncio.wait_for(tenant_db_call(2, str, "answered"), timeout=30)
        assert running == 2
        let_go.set()
        return await asyncio.gather(*hogs), other

    try:
        done, other = asyncio.run(scenario())
    finally:
        let_go.set()
    assert other == "answered"
    assert done == list(range(2 * DB_THREADS))  # every waiting call ran in its turn
    assert most == 2


def test_a_tenants_share_is_less_than_every_thread(settings):
    settings.ROUNDHOUSE_DB_CALLS_PER_TENANT = 100
    inside = threading.Semaphore(0)
    let_go = threading.Event()

    def held() -> None:
        inside.release()
        let_go.wait(60)

    async def scenario() -> str:
        hogs = [asyncio.create_task(tenant_db_call(1, held)) for _ in range(DB_THREADS)]
        for _ in range(DB_THREADS - 1):
            await asyncio.to_thread(inside.acquire, timeout=30)
        other = await asyncio.wait_for(tenant_db_call(2, str, "answered"), timeout=30)
        let_go.set()
        await asyncio.gather(*hogs)
        return other

    try:
        assert asyncio.run(scenario()) == "answered"
    finally:
        let_go.set()


def test_a_call_its_caller_gave_up_on_keeps_the_tenants_share_until_its_thread_is_done(settings):
    settings.ROUNDHOUSE_DB_CALLS_PER_TENANT = 2
    let_go, entered = threading.Event(), threading.Event()
    inside = threading.Semaphore(0)

    def held() -> None:
        inside.release()
        let_go.wait(60)

    async def scenario() -> bool:
        gone = [asyncio.create_task(tenant_db_call(1, held)) for _ in range(2)]
        for _ in range(2):
            await asyncio.to_thread(inside.acquire, timeout=30)
        for task in gone:
            task.cancel()  # their clients went away; their threads still read
        await asyncio.gather(*gone, return_exceptions=True)
        after = asyncio.create_task(tenant_db_call(1, entered.set))
        await asyncio.sleep(0.3)
        started_early = entered.is_set()
        let_go.set()
        await asyncio.wait_for(after, timeout=30)
        return started_early

    try:
        started_early = asyncio.run(scenario())
    finally:
        let_go.set()
    assert not started_early, "the tenant's next call ran while its share's threads were busy"
    assert entered.is_set()
