from __future__ import annotations

import asyncio

import pytest

from dataplane.changes import ACCESS, POLICIES, ROUTES, change_publish
from dataplane.keys import CONTROL_CHANGES_CHANNEL
from dataplane.redis_client import control_sync_client
from inference.pipeline import control_cache
from inference.pipeline.control_cache import RefreshingCache, change_received, revocation_received
from models_registry.models import Alias

pytestmark = pytest.mark.django_db(transaction=False)


class Source:
    def __init__(self) -> None:
        self.value = "v1"
        self.loads = 0

    def load(self, key: str) -> str:
        self.loads += 1
        return f"{key}:{self.value}"


async def _loaded(source: Source, loads: int) -> None:
    for _ in range(200):
        if source.loads >= loads:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{source.loads} loads, expected {loads}")


async def _stale_then_fresh(cache: RefreshingCache[str, str], source: Source) -> None:
    """The old value is served while a reload runs; the new one once it has landed."""
    assert await cache.get("k") == "k:v1"
    await _loaded(source, 2)
    await asyncio.sleep(0.01)
    assert await cache.get("k") == "k:v2"


async def test_it_serves_a_stale_entry_while_reloading_it():
    source = Source()
    ttl = [60.0]
    cache = RefreshingCache(source.load, ttl=lambda: ttl[0], grace=60.0, kind="test-a")
    assert await cache.get("k") == "k:v1"
    assert await cache.get("k") == "k:v1" and source.loads == 1
    source.value, ttl[0] = "v2", 0.0
    await _stale_then_fresh(cache, source)


async def test_a_dropped_entry_is_loaded_again_at_once():
    source = Source()
    cache = RefreshingCache(source.load, ttl=lambda: 60.0, grace=60.0, kind="test-b")
    await cache.get("k")
    source.value = "v2"
    cache.drop("k")
    assert await cache.get("k") == "k:v2"


async def test_an_entry_past_its_grace_is_loaded_inline():
    source = Source()
    cache = RefreshingCache(source.load, ttl=lambda: 0.0, grace=0.0, kind="test-c")
    await cache.get("k")
    source.value = "v2"
    await asyncio.sleep(0.01)
    assert await cache.get("k") == "k:v2"


async def test_a_change_of_its_kind_reloads_a_fresh_entry_without_waiting_for_the_ttl():
    source, other = Source(), Source()
    cache = RefreshingCache(source.load, ttl=lambda: 3600.0, grace=60.0, kind="test-d")
    unrelated = RefreshingCache(other.load, ttl=lambda: 3600.0, grace=60.0, kind="test-e")
    await cache.get("k")
    await unrelated.get("k")
    source.value = other.value = "v2"
    change_received("test-d")
    await _stale_then_fresh(cache, source)
    assert await unrelated.get("k") == "k:v1" and other.loads == 1


async def test_a_load_that_began_before_a_change_is_reloaded_after_it():
    started, release = asyncio.Event(), asyncio.Event()
    source = Source()
    loop = asyncio.get_running_loop()

    def slow_load(key: str) -> str:
        value = source.load(key)
        loop.call_soon_threadsafe(started.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
        return value

    cache = RefreshingCache(slow_load, ttl=lambda: 3600.0, grace=60.0, kind="test-f")
    first = asyncio.create_task(cache.get("k"))
    await started.wait()
    source.value = "v2"
    change_received("test-f")  # the change lands while the old value is being read
    release.set()
    assert await first == "k:v1"
    await _stale_then_fresh(cache, source)  # stale at first: its load began before the change


async def test_a_change_of_access_drops_every_route_at_once_and_any_load_under_way():
    """A tenant whose grant was revoked is never routed by what was cached before, not even
    once while a reload runs (a mere change serves the stale entry meanwhile)."""
    started, release = asyncio.Event(), asyncio.Event()
    source = Source()
    loop = asyncio.get_running_loop()
    slow = ["k2"]

    def load(key: str) -> str:
        value = source.load(key)
        if key in slow:
            loop.call_soon_threadsafe(started.set)
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
        return value

    cache = RefreshingCache(load, ttl=lambda: 3600.0, grace=60.0, kind=ROUTES)
    assert await cache.get("k") == "k:v1"
    loading = asyncio.create_task(cache.get("k2"))
    await started.wait()
    source.value = "v2"
    change_received(ACCESS)  # lands while k2's old value is being read
    release.set()
    assert await loading == "k2:v1"  # its caller asked before the change
    slow.clear()
    assert await cache.get("k") == "k:v2"  # not the stale entry: loaded anew, inline
    assert await cache.get("k2") == "k2:v2"  # the load under way was not kept


async def test_a_revocation_drops_the_key_at_once():
    source = Source()
    cache = RefreshingCache(source.load, ttl=lambda: 3600.0, grace=60.0, kind="keys")
    await cache.get("pub123")
    source.value = "revoked"
    revocation_received("pub123")
    assert await cache.get("pub123") == "pub123:revoked"


async def test_a_revocation_calls_the_hooks_after_the_caches_forgot_the_key():
    source = Source()
    cache = RefreshingCache(source.load, ttl=lambda: 3600.0, grace=60.0, kind="keys")
    await cache.get("pub9")
    source.value = "revoked"
    heard: list[str] = []

    def hook(public_id: str) -> None:
        heard.append(public_id)

    def broken(public_id: str) -> None:
        raise RuntimeError("one hook failing stops none of the others")

    control_cache.revocation_hook_add(broken)
    control_cache.revocation_hook_add(hook)
    control_cache.revocation_hook_add(hook)  # added once
    try:
        revocation_received("pub9")
        assert heard == ["pub9"]
        assert await cache.get("pub9") == "pub9:revoked"
    finally:
        control_cache._revocation_hooks.remove(broken)
        control_cache._revocation_hooks.remove(hook)


def test_saving_a_route_source_publishes_a_change_once_the_transaction_commits(
    world, django_capture_on_commit_callbacks
):
    client = control_sync_client()
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(CONTROL_CHANGES_CHANNEL)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            Alias.objects.get(name="tiny-chat").save()
            assert pubsub.get_message(timeout=0.3) is None  # not before the commit
        message = pubsub.get_message(timeout=2.0)
        assert message is not None and message["data"] == ROUTES.encode()
        with django_capture_on_commit_callbacks(execute=True):
            change_publish(POLICIES)  # code that changes state by bulk update
        message = pubsub.get_message(timeout=2.0)
        assert message is not None and message["data"] == POLICIES.encode()
    finally:
        pubsub.close()
        client.close()
