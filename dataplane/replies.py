"""Read every reply stream a process relays for a deployment over one connection.

A blocking XREAD per relayed request costs a Redis connection per concurrent stream (a frontend
serving thousands of streams would hold thousands, past its pool's bound) and a command per
event per stream. Here each deployment gets one reader task: one blocking XREAD over the reply
streams of all its followed requests returns whatever any of them has, and hands each follower
its entries. A request that starts to be followed wakes the reader through a small wake stream
of its own (an XADD the blocked XREAD returns for), so the reader adds the new stream at once.
Every key of one XREAD carries the deployment's hash tag, as Redis Cluster requires.

A follower whose client reads slowly holds at most `PAUSE_AT` entries: past that its stream
drops out of the XREAD until the client catches up, and its entries wait in Redis, as they
did when each client read its own stream.

The reader runs supervised (`dataplane.background`): if it fails, every request it was
following gets `ReaderFailed` (a terminal error for its client, never silence) and the reader
starts again for the requests that follow from then on. An entry id must be valid before it
joins the shared XREAD: one that Redis refuses would fail every stream read with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import redis.asyncio as aredis

from dataplane.background import event_wait, loop_ok, spawn, supervise
from dataplane.keys import reply_wake_key
from dataplane.redis_client import UNREACHABLE, Outage, cluster_of, text_of
from dataplane.types import Event, event_decoder

log = logging.getLogger(__name__)

# Entries read per stream per XREAD; a follower holding this many is paused (see above).
READ_COUNT = 512
PAUSE_AT = 1024
# The reader's XREAD returns at least this often (milliseconds), to drop followers that went
# away without closing and to notice it has nothing left to follow.
BLOCK_MS = 1000
# An idle reader keeps its connection this long, so one request after another does not
# connect anew each time.
LINGER_SECONDS = 10.0
# A follower not read for this long is dropped (its consumer went away without closing).
ABANDONED_SECONDS = 60.0
WAKE_TTL_SECONDS = 3600


def _entry_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


_ID_PART_MAX = 2**64 - 1


def entry_id_parse(value: str) -> tuple[int, int]:
    """Return a stream entry id's (milliseconds, sequence); ValueError unless Redis takes it.

    A Redis stream id is two unsigned 64-bit integers joined by a dash (`1718000000000-3`).
    """
    ms, dash, seq = value.partition("-")
    parts = (ms, seq)
    if not dash or not all(p.isascii() and p.isdigit() and len(p) <= 20 for p in parts):
        raise ValueError(f"not a stream entry id: {value[:50]!r}")
    parsed = int(ms), int(seq)
    if max(parsed) > _ID_PART_MAX:
        raise ValueError(f"stream entry id out of range: {value[:50]!r}")
    return parsed


class ReaderFailed(Exception):
    """The reader of a deployment's reply streams failed: this follower gets nothing more."""


class Follower:
    """One reader of a reply stream, from an entry id on, filled by its deployment's reader."""

    def __init__(self, reader: _DeploymentReader, key: str, after: str) -> None:
        self._reader = reader
        self.key = key
        self.after = after  # the newest entry id handed to this follower
        self.entries: list[tuple[str, Event]] = []
        self.error: BaseException | None = None
        self.failure: ReaderFailed | None = None  # terminal: the reader failed
        self.ready = asyncio.Event()
        self.read_at = time.monotonic()
        self.closed = False

    @property
    def paused(self) -> bool:
        return len(self.entries) >= PAUSE_AT

    async def read(self, *, block_ms: int) -> list[tuple[str, Event]]:
        """Return the entries fetched since the last read, waiting up to block_ms for one.

        Raises what the reader's last XREAD raised (Redis unreachable), once; `ReaderFailed`
        on every read once the reader failed.
        """
        self.read_at = time.monotonic()
        if self.failure is not None:
            raise self.failure
        if self.closed:
            # Dropped as abandoned while its client was slow to take what it had: follow on.
            self.closed = False
            self._reader.add(self)
        if not self.entries and self.error is None and self.failure is None:
            # A client's cancel or disconnect that lands as an entry arrives must end the read.
            await event_wait(self.ready, block_ms / 1000)
        self.read_at = time.monotonic()
        self.ready.clear()
        if self.failure is not None:
            raise self.failure
        if self.error is not None and not self.entries:
            error, self.error = self.error, None
            raise error
        was_paused = self.paused
        entries, self.entries = self.entries, []
        if was_paused:
            self._reader.wake()  # take its stream back into the reads
        return entries

    def close(self) -> None:
        """Stop following (the request ended, or its client went away)."""
        if not self.closed:
            self.closed = True
            self._reader.remove(self)

    def _put(self, entries: list[tuple[str, Event]]) -> None:
        after = _entry_id(self.after)
        new = [entry for entry in entries if _entry_id(entry[0]) > after]
        if new:
            self.entries.extend(new)
            self.after = new[-1][0]
            self.ready.set()

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self.ready.set()

    def _end(self, failure: ReaderFailed) -> None:
        self.failure = failure
        self.closed = True  # its reader forgot it already
        self.ready.set()


class _DeploymentReader:
    """The reply streams of one deployment that this process follows, read by one task."""

    def __init__(self, client: aredis.Redis, deployment: str) -> None:
        self._client = client
        self.deployment = deployment
        self._name = f"replies:{deployment}"
        # Its own wake stream: a key of this deployment's hash slot, unique to this reader.
        self._wake_key = reply_wake_key(deployment, uuid.uuid4().hex)
        self._wake_seen = "0-0"
        self._wake_pending = False
        # Several followers of one stream in one process happen: a client attached to a
        # request (an Idempotency-Key retry) while the request's own client still reads it.
        self._followers: dict[str, list[Follower]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, follower: Follower) -> None:
        self._followers.setdefault(follower.key, []).append(follower)
        if self._task is None:
            self._task = spawn(
                supervise(self._name, self._run, on_failure=self._failed),
                name=self._name,
                lasting=True,
            )
        else:
            self.wake()

    def remove(self, follower: Follower) -> None:
        followers = self._followers.get(follower.key, [])
        if follower in followers:
            followers.remove(follower)
        if not followers:
            self._followers.pop(follower.key, None)

    def wake(self) -> None:
        """Make the blocked XREAD return, so it is sent again with the current streams."""
        if self._wake_pending or self._task is None:
            return
        self._wake_pending = True
        spawn(self._wake_write())

    async def _wake_write(self) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {"w": "1"}, maxlen=1, approximate=False)
                pipe.expire(self._wake_key, WAKE_TTL_SECONDS)
                await pipe.execute()
        except UNREACHABLE:
            # The reader's own XREAD fails too, and is sent again with every stream.
            self._wake_pending = False

    def _streams(self) -> dict[str, str]:
        """Each followed stream from its furthest-behind follower that takes entries now."""
        streams = {}
        for key, followers in self._followers.items():
            open_ = [f.after for f in followers if not f.paused]
            if open_:
                streams[key] = min(open_, key=_entry_id)
        streams[self._wake_key] = self._wake_seen
        return streams

    async def _run(self) -> None:
        outage = Outage(f"reading reply streams of {self.deployment}", log, logging.DEBUG)
        # A connection of its own for the blocking reads; a cluster client takes a connection
        # to the slot's node from its pool for each read instead.
        dedicated = cluster_of(self._client) is None
        connection = (
            aredis.Redis(
                connection_pool=self._client.connection_pool, single_connection_client=True
            )
            if dedicated
            else self._client
        )
        idle_since: float | None = None
        try:
            while True:
                now = time.monotonic()
                for followers in list(self._followers.values()):
                    for follower in list(followers):
                        if now - follower.read_at > ABANDONED_SECONDS:
                            follower.close()
                if self._followers:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since > LINGER_SECONDS:
                    self._task = None  # before any await: a new follower starts a new task
                    return
                streams = self._streams()
                try:
                    response: Any = await connection.xread(
                        streams,  # type: ignore[arg-type]
                        count=READ_COUNT,
                        block=BLOCK_MS,
                    )
                    outage.ok()
                    loop_ok(self._name)
                except UNREACHABLE as exc:
                    for followers in self._followers.values():
                        for follower in followers:
                            follower._fail(exc)
                    await asyncio.sleep(outage.failed(exc))
                    continue
                self._deliver(response, streams)
        finally:
            if dedicated:
                with contextlib.suppress(Exception):
                    await connection.aclose(close_connection_pool=False)

    def _failed(self, error: BaseException) -> None:
        """End every current follower with ReaderFailed; the restarted reader starts afresh.

        Whatever made the reader fail may lie in a follower's state: keeping them would fail
        it again, each time.
        """
        failure = ReaderFailed(f"the reader of {self.deployment}'s reply streams failed")
        followers, self._followers = self._followers, {}
        for each in followers.values():
            for follower in each:
                follower._end(failure)
        self._wake_pending = False

    def _deliver(self, response: Any, sent: dict[str, str]) -> None:
        """Hand each follower the entries of an XREAD that was sent `sent` (key: read after).

        A follower gets entries only from a read that started at or before its own position:
        one that joined (or was paused) while the read was out may sit further back than the
        read began, and taking its entries would skip the ones between. The next read, sent at
        once, starts from where that follower is.
        """
        for raw_key, entries in response or []:
            key = text_of(raw_key)
            if key == self._wake_key:
                self._wake_seen = text_of(entries[-1][0])
                self._wake_pending = False
                continue
            start = _entry_id(sent[key])
            decoded = [
                (text_of(eid), event_decoder.decode(fields[b"e"])) for eid, fields in entries
            ]
            for follower in self._followers.get(key, []):
                if decoded and not follower.paused and _entry_id(follower.after) >= start:
                    follower._put(decoded)


class ReplyReaders:
    """This process's reply-stream readers, one per deployment (see the module's doc)."""

    def __init__(self, client: aredis.Redis) -> None:
        self._client = client
        self._readers: dict[str, _DeploymentReader] = {}

    def follow(self, *, deployment: str, key: str, after: str) -> Follower:
        """Start following one reply stream after an entry id; close the follower when done.

        Raises ValueError for an entry id Redis would refuse (see `entry_id_parse`).
        """
        entry_id_parse(after)
        reader = self._readers.get(deployment)
        if reader is None:
            reader = self._readers[deployment] = _DeploymentReader(self._client, deployment)
        follower = Follower(reader, key, after)
        reader.add(follower)
        return follower
