from __future__ import annotations

import asyncio

import pytest

from inference.cache import RefreshingCache

pytestmark = pytest.mark.django_db(transaction=False)


class Source:
    def __init__(self) -> None:
        self.value = "v1"
        self.loads = 0

    def load(self, key: str) -> str:
        self.loads += 1
        return f"{key}:{self.value}"


async def test_it_serves_a_stale_entry_while_reloading_it():
    source = Source()
    ttl = [60.0]
    cache = RefreshingCache(source.load, ttl=lambda: ttl[0], grace=60.0)
    assert await cache.get("k") == "k:v1"
    assert await cache.get("k") == "k:v1" and source.loads == 1
    source.value, ttl[0] = "v2", 0.0
    assert await cache.get("k") == "k:v1"  # stale, reload started in the background
    for _ in range(50):
        await asyncio.sleep(0.01)
        if source.loads == 2:
            break
    assert await cache.get("k") == "k:v2"


async def test_a_dropped_entry_is_loaded_again_at_once():
    source = Source()
    cache = RefreshingCache(source.load, ttl=lambda: 60.0, grace=60.0)
    await cache.get("k")
    source.value = "v2"
    cache.drop("k")
    assert await cache.get("k") == "k:v2"


async def test_an_entry_past_its_grace_is_loaded_inline():
    source = Source()
    cache = RefreshingCache(source.load, ttl=lambda: 0.0, grace=0.0)
    await cache.get("k")
    source.value = "v2"
    await asyncio.sleep(0.01)
    assert await cache.get("k") == "k:v2"
