"""The dynamic batcher of encoder workers: many requests' inputs through one forward pass.

Inputs wait until a batch is worth running: it is full (`max_batch_size`), the oldest input
has waited `max_queue_delay`, an input's deadline leaves no more time to wait, or arrivals
have paused for `quiet_seconds` (nobody else is coming soon, so waiting would only add
latency). With the default quiet period of 0 a batch starts whenever the engine is free, and
the inputs that arrive while it computes form the next one: measured on CPU, waiting longer
for fuller batches only added latency (docs/benchmarks.md). A batch is the
oldest input plus the inputs nearest to it in length, so short inputs are not padded to a long
one's length. An input whose deadline cannot be met given the work ahead of it is refused when
it arrives rather than delayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dataplane.background import event_wait, loop_ok

log = logging.getLogger(__name__)

# The input length the SLO arithmetic assumes (tokens): a sentence or two.
REFERENCE_LENGTH = 64
# Computes one batch (token ids per input) and returns one vector per input as float32 bytes.
Compute = Callable[[list[list[int]]], list[bytes]]


class BatchStats(Protocol):
    """Where a batcher reports each forward pass (the worker's metrics)."""

    def batch(
        self, *, inputs: int, max_batch_size: int, seconds: float, waits: list[float]
    ) -> None: ...


class DeadlineUnattainable(Exception):
    """The work queued ahead of a request takes longer than its deadline allows."""

    def __init__(self, wait_seconds: float) -> None:
        super().__init__(f"about {wait_seconds:.2f} s of work is queued ahead of this request")
        self.wait_seconds = wait_seconds


class CostModel:
    """Seconds a batch takes: a fixed overhead plus a cost per padded token.

    Seeded by measuring two shapes at warm-up, then kept current from every batch run.
    """

    def __init__(self, *, overhead: float, per_token: float) -> None:
        self.overhead = overhead
        self.per_token = per_token

    def seconds(self, *, inputs: int, longest: int) -> float:
        return self.overhead + self.per_token * inputs * longest

    def observe(self, *, inputs: int, longest: int, seconds: float) -> None:
        padded = inputs * longest
        if padded <= 0:
            return
        sample = max(seconds - self.overhead, 0.0) / padded
        self.per_token = 0.8 * self.per_token + 0.2 * sample

    @classmethod
    def measure(cls, compute: Compute, *, max_batch_size: int, length: int) -> CostModel:
        """Time one single-input and one full batch of `length`-token inputs."""
        ids = [101, *([1037] * max(length - 2, 0)), 102]

        def timed(n: int) -> float:
            compute([ids] * n)  # first use of a shape allocates; time the second
            started = time.perf_counter()
            compute([ids] * n)
            return time.perf_counter() - started

        one, full = timed(1), timed(max_batch_size)
        per_token = max(full - one, 1e-6) / max((max_batch_size - 1) * len(ids), 1)
        return cls(overhead=max(one - per_token * len(ids), 0.0), per_token=per_token)


@dataclass(eq=False)
class _Input:
    ids: list[int]
    position: int  # in its request
    deadline: float  # time.monotonic() seconds
    arrived: float
    owner: _Request


@dataclass(eq=False)
class _Request:
    future: asyncio.Future[list[bytes]]
    vectors: list[bytes | None]
    left: int
    inputs: list[_Input] = field(default_factory=list)


class DynamicBatcher:
    """Group inputs from concurrent requests into batches for one compute function."""

    def __init__(
        self,
        compute: Compute,
        *,
        max_batch_size: int,
        max_queue_delay: float,
        cost: CostModel,
        quiet_seconds: float = 0.0,
        stats: BatchStats | None = None,
    ) -> None:
        self.compute = compute
        self.stats = stats
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay
        self.cost = cost
        # Arrivals paused this long: run what is there rather than wait for company. 0 runs
        # whenever the engine is free (inputs then gather while a batch computes).
        self.quiet_seconds = quiet_seconds
        self._pending: list[_Input] = []
        self._arrived = asyncio.Event()
        self._last_arrival = 0.0
        self._busy_until = 0.0  # when the batch being computed should end (estimate)
        self._computing: list[_Input] = []
        self.batches = 0
        self.batched_inputs = 0

    @classmethod
    def for_slo(
        cls,
        compute: Compute,
        *,
        max_batch_size: int,
        slo_seconds: float,
        cost: CostModel,
        quiet_seconds: float = 0.0,
        stats: BatchStats | None = None,
    ) -> DynamicBatcher:
        """A batcher whose queue delay is what the latency SLO leaves after a full batch runs."""
        full = cost.seconds(inputs=max_batch_size, longest=REFERENCE_LENGTH)
        return cls(
            compute,
            max_batch_size=max_batch_size,
            max_queue_delay=max(slo_seconds - full, 0.0),
            cost=cost,
            quiet_seconds=quiet_seconds,
            stats=stats,
        )

    def estimated_wait(self, extra: Sequence[list[int]] = ()) -> float:
        """Seconds until inputs added now would be computed: the batch running and those ahead."""
        now = time.monotonic()
        lengths = sorted([len(i.ids) for i in self._pending] + [len(ids) for ids in extra])
        wait = max(self._busy_until - now, 0.0)
        for start in range(0, len(lengths), self.max_batch_size):
            chunk = lengths[start : start + self.max_batch_size]
            wait += self.cost.seconds(inputs=len(chunk), longest=chunk[-1])
        return wait

    async def embed(self, inputs: list[list[int]], *, deadline: float) -> list[bytes]:
        """Return one vector per input; raise DeadlineUnattainable if it cannot be in time.

        `deadline` is in time.monotonic() seconds. Cancelling the caller withdraws its inputs
        that have not started computing.
        """
        now = time.monotonic()
        wait = self.estimated_wait(inputs)
        if now + wait > deadline:
            raise DeadlineUnattainable(wait)
        loop = asyncio.get_running_loop()
        request = _Request(future=loop.create_future(), vectors=[None] * len(inputs), left=0)
        for position, ids in enumerate(inputs):
            item = _Input(ids=ids, position=position, deadline=deadline, arrived=now, owner=request)
            request.inputs.append(item)
        request.left = len(request.inputs)
        self._pending.extend(request.inputs)
        self._last_arrival = now
        self._arrived.set()
        try:
            return await request.future
        finally:
            if not request.future.done():
                withdrawn = set(map(id, request.inputs))
                self._pending = [i for i in self._pending if id(i) not in withdrawn]

    async def run(self) -> None:
        """Form and compute batches until cancelled."""
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            wait = self._wait_for_more()
            if wait > 0:
                self._arrived.clear()
                await event_wait(self._arrived, wait)
                continue
            batch = self._take()
            if batch:
                self._computing = batch
                await self._compute(batch)
                self._computing = []
                loop_ok("batcher")

    def fail_waiting(self, exc: BaseException) -> None:
        """End every request waiting on this batcher with an error (its loop failed)."""
        error = RuntimeError(f"the dynamic batcher failed: {type(exc).__name__}")
        for item in [*self._computing, *self._pending]:
            self._fail(item.owner, error)
        self._computing = []

    def _wait_for_more(self) -> float:
        """Seconds worth waiting for a fuller batch now; 0 to run at once."""
        if len(self._pending) >= self.max_batch_size:
            return 0.0
        now = time.monotonic()
        oldest = min(i.arrived for i in self._pending)
        longest = max(len(i.ids) for i in self._pending)
        compute = self.cost.seconds(inputs=len(self._pending), longest=longest)
        latest_start = min(i.deadline for i in self._pending) - compute
        quiet = self._last_arrival + self.quiet_seconds
        return max(min(oldest + self.max_queue_delay, latest_start, quiet) - now, 0.0)

    def _take(self) -> list[_Input]:
        """Remove and return the next batch: the oldest input and its nearest in length."""
        now = time.monotonic()
        expired = [i for i in self._pending if i.deadline <= now]
        for item in expired:
            self._fail(item.owner, TimeoutError("the request's deadline passed while it waited"))
        pending = [i for i in self._pending if i.deadline > now and not i.owner.future.done()]
        if len(pending) <= self.max_batch_size:
            self._pending = []
            return pending
        by_length = sorted(pending, key=lambda i: len(i.ids))
        oldest = min(pending, key=lambda i: i.arrived)
        at = by_length.index(oldest)
        size = self.max_batch_size
        # The window of `size` inputs holding the oldest with the least spread of lengths.
        starts = range(max(at - size + 1, 0), min(at, len(by_length) - size) + 1)
        start = min(starts, key=lambda s: len(by_length[s + size - 1].ids) - len(by_length[s].ids))
        batch = by_length[start : start + size]
        chosen = set(map(id, batch))
        self._pending = [i for i in pending if id(i) not in chosen]
        return batch

    async def _compute(self, batch: list[_Input]) -> None:
        longest = max(len(i.ids) for i in batch)
        estimate = self.cost.seconds(inputs=len(batch), longest=longest)
        began = time.monotonic()
        self._busy_until = began + estimate
        started = time.perf_counter()
        try:
            vectors = await asyncio.to_thread(self.compute, [i.ids for i in batch])
        except Exception as exc:
            log.exception("a batch of %d inputs failed", len(batch))
            for item in batch:
                self._fail(item.owner, exc)
            return
        finally:
            self._busy_until = 0.0
        seconds = time.perf_counter() - started
        self.cost.observe(inputs=len(batch), longest=longest, seconds=seconds)
        if self.stats is not None:
            # One wait per request: its earliest input's time in the queue.
            waits: dict[int, float] = {}
            for item in batch:
                waits[id(item.owner)] = max(waits.get(id(item.owner), 0.0), began - item.arrived)
            self.stats.batch(
                inputs=len(batch),
                max_batch_size=self.max_batch_size,
                seconds=seconds,
                waits=list(waits.values()),
            )
        self.batches += 1
        self.batched_inputs += len(batch)
        for item, vector in zip(batch, vectors, strict=True):
            request = item.owner
            if request.future.done():
                continue
            request.vectors[item.position] = vector
            request.left -= 1
            if request.left == 0:
                request.future.set_result([v for v in request.vectors if v is not None])

    def _fail(self, request: _Request, exc: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(exc)
        withdrawn = set(map(id, request.inputs))
        self._pending = [i for i in self._pending if id(i) not in withdrawn]
