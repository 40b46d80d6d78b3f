"""The LoRA adapters a generative worker's engine holds, and the error of one it cannot serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from workers.engine import AdapterRef, Engine

log = logging.getLogger(__name__)


class AdapterError(Exception):
    """A job's LoRA adapter cannot be served here (unknown, tampered, or failed to load)."""


class Adapters:
    """The LoRA adapters loaded into the engine: loaded on first use, evicted least recently used.

    An adapter's files are verified against its manifest before it is loaded; a request for a
    bad adapter fails on its own instead of taking the engine (and every stream in it) down.
    Adapters in use by running requests are never evicted.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        resolve: Callable[[str], Awaitable[AdapterRef]],
        capacity: int,
    ) -> None:
        self.engine = engine
        self.resolve = resolve
        self.capacity = capacity
        self._loaded: OrderedDict[str, AdapterRef] = OrderedDict()
        self._loading: dict[str, asyncio.Task[AdapterRef]] = {}
        self._in_use: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def using(self, digest: str) -> AsyncIterator[AdapterRef]:
        """Hold an adapter loaded while a request runs on it."""
        ref = await self._get(digest)
        self._in_use[digest] = self._in_use.get(digest, 0) + 1
        try:
            yield ref
        finally:
            self._in_use[digest] -= 1

    def forget(self) -> None:
        """Forget every loaded adapter: the engine that held them is gone."""
        self._loaded.clear()

    async def _get(self, digest: str) -> AdapterRef:
        if digest in self._loaded:
            self._loaded.move_to_end(digest)
            return self._loaded[digest]
        task = self._loading.get(digest)
        if task is None:
            task = asyncio.create_task(self._load(digest))
            self._loading[digest] = task
            task.add_done_callback(lambda _: self._loading.pop(digest, None))
        return await asyncio.shield(task)

    async def _load(self, digest: str) -> AdapterRef:
        try:
            ref = await self.resolve(digest)
            await self.engine.adapter_load(ref)
        except Exception as exc:
            raise AdapterError(f"adapter {digest[:12]} cannot be served: {exc}") from exc
        self._loaded[digest] = ref
        log.info("loaded adapter %s", ref.name)
        await self._evict()
        return ref

    async def _evict(self) -> None:
        for digest in list(self._loaded):
            if len(self._loaded) <= self.capacity:
                return
            if self._in_use.get(digest):
                continue
            ref = self._loaded.pop(digest)
            await self.engine.adapter_evict(ref)
            log.info("evicted adapter %s (least recently used)", ref.name)
