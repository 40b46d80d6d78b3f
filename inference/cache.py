"""A small per-process cache for control-plane reads on the request path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from inference.db import db_call

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Entry(Generic[V]):
    value: V
    loaded_at: float


class RefreshingCache(Generic[K, V]):
    """Serve an entry for `ttl` seconds, then keep serving it while one task reloads it.

    A request never waits for the database because an entry aged: only a missing entry, or
    one older than `ttl + grace` (the reloads kept failing), is loaded inline.
    """

    def __init__(self, load: Callable[[K], V], *, ttl: Callable[[], float], grace: float) -> None:
        self._load = load
        self._ttl = ttl
        self._grace = grace
        self._entries: dict[K, _Entry[V]] = {}
        self._reloading: dict[K, asyncio.Task[None]] = {}

    async def get(self, key: K) -> V:
        entry = self._entries.get(key)
        age = time.monotonic() - entry.loaded_at if entry else None
        if entry is None or age is None or age > self._ttl() + self._grace:
            return await self._reload(key)
        if age > self._ttl() and key not in self._reloading:
            task = asyncio.get_running_loop().create_task(self._reload_quietly(key))
            self._reloading[key] = task
            task.add_done_callback(lambda _: self._reloading.pop(key, None))
        return entry.value

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)

    async def _reload(self, key: K) -> V:
        value = await db_call(self._load, key)
        self._entries[key] = _Entry(value, time.monotonic())
        return value

    async def _reload_quietly(self, key: K) -> None:
        try:
            await self._reload(key)
        except Exception:
            log.warning("reloading %r failed; serving the cached value", key, exc_info=True)
