"""A small per-process cache for control-plane reads on the request path.

Each cache belongs to a kind of control-plane state (keys, routes, policies). A change to
that state publishes its kind once the transaction commits (`dataplane.changes`); every
frontend's listener then marks the kind's entries stale, and each is reloaded in the
background on its next use. The TTL is the bound for a change whose message was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from config.db import db_call
from dataplane.background import loop_ok, spawn, supervise
from dataplane.breakers import breaker_message_read, breakers_held
from dataplane.changes import ACCESS, ROUTES
from dataplane.keys import BREAKERS_CHANNEL, CONTROL_CHANGES_CHANNEL, KEY_REVOCATIONS_CHANNEL
from dataplane.redis_client import control_client_new
from inference.pipeline.breaker import (
    breaker_elsewhere,
    breakers_elsewhere_replace,
    breakers_observe,
)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Entry(Generic[V]):
    value: V
    loaded_at: float
    generation: int


class RefreshingCache(Generic[K, V]):
    """Serve an entry for `ttl` seconds, then keep serving it while one task reloads it.

    A request never waits for the database because an entry aged or went stale: only a
    missing entry, or one older than `ttl + grace` (the reloads kept failing), is loaded
    inline. `kind` names the control-plane state it caches, whose change messages mark
    every entry stale at once.

    Both shelves are LRUs of bounded size, because a client chooses the keys looked up (an
    API key's public id, a model name) before anything proves it may: at most `max_entries`
    found values, and at most `max_missing` of the keys whose load found nothing (None), so
    a flood of made-up keys can evict only other made-up keys.
    """

    def __init__(
        self,
        load: Callable[[K], V],
        *,
        ttl: Callable[[], float],
        grace: float,
        kind: str,
        max_entries: int = 10_000,
        max_missing: int = 1_024,
    ) -> None:
        self._load = load
        self._ttl = ttl
        self._grace = grace
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._missing: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._max_entries = max_entries
        self._max_missing = max_missing
        self._reloading: dict[K, asyncio.Task[None]] = {}
        # Bumped by a change message: entries loaded (or whose load began) before it are stale.
        self._generation = 0
        # Raised by `forget`: entries whose load began before it are never served or kept.
        self._floor = 0
        _caches.setdefault(kind, []).append(self)

    async def get(self, key: K) -> V:
        _listener_ensure()
        entry = self._entries.get(key) or self._missing.get(key)
        if entry is not None and entry.generation < self._floor:
            entry = None
        if entry is not None:
            (self._missing if entry.value is None else self._entries).move_to_end(key)
        age = time.monotonic() - entry.loaded_at if entry else None
        if entry is None or age is None or age > self._ttl() + self._grace:
            return await self._reload(key)
        stale = age > self._ttl() or entry.generation < self._generation
        if stale and key not in self._reloading:
            task = asyncio.get_running_loop().create_task(self._reload_quietly(key))
            self._reloading[key] = task
            task.add_done_callback(lambda _: self._reloading.pop(key, None))
        return entry.value

    def __len__(self) -> int:
        return len(self._entries) + len(self._missing)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)
        self._missing.pop(key, None)

    def invalidate(self) -> None:
        """Mark every entry stale: each is reloaded in the background on its next use."""
        self._generation += 1

    def forget(self) -> None:
        """Drop every entry, and any load already under way: the next use of each loads it."""
        self._generation += 1
        self._floor = self._generation
        self._entries.clear()
        self._missing.clear()

    async def _reload(self, key: K) -> V:
        generation = self._generation
        value = await db_call(self._load, key)
        if generation >= self._floor:
            self._store(key, _Entry(value, time.monotonic(), generation))
        return value

    def _store(self, key: K, entry: _Entry[V]) -> None:
        """Keep an entry on its shelf, forgetting the shelf's least recently used past its bound."""
        if entry.value is None:
            shelf, bound, other = self._missing, self._max_missing, self._entries
        else:
            shelf, bound, other = self._entries, self._max_entries, self._missing
        other.pop(key, None)
        shelf[key] = entry
        shelf.move_to_end(key)
        while len(shelf) > bound:
            shelf.popitem(last=False)

    async def _reload_quietly(self, key: K) -> None:
        try:
            await self._reload(key)
        except Exception:
            log.warning("reloading %r failed; serving the cached value", key, exc_info=True)


_caches: dict[str, list[RefreshingCache[Any, Any]]] = {}
_listener: asyncio.Task[None] | None = None
# Called with a key's public id once its revocation (or narrowing) message arrives, after the
# caches forgot it: an open socket is checked again then, not at its next periodic check.
_revocation_hooks: list[Callable[[str], None]] = []


def revocation_hook_add(hook: Callable[[str], None]) -> None:
    """Call `hook(public_id)` on this process's loop whenever a key is revoked (once per hook)."""
    if hook not in _revocation_hooks:
        _revocation_hooks.append(hook)


def change_received(kind: str) -> None:
    """Mark the caches of a kind of control-plane state stale (a change message arrived).

    A change of access (a model taken from a tenant) drops the cached routes instead.
    """
    if kind == ACCESS:
        for cache in _caches.get(ROUTES, []):
            cache.forget()
        return
    for cache in _caches.get(kind, []):
        cache.invalidate()


def revocation_received(public_id: str) -> None:
    """Forget a revoked key at once: it must not be served even while a reload runs."""
    for cache in _caches.get("keys", []):
        cache.drop(public_id)
    for hook in _revocation_hooks:
        try:
            hook(public_id)
        except Exception:
            log.warning("a revocation hook failed for %s", public_id, exc_info=True)


def _listener_ensure() -> None:
    """Start this process's listener in the running loop, unless one runs there already."""
    global _listener
    loop = asyncio.get_running_loop()
    if _listener is None or _listener.done() or _listener.get_loop() is not loop:
        # Supervised: it subscribes again after any failure, without waiting for a request.
        _listener = spawn(supervise("changes", _listen), name="changes", lasting=True)


async def _listen() -> None:
    """Apply change and revocation messages to this process's caches until it stops."""
    client = control_client_new()
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(CONTROL_CHANGES_CHANNEL, KEY_REVOCATIONS_CHANNEL, BREAKERS_CHANNEL)
        loop_ok("changes")
        # Messages sent while no listener was subscribed (before this one, or while Redis was
        # away) are lost: whatever is cached may predate them, and other frontends' breakers
        # are read whole.
        for kind in _caches:
            change_received(kind)
        breakers_elsewhere_replace(await breakers_held(client))
        while True:
            message = await pubsub.get_message(timeout=1.0)
            breakers_observe()
            if message is None:
                continue
            channel, data = (
                v.decode() if isinstance(v, bytes) else str(v)
                for v in (message["channel"], message["data"])
            )
            if channel == KEY_REVOCATIONS_CHANNEL:
                revocation_received(data)
            elif channel == BREAKERS_CHANNEL:
                news = breaker_message_read(data)
                if news is not None:
                    breaker_elsewhere(*news)
            else:
                change_received(data)
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
            await client.aclose()
