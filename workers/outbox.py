"""A worker's outbox: the events and usage of its requests, waiting to be written in order."""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field

from dataplane.types import Delta, Event, Job, UsageEvent


@dataclass
class Outbox:
    """Events waiting to be written, in order per request.

    A delta joins its choice's pending delta when there is one, so a request whose tokens
    arrive faster than they are flushed costs one Redis entry per flush and choice, not one
    per token. A choice's deltas stay in order; several choices' may interleave differently
    (each is its own sequence), and none passes another event of its request (a start, an
    end).
    Events a client waits on (start, first token, the end) make their request urgent: its
    events are written at once, ahead of the other requests' deltas, which wait for the
    stream interval as before.
    """

    items: list[tuple[Job, Event, UsageEvent | None, bool]] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    urgent: asyncio.Event = field(default_factory=asyncio.Event)
    # Where each choice's pending delta waits: request id -> choice index -> position.
    _pending: dict[str, dict[int, int]] = field(default_factory=dict)
    _urgent: set[str] = field(default_factory=set)

    def put(
        self,
        job: Job,
        event: Event,
        usage: UsageEvent | None = None,
        *,
        urgent: bool = False,
        charged: bool = True,
    ) -> None:
        rid = job.request_id
        at = self._pending.get(rid, {}).get(event.index) if isinstance(event, Delta) else None
        pending = self.items[at][1] if at is not None else None
        if isinstance(event, Delta) and isinstance(pending, Delta) and pending.joins(event):
            assert at is not None
            self.items[at] = (job, pending.then(event), None, charged)
        else:
            self.items.append((job, event, usage, charged))
            self._note(len(self.items) - 1)
        self.ready.set()
        if urgent:
            self._urgent.add(rid)
            self.urgent.set()

    def take(
        self, *, urgent_only: bool = False, share: tuple[int, int] | None = None
    ) -> list[tuple[Job, Event, UsageEvent | None, bool]]:
        """Take every waiting event, or only those of urgent requests (the rest stay).

        With `share` (index, shares), urgent requests' events and those of the requests in
        that share of the streams (by request id) are taken.
        """
        if urgent_only or share is not None:
            kept: list[tuple[Job, Event, UsageEvent | None, bool]] = []
            items: list[tuple[Job, Event, UsageEvent | None, bool]] = []
            for item in self.items:
                rid = item[0].request_id
                due = rid in self._urgent or (
                    share is not None and share_of(rid, share[1]) == share[0]
                )
                (items if due else kept).append(item)
            self.items = kept
        else:
            items, self.items = self.items, []
        self._reindex()
        self._urgent.clear()
        self.urgent.clear()
        if not self.items:
            self.ready.clear()
        return items

    def restore(self, items: list[tuple[Job, Event, UsageEvent | None, bool]]) -> None:
        """Put back what a failed write took, ahead of what arrived since, in order."""
        self.items = [*items, *self.items]
        self._reindex()
        if self.items:
            self._urgent.update(job.request_id for job, *_ in self.items)
            self.ready.set()
            self.urgent.set()

    def _note(self, at: int) -> None:
        """Make the event at `at` its choice's pending delta; any other event of a request
        closes its choices' pending deltas (nothing joins across it)."""
        job, event, *_ = self.items[at]
        rid = job.request_id
        if isinstance(event, Delta):
            self._pending.setdefault(rid, {})[event.index] = at
        else:
            self._pending.pop(rid, None)

    def _reindex(self) -> None:
        self._pending = {}
        for at in range(len(self.items)):
            self._note(at)


# Streams' deltas are written in shares, one share every 1/shares of the stream interval: each
# stream still gets an event per interval, and a frontend relays a few streams at a time
# instead of every stream at once (under a flood, a burst that held its event loop for
# 10-25 ms, which a newcomer's request waited behind). A share per 8 running streams, at most
# this many: with few streams the bursts are short and the extra writes not worth it.
FLUSH_SHARES = 4
STREAMS_PER_SHARE = 8


def share_of(request_id: str, shares: int) -> int:
    return zlib.crc32(request_id.encode()) % shares
