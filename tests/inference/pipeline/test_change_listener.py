"""The frontend's control-plane change listener subscribes again when it fails (real Valkey)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
from django.conf import settings
from prometheus_client import REGISTRY
from redis.asyncio.client import PubSub

from dataplane.background import loops_failing
from dataplane.keys import CONTROL_CHANGES_CHANNEL
from inference.pipeline import control_cache as cache_module
from inference.pipeline.control_cache import RefreshingCache

pytestmark = pytest.mark.django_db(transaction=False)


def _failures() -> float:
    return REGISTRY.get_sample_value("roundhouse_loop_failures_total", {"loop": "changes"}) or 0.0


async def test_a_change_listener_that_fails_listens_again_without_waiting_for_a_request(
    monkeypatch,
):
    loads: list[int] = []
    values = {"value": "v1"}

    def load(key: str) -> str:
        loads.append(1)
        return f"{key}:{values['value']}"

    cache = RefreshingCache(load, ttl=lambda: 3600.0, grace=60.0, kind="test-listener")
    real = PubSub.get_message
    failing = {"once": True}

    async def get_message(pubsub: PubSub, *args: Any, **kwargs: Any) -> Any:
        if failing.pop("once", False):
            raise RuntimeError("injected failure")
        return await real(pubsub, *args, **kwargs)

    before = _failures()
    monkeypatch.setattr(PubSub, "get_message", get_message)
    assert await cache.get("k") == "k:v1"  # starts this process's listener
    deadline = time.monotonic() + 10
    while _failures() < before + 1 or loops_failing("changes"):
        assert time.monotonic() < deadline, "the listener did not listen again"
        await asyncio.sleep(0.02)
    listener = cache_module._listener
    assert listener is not None and not listener.done()

    # The listener that started again applies a change published now.
    values["value"] = "v2"
    redis.Redis.from_url(settings.CONTROL_REDIS_URL).publish(
        CONTROL_CHANGES_CHANNEL, "test-listener"
    )
    deadline = time.monotonic() + 10
    while await cache.get("k") != "k:v2":
        assert time.monotonic() < deadline, "the change was not applied"
        await asyncio.sleep(0.02)
