"""The usage ingester and its reaper start again when they fail, against a real Valkey server."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY

import billing.ingester as ingester_module
from billing.ingester import Ingester
from dataplane.background import loops_failing
from dataplane.redis_client import redis_client_new
from tests.dataplane.roles import roles


def _failures(loop: str) -> float:
    return REGISTRY.get_sample_value("roundhouse_loop_failures_total", {"loop": loop}) or 0.0


async def _until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _failing_once(real: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    """`real`, except that its first call raises, as a bug behind it would."""

    async def call(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        return await real(**kwargs)

    return call


def test_an_ingester_whose_step_fails_is_counted_and_ingests_on(monkeypatch):
    deployment = f"i-{uuid.uuid4().hex[:8]}"

    async def listed(*_args: object, **_kwargs: object) -> list[str]:
        return [deployment]

    monkeypatch.setattr(ingester_module, "db_call", listed)

    async def scenario() -> None:
        client = redis_client_new()
        dispatch = roles(client)
        reads: list[int] = []
        ingester = Ingester(client=dispatch.redis, reply_ttl=dispatch.reply_ttl, consumer="loops")
        real = ingester.usage.read_usage
        monkeypatch.setattr(ingester.usage, "read_usage", _failing_once(real, reads))
        before = _failures("ingester")
        running = asyncio.create_task(ingester.run())
        try:
            # Before, the exception ended run(): nothing was ingested again until a restart.
            await _until(lambda: len(reads) >= 3)
            assert not running.done()
            assert _failures("ingester") == before + 1
            await _until(lambda: not loops_failing("ingester"))
        finally:
            ingester.stop()
            await asyncio.wait_for(running, 10)
            await client.aclose()

    asyncio.run(scenario())


def test_a_reap_that_fails_is_counted_and_the_next_reaps(monkeypatch):
    deployment = f"i-{uuid.uuid4().hex[:8]}"

    async def listed(*_args: object, **_kwargs: object) -> list[str]:
        return [deployment]

    monkeypatch.setattr(ingester_module, "db_call", listed)

    async def scenario() -> None:
        client = redis_client_new()
        dispatch = roles(client)
        reaps: list[int] = []
        ingester = Ingester(client=dispatch.redis, reply_ttl=dispatch.reply_ttl, consumer="loops")
        real = ingester.reaper.reclaim_expired
        monkeypatch.setattr(ingester.reaper, "reclaim_expired", _failing_once(real, reaps))
        before = _failures("reaper")
        running = asyncio.create_task(ingester.run())
        try:
            await _until(lambda: len(reaps) >= 2)  # reaps once a second
            assert _failures("reaper") == before + 1
            await _until(lambda: not loops_failing("reaper"))
        finally:
            ingester.stop()
            await asyncio.wait_for(running, 10)
            await client.aclose()

    asyncio.run(scenario())
