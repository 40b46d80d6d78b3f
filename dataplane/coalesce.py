"""Commands from many requests, made in one turn of the event loop, sent in one round trip.

A frontend's requests each call a few short scripts on the one Valkey (count the request,
admit it, queue it, settle it). When requests arrive together (a burst of clients, or streams
that started together ending together), their calls fall in the same turn of the frontend's
event loop, and each went as a round trip of its own: a write, a wake-up of Valkey, a read,
for every call. Here a turn's calls are gathered and sent as one pipeline: one write and one
read for all of them, their results handed back to each caller, each command's error to its
own caller only. Scripts go by their hash (`script_into`, `pipeline_execute`).

A call alone in its turn (a quiet frontend) is sent by its caller as before (a script as its
own EVALSHA): no task, no wait beyond the turn. A caller cancelled before its turn ends sends
nothing; one cancelled later leaves its command to run, as a cancelled single call already
may have. On a cluster every call goes as before, on its own: the keys of a turn's calls live
on different primaries, and a cluster client's single calls follow a moved slot where a
pipeline reports it. `ROUNDHOUSE_REDIS_COALESCE=0` sends every call on its own everywhere.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from django.conf import settings
from redis.commands.core import AsyncScript

from dataplane.background import spawn
from dataplane.redis_client import (
    ScriptArg,
    cluster_of,
    commands_drop,
    pipeline_execute,
    script_into,
)

Fill = Callable[[aredis.client.Pipeline], None]


class _Alone:
    """The answer to a call that had its turn to itself: its caller sends it."""


ALONE = _Alone()


@dataclass
class _Call:
    fill: Fill
    future: asyncio.Future[Any]


class Coalescer:
    """Gathers the pipelines callers fill during one turn of the loop into one round trip."""

    def __init__(self, client: aredis.Redis) -> None:
        self._client = client
        self._alone = cluster_of(client) is not None or not settings.ROUNDHOUSE_REDIS_COALESCE
        self._waiting: list[_Call] = []
        self.batches = 0  # round trips that carried more than one call
        self.carried = 0  # the calls those carried

    async def run(self, fill: Fill) -> list[Any]:
        """Send the commands `fill` puts on a pipeline, with the turn's others; their results.

        Raises the first error among its own commands, as a pipeline's `execute` does, or
        the error that broke the round trip.
        """
        return await self._turn(fill, lambda: self._own(fill))

    async def script(
        self, script: AsyncScript, *, keys: Sequence[str], args: Sequence[ScriptArg]
    ) -> Any:
        """Run one Lua script with the turn's other calls; its result.

        Alone in its turn, or on a cluster, it is the script's own call (EVALSHA), as before.
        """

        async def alone() -> list[Any]:
            return [await script(keys=keys, args=args)]

        found = await self._turn(
            lambda pipe: script_into(pipe, script, keys=keys, args=args), alone
        )
        return found[0]

    async def _turn(self, fill: Fill, alone: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
        """Wait for the turn's end and take the shared round trip's answer, or send `alone`
        (a call by itself in its turn, or every call where calls are not gathered)."""
        if self._alone:
            return await alone()
        loop = asyncio.get_running_loop()
        call = _Call(fill, loop.create_future())
        self._waiting.append(call)
        if len(self._waiting) == 1:
            # After every task already ready this turn: those reaching a call join it.
            loop.call_soon(self._gather)
        found = await call.future
        if found is ALONE:
            return await alone()
        for result in found:
            if isinstance(result, Exception):
                raise result
        return list(found)

    async def _own(self, fill: Fill) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            fill(pipe)
            return await pipeline_execute(pipe)

    def _gather(self) -> None:
        calls = [call for call in self._waiting if not call.future.done()]
        self._waiting = []
        if len(calls) == 1:
            calls[0].future.set_result(ALONE)
        elif calls:
            self.batches += 1
            self.carried += len(calls)
            # A task of its own: no caller's cancel can stop the others' round trip.
            spawn(self._send(calls), name="coalesced round trip")

    async def _send(self, calls: list[_Call]) -> None:
        sizes = []
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for call in calls:
                    before = len(pipe)
                    try:
                        call.fill(pipe)
                    except Exception as exc:  # its own error: the others' commands still go
                        commands_drop(pipe, before)
                        call.future.set_exception(exc)
                    sizes.append(len(pipe) - before)
                results = await pipeline_execute(pipe, raise_on_error=False)
        except BaseException as exc:
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for call, size in zip(calls, sizes, strict=True):
            if not call.future.done():
                call.future.set_result(results[start : start + size])
            start += size


_coalescers: weakref.WeakKeyDictionary[aredis.Redis, Coalescer] = weakref.WeakKeyDictionary()


def coalescer_of(client: aredis.Redis) -> Coalescer:
    """The one coalescer of a client: every caller on it shares its turns."""
    found = _coalescers.get(client)
    if found is None:
        found = _coalescers[client] = Coalescer(client)
    return found
