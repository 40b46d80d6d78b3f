"""The worker loop: claim → generate → publish → finish, for one deployment on one engine.

This base claims, renews, publishes and drains; workers.generative and workers.encoder_worker
run each job on their kind of engine, and workers.failures maps how a run ends early.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
import redis.asyncio as aredis

from dataplane.background import event_wait, loop_failed, loop_ok, supervise
from dataplane.finish import Finisher
from dataplane.keys import cancel_channel, handoff_channel
from dataplane.leases import ClaimAsk, Claimed, Leases
from dataplane.redis_client import UNREACHABLE, Outage, ShardedSubscriber, pipeline_execute
from dataplane.snapshots import depth
from dataplane.tracing import bind
from dataplane.types import (
    Event,
    Job,
    Resumed,
    Status,
    UsageEvent,
    usage_for,
)
from dataplane.usage import UsageStream
from workers.engine import Monitored, Restartable
from workers.failures import (
    Failure,
    failure_of,
    failure_stopped,
    failure_unended,
    failure_unstarted,
)
from workers.fairness import TenantCaps
from workers.metrics import WorkerMetrics
from workers.outbox import FLUSH_SHARES, STREAMS_PER_SHARE, Outbox

log = logging.getLogger(__name__)

# The stream interval of a worker whose ROUNDHOUSE_STREAM_INTERVAL_MS is unset. A CPU engine
# shares its cores with the relay, so once its batch is large gathering a stream's tokens buys
# it throughput; a GPU host has cores to spare, and there relaying every engine step kept
# throughput at vLLM's server's and its inter-token gaps as short
# (docs/design/streaming-granularity.md).
CPU_STREAM_INTERVAL_MS = 20.0
# Up to this many running streams (ROUNDHOUSE_STREAM_FLOW_STREAMS) a worker writes every engine
# step's tokens as soon as it has them, whatever its interval: a stream's tokens flow as vLLM's
# server sends them. Beyond it the interval applies. Either way a relay that falls behind
# gathers on its own: tokens join while a write is in flight, and a frontend merges the entries
# it reads at once into one chunk.
FLOW_STREAMS = 8


def stream_interval_ms(configured: float | None, *, on_accelerator: bool) -> float:
    """The worker's stream interval: the configured one, or its engine's device's default."""
    if configured is not None:
        return configured
    return 0.0 if on_accelerator else CPU_STREAM_INTERVAL_MS


async def _first_of(*waits: Awaitable[object], timeout: float) -> None:
    """Return when the first of these finishes or timeout passes; cancel the others (all of
    them when this is cancelled)."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class _RateMeter:
    """Reserved tokens (prompt + max_tokens) this worker finishes per second while it is full.

    Only windows in which every slot was taken count, so the figure is the worker's capacity
    rather than its current load; admission divides the backlog by it to estimate waits.
    """

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self.per_second: float | None = None
        self._tokens = 0
        self._since = time.monotonic()
        self._busy_throughout = True

    def add(self, tokens: int) -> None:
        self._tokens += tokens

    def tick(self, *, busy: bool) -> None:
        self._busy_throughout &= busy
        elapsed = time.monotonic() - self._since
        if elapsed < self.window:
            return
        if self._busy_throughout and self._tokens:
            sample = self._tokens / elapsed
            self.per_second = (
                sample if self.per_second is None else 0.7 * self.per_second + 0.3 * sample
            )
        self._tokens, self._since, self._busy_throughout = 0, time.monotonic(), True


class _IdleClock:
    """Seconds the engine has had nothing running, told to `count` as they pass."""

    def __init__(self, count: Callable[[float], None]) -> None:
        self._count = count
        self._since: float | None = time.monotonic()  # a new worker runs nothing yet

    def running(self, requests: int) -> None:
        """Note how many requests run now; count the idle time up to here."""
        now = time.monotonic()
        if self._since is not None:
            self._count(now - self._since)
        self._since = now if requests == 0 else None


class Worker(abc.ABC):
    """Serve one deployment's queue with one engine until told to drain.

    This base claims jobs fairly, renews their leases, publishes their events and usage and
    drains; a subclass runs each job on its kind of engine (`_serve`).
    """

    def __init__(
        self,
        *,
        deployment: str,
        engine: Monitored,
        client: aredis.Redis,
        reply_ttl: int = 900,
        worker_id: str,
        capacity: int,
        lease_seconds: float,
        reserved: int = 0,
        drain_seconds: float = 30.0,
        stream_interval: float = 0.0,
        flow_streams: int = FLOW_STREAMS,
        retire_quiet_seconds: float = 5.0,
        metrics: WorkerMetrics | None = None,
        prefix_routing: bool = False,
        batch_every: int = 0,
        caps: TenantCaps | None = None,
    ) -> None:
        self.deployment = deployment
        self.metrics = metrics
        self.engine = engine
        self.redis = client
        self.leases = Leases(client)
        self.finisher = Finisher(client, reply_ttl=reply_ttl)
        self.worker_id = worker_id
        # The engine's slots: `capacity` shared by everyone, `reserved` only for tenants with
        # nothing running on this worker.
        self.capacity = capacity
        self.reserved = reserved
        self.lease_seconds = lease_seconds
        self.drain_seconds = drain_seconds
        self.stream_interval = stream_interval
        self.flow_streams = flow_streams
        # Hand jobs whose prompt prefix another worker owns to that worker (dataplane.leases)
        self.prefix_routing = prefix_routing
        # Every batch_every-th job claimed while both classes wait is batch work (0: never).
        self.batch_every = batch_every
        # What one tenant may hold here; its further jobs wait in the queue meanwhile.
        self.caps = caps or TenantCaps()
        self.active: dict[str, tuple[Job, asyncio.Task[None]]] = {}
        # Requests whose run the drain stopped when its time ran out (not a client's cancel),
        # and those of them to hand on to another worker.
        self._stopped: set[str] = set()
        self._handed_on: list[Job] = []
        self._flushing = asyncio.Lock()
        self._rate = _RateMeter()
        self._outbox = Outbox()
        self._slot_free = asyncio.Event()
        self._handed = asyncio.Event()  # another worker handed this one a job
        self._draining = asyncio.Event()
        self._closing = asyncio.Event()
        # Retiring (asked by the control plane, e.g. a rolled-back canary): keep serving the
        # queue until it has been empty this long, then drain and leave.
        self._retiring = False
        self.retire_quiet_seconds = retire_quiet_seconds
        self._last_work = time.monotonic()
        self._recent_cancels: dict[str, float] = {}
        self.served = 0
        self._idle = _IdleClock(metrics.idle if metrics is not None else lambda _: None)
        # Set while a dead engine starts again: the worker claims nothing meanwhile.
        self._restarting = False
        # The last claim found nothing, or an idle worker's left nothing queued: the next one
        # waits for work first, in its round trip (a job queued meanwhile wakes it at once).
        self._idle_claims = False
        # How long an idle worker's wait for work lasts before it claims again regardless.
        self.wait_seconds = 0.5

    def drain(self) -> None:
        """Stop claiming new jobs; in-flight ones finish (see run)."""
        self._draining.set()

    def retire(self) -> None:
        """Serve what is queued, then drain: nothing accepted for this deployment is dropped."""
        if not self._retiring:
            log.info("asked to retire: serving the queue, then draining")
        self._retiring = True

    async def run(
        self,
        on_ready: Callable[[], Awaitable[None]] | None = None,
        on_draining: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Serve until drained, then finish or end in-flight jobs and leave.

        `on_ready` runs once the worker is in the live set, i.e. once frontends route to it;
        `on_draining` once it stops claiming.
        """
        await UsageStream(self.redis).ensure_groups(self.deployment)
        # Each loop starts again if it fails (dataplane.background): a worker whose heartbeat
        # or flusher died would keep claiming jobs whose leases lapse or whose events never go.
        helpers = [
            asyncio.create_task(supervise(name, loop), name=name)
            for name, loop in (
                ("heartbeat", self._heartbeat_loop),
                ("cancels", self._cancel_listener),
                ("flush", self._flush_loop),
            )
        ]
        try:
            await self.leases.heartbeat(
                deployment=self.deployment,
                worker=self.worker_id,
                ttl=self.lease_seconds,
                slots=self._slots(),
            )
            if on_ready is not None:
                await on_ready()
            await supervise("claim", self._claim_loop)
            await self._handoffs_return()
            if on_draining is not None:
                await on_draining()
            await self._finish_in_flight()
        finally:
            try:
                await self.leases.leave(deployment=self.deployment, worker=self.worker_id)
            finally:
                await self._helpers_stop(helpers)

    async def _helpers_stop(self, helpers: list[asyncio.Task[None]]) -> None:
        """Stop the worker's loops, whatever state they are in, then write what is left."""
        # The flusher may be mid-write with the last requests' ends: let it finish its final
        # round rather than cancel it, or those requests would never end.
        self._closing.set()
        self._outbox.ready.set()
        await asyncio.wait([helpers[-1]], timeout=10)
        # Then every loop is cancelled, even one that keeps failing (a flusher whose writes
        # Redis refuses): none may outlive its worker. A cancellation that lands as a Redis
        # read times out can be swallowed (asyncio on 3.11), so the loops also check the
        # closing flag rather than trusting cancel.
        for task in helpers:
            task.cancel()
        await asyncio.wait(helpers, timeout=5)
        await self._flush_once()

    async def _handoffs_return(self) -> None:
        """Put back in the queue the jobs handed to this worker that it will not take."""
        try:
            # No slots first, so nothing more is handed to it.
            await self.leases.heartbeat(
                deployment=self.deployment,
                worker=self.worker_id,
                ttl=self.lease_seconds,
                slots=self._slots(),
            )
            returned = await self.leases.handoffs_return(
                deployment=self.deployment, worker=self.worker_id
            )
        except Exception:
            # Their leases lapse and the reaper requeues them.
            log.exception("could not return the jobs handed to this worker")
            return
        if returned:
            log.info("returned %d jobs handed to this worker to the queue", returned)

    def _slots(self) -> tuple[int, int]:
        """The slots this worker fills (shared, reserved); none once it drains or while its
        engine restarts."""
        if self._draining.is_set() or self._restarting:
            return (0, 0)
        return (self.capacity, self.reserved)

    async def _claim_loop(self) -> None:
        outage = Outage("claiming jobs", log)
        while not self._draining.is_set():
            try:
                await self._claim_round()
                outage.ok()
                loop_ok("claim")
            except UNREACHABLE as exc:
                # Running jobs go on; what a claim took in a reply that never came back is
                # requeued by the reaper when its lease lapses.
                await _first_of(
                    asyncio.sleep(outage.failed(exc)), self._draining.wait(), timeout=1.0
                )

    async def _claim_round(self) -> None:
        """Claim as many jobs as the free slots take and start them, or wait for work."""
        # Cleared before counting, so a slot freed (or a job handed here) from here on wakes
        # the waits below.
        self._slot_free.clear()
        self._handed.clear()
        free = self.capacity - len(self.active)
        skip: frozenset[int] = frozenset()
        if self._restarting:
            free = 0
        elif free <= 0:
            # Every shared slot is taken: the reserved ones go only to tenants that have
            # nothing running here, so a newcomer starts at the next engine step rather
            # than after the next long request ends.
            free = self.capacity + self.reserved - len(self.active)
            skip = frozenset(job.tenant_id for job, _ in self.active.values())
        if free <= 0:
            await _first_of(self._slot_free.wait(), self._draining.wait(), timeout=1.0)
            return
        room = {
            tenant: left
            for tenant, (seqs, blocks) in self.tenant_loads().items()
            if (left := self.caps.room(seqs=seqs, kv_blocks=blocks)) is not None
        }
        held_back = any(left == 0 for left in room.values())
        ask = ClaimAsk(
            count=free,
            lease_seconds=self.lease_seconds,
            skip_tenants=skip,
            worker=self.worker_id,
            affinity=self.prefix_routing,
            batch_every=self.batch_every,
            room=room,
            room_default=self.caps.room(seqs=0, kv_blocks=0),
        )
        # The last claim found nothing, or an idle worker's took what was queued: wait for
        # work and claim, in one round trip. Claiming again at once would find only what was
        # queued since, and that left a wake token: the pop returns at once for it.
        woken = False
        if self._idle_claims and self.leases.pipelined():
            claimed, woken = await self._waited_claim(ask, wake_on_slot=bool(skip) or held_back)
        else:
            claimed = await self.leases.claim_asked(deployment=self.deployment, ask=ask)
        # Woken by this worker (its claim's arguments may be out of date: a slot freed for the
        # tenants it passed over), the next round claims at once. So it does after a claim
        # that took jobs and left others queued (passed over, or past this claim's count), or
        # took them beside running ones: under load, what is queued during the round trip is
        # then taken in one claim. A worker with nothing else running when the claim answers
        # that took the last queued job waits instead (what ran as the round began may have
        # ended during its wait: it is idle all the same).
        idle = not self.active
        self._idle_claims = not woken and (
            (not claimed.run and not claimed.expired) or (claimed.drained and idle)
        )
        for job in claimed.expired:
            self._finish_unstarted(
                job, failure_unstarted("deadline_exceeded", Status.TIMEOUT), charged=False
            )
        if claimed.run or claimed.expired:
            self._last_work = time.monotonic()
        elif self._retiring and await self._retire_due():
            self.drain()
            return
        if not claimed.run:
            if not claimed.expired and not self.leases.pipelined():
                # A queued job wakes us; with only reserved slots open, or a tenant held back
                # at its cap, so does a freed slot (the tenants passed over this time may then
                # be served). Where the wait and the claim go in one round trip, the next
                # round waits (`_waited_claim`).
                await _first_of(
                    self.leases.wait_for_work(
                        deployment=self.deployment, timeout=self.wait_seconds
                    ),
                    self._draining.wait(),
                    self._handed.wait(),
                    *([self._slot_free.wait()] if skip or held_back else []),
                    timeout=self.wait_seconds + 0.5,
                )
            return
        for job in claimed.run:
            task = asyncio.create_task(self._serve_traced(job), name=job.request_id)
            task.add_done_callback(functools.partial(self._served, job))
            self.active[job.request_id] = (job, task)
        self._idle.running(len(self.active))
        # A request cancelled while queued (its flag, read by the claim), or as the claim took
        # it (its message, come before its job was here to stop), is stopped as it starts.
        for rid in claimed.cancelled | (self._recent_cancels.keys() & self.active.keys()):
            running = self.active.get(rid)
            if running is not None:
                running[1].cancel()
        # The jobs reach the engine before this worker's next claim round takes the loop.
        await asyncio.sleep(0)

    async def _waited_claim(self, ask: ClaimAsk, *, wake_on_slot: bool) -> tuple[Claimed, bool]:
        """Wait for a queued job and claim, in one round trip (`Leases.wait_then_claim`).

        The claim is awaited in this task, so that its answer wakes this task alone and the
        jobs it took start a turn of the loop later. What would end the wait early (a drain, a
        job handed here, with `wake_on_slot` a freed slot) has a task of its own wake the
        pending pop instead (`_wake_first`), so that its claim runs and its answer is read: a
        claim cut off half-way would hold the jobs it leased, unrun, until their leases lapsed.
        Returns what it claimed, and whether this worker woke it.
        """
        waking = asyncio.Event()  # set as the waker wakes the pop
        waker = asyncio.create_task(self._wake_first(waking, wake_on_slot=wake_on_slot))
        try:
            claimed = await self.leases.wait_then_claim(
                deployment=self.deployment, timeout=self.wait_seconds, ask=ask
            )
        finally:
            if waking.is_set():
                # Its wake is under way: let it end rather than cut its round trip short.
                try:
                    await waker
                except Exception:
                    log.warning("could not wake this worker's pending claim", exc_info=True)
            else:
                waker.cancel()
        return claimed, waking.is_set()

    async def _wake_first(self, waking: asyncio.Event, *, wake_on_slot: bool) -> None:
        """Wake this worker's pending claim (`_waited_claim`) when a drain, a job handed here
        or, with `wake_on_slot`, a freed slot comes before a job, or when the pop outlives its
        timeout."""
        await _first_of(
            self._draining.wait(),
            self._handed.wait(),
            *([self._slot_free.wait()] if wake_on_slot else []),
            timeout=self.wait_seconds + 0.5,
        )
        waking.set()
        with contextlib.suppress(*UNREACHABLE):
            await self.leases.wake(deployment=self.deployment, worker=self.worker_id)

    def tenant_loads(self) -> dict[int, tuple[int, int]]:
        """What each tenant holds on this worker: its sequences and KV-cache blocks."""
        loads: dict[int, tuple[int, int]] = {}
        for job, _ in list(self.active.values()):
            seqs, blocks = loads.get(job.tenant_id, (0, 0))
            loads[job.tenant_id] = (seqs + job.choices, blocks + self._kv_blocks(job))
        return loads

    def _kv_blocks(self, job: Job) -> int:
        """The KV-cache blocks a running job holds (none, for an engine without a KV cache)."""
        return 0

    async def _retire_due(self) -> bool:
        """Whether a retiring worker has seen its queue empty for the quiet period."""
        if (await depth(self.redis, self.deployment)).requests:
            self._last_work = time.monotonic()
            return False
        return time.monotonic() - self._last_work >= self.retire_quiet_seconds

    async def _serve_traced(self, job: Job) -> None:
        bind(request_id=job.request_id, trace_id=job.trace_id)  # this task's log records
        await self._serve(job)

    @abc.abstractmethod
    async def _serve(self, job: Job) -> None:
        """Run one claimed job to its end; put its events, terminal event and usage."""

    def _failure(self, exc: BaseException, *, job: Job, engine: str) -> Failure:
        """How a run that raised ends: as failure_of says, unless the drain stopped it."""
        if self._handing_on(job, exc):
            return failure_stopped()
        failure = failure_of(exc, job=job, engine=engine)
        if isinstance(self.engine, Restartable) and self.engine.death(exc) is not None:
            # The engine is dead: claim nothing more into it from now on, rather than until
            # the next heartbeat finds it so and starts it again.
            self._restarting = True
        return failure

    def _ended(
        self, job: Job, terminal: Event, usage: UsageEvent, failure: Failure | None = None
    ) -> None:
        """Record a served job's end and free its slot; then let a stopping process stop."""
        self._outbox.put(job, terminal, usage, urgent=True)
        self.active.pop(job.request_id, None)
        self._idle.running(len(self.active))
        self._rate.add(job.reserved_tokens)
        self.served += 1
        self._slot_free.set()
        if self.metrics is not None:
            self.metrics.request_ended(job, usage)
        if failure is not None:
            failure.raise_fatal()

    def _served(self, job: Job, task: asyncio.Task[None]) -> None:
        # _serve ends every request it starts, whatever raises in its run; one cancelled
        # before its first line ran, or one that _serve itself failed to end, still gets its
        # terminal event and usage record here (never a lease renewed for ever).
        if job.request_id not in self.active:
            return
        self.active.pop(job.request_id, None)
        self._idle.running(len(self.active))
        stopped = job.request_id in self._stopped and task.cancelled()
        self._finish_unstarted(job, failure_stopped() if stopped else failure_unended(job, task))
        self._slot_free.set()

    def _finish_unstarted(self, job: Job, failure: Failure, *, charged: bool = True) -> None:
        """End a job this worker did not run (or stopped before handing it on): billed for
        what it produced elsewhere before, if anything."""
        terminal = failure.failed(
            prompt_tokens=len(job.prompt_token_ids), completion_tokens=job.resumed_tokens
        )
        resumed = job.resumed
        usage = usage_for(
            job,
            status=failure.status,
            finished_at=time.time(),
            started_at=resumed.started_at if resumed else None,
            first_token_at=resumed.first_token_at if resumed else None,
            error_code=failure.code,
        )
        self._outbox.put(job, terminal, usage, urgent=True, charged=charged)
        if self.metrics is not None:
            self.metrics.request_ended(job, usage)

    async def _flush_loop(self) -> None:
        last_tick = 0.0
        tick = 0
        outage = Outage("publishing events", log)
        while True:
            await self._outbox.ready.wait()
            # Between token-only flushes wait out the stream interval, so deltas merge; a first
            # token or an end goes out at once, with its request's other events, and the other
            # requests' deltas keep waiting for their share's turn (once per interval).
            shares = min(max(len(self.active) // STREAMS_PER_SHARE, 1), FLUSH_SHARES)
            step = self._interval() / shares
            wait = last_tick + step - time.monotonic()
            if wait > 0 and not self._outbox.urgent.is_set() and not self._closing.is_set():
                await event_wait(self._outbox.urgent, wait)
            urgent_only, share = False, None
            if step > 0 and not self._closing.is_set():
                if time.monotonic() < last_tick + step:
                    urgent_only = True
                else:
                    last_tick, tick = time.monotonic(), tick + 1
                    share = (tick % shares, shares) if shares > 1 else None
            try:
                await self._flush_once(urgent_only=urgent_only, share=share)
                outage.ok()
                loop_ok("flush")
            except UNREACHABLE as exc:
                # Kept and written again when Redis is back: the ends (and usage) of requests
                # that finished during an outage are not lost, and their clients get them.
                await asyncio.sleep(outage.failed(exc))
            except Exception as exc:
                # What failed to be written is kept and written again, as above.
                loop_failed("flush", exc)
                await asyncio.sleep(0.1)
            if self._closing.is_set() and not self._outbox.items:
                return

    def _interval(self) -> float:
        """Return how long deltas may gather: not at all while few streams run, then longer
        as more streams share the machine.

        Relaying costs CPU per event and the engine's step time grows with the batch, so
        with 32 streams an event every 80 ms carries about as many tokens per event as one
        every 20 ms does with 8 (up to four times the configured interval).
        """
        streams = len(self.active)
        if streams <= self.flow_streams:
            return 0.0
        return self.stream_interval * min(max(streams / max(self.flow_streams, 8), 1.0), 4.0)

    async def _flush_once(
        self, *, urgent_only: bool = False, share: tuple[int, int] | None = None
    ) -> None:
        # One flush at a time: a request's events reach its reply stream in the order they
        # were put (the drain's own flush may run beside the flush loop's).
        async with self._flushing:
            await self._flush_taken(urgent_only=urgent_only, share=share)

    async def _flush_taken(self, *, urgent_only: bool, share: tuple[int, int] | None) -> None:
        items = self._outbox.take(urgent_only=urgent_only, share=share)
        if not items:
            return
        commands: list[int] = []  # how many commands each item queued
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for job, event, usage, charged in items:
                    queued = len(pipe)
                    if usage is None:
                        self.finisher.publish_into(pipe, job=job, events=[event])
                    else:
                        await self.finisher.finalize_into(
                            pipe, job=job, terminal=event, usage=usage, charged=charged
                        )
                    commands.append(len(pipe) - queued)
                results = await pipeline_execute(pipe, raise_on_error=False)
        except BaseException:
            # Finishing is exactly-once (a marker per request), so writing an end again after
            # a write that broke half-way cannot bill twice.
            self._outbox.restore(items)
            raise
        # A command Redis refused fails only its own item, which is written again; the rest
        # went out and are not written twice.
        failed: list[tuple[Job, Event, UsageEvent | None, bool]] = []
        first_error: Exception | None = None
        at = 0
        for item, count in zip(items, commands, strict=True):
            errors = [r for r in results[at : at + count] if isinstance(r, Exception)]
            at += count
            if errors:
                failed.append(item)
                first_error = first_error or errors[0]
        if first_error is not None:
            self._outbox.restore(failed)
            raise first_error

    async def _heartbeat_loop(self) -> None:
        interval = max(self.lease_seconds / 4, 0.25)
        outage = Outage("heartbeat", log)
        while not self._closing.is_set():
            pause = interval
            try:
                if self._restarting:
                    # A dead engine, seen by a request's end: out of the live set and started
                    # again (below) before this worker says it serves.
                    await self._engine_check()
                self._rate.tick(busy=len(self.active) >= self.capacity)
                retire = await self.leases.heartbeat(
                    deployment=self.deployment,
                    worker=self.worker_id,
                    ttl=self.lease_seconds,
                    slots=self._slots(),
                    tokens_per_second=self._rate.per_second,
                    kv_cache_usage=self.engine.kv_cache_usage(),
                    leased=list(self.active),  # renewed for as long as the worker is alive
                )
                if retire:
                    self.retire()
                if self.metrics is not None:
                    self.metrics.tenants_held(self.tenant_loads())
                self._idle.running(len(self.active))
                await self._engine_check()
                outage.ok()
                loop_ok("heartbeat")
            except asyncio.CancelledError:
                raise
            except UNREACHABLE as exc:
                # Beat again soon: the first beat after an outage renews the running leases.
                pause = min(interval, outage.failed(exc))
            except Exception as exc:
                loop_failed("heartbeat", exc)
            cutoff = time.monotonic() - 60
            self._recent_cancels = {r: t for r, t in self._recent_cancels.items() if t > cutoff}
            await asyncio.sleep(pause)

    async def _engine_check(self) -> None:
        """Check the engine's health; start a dead one again, counting why it died.

        Its running requests fail with the engine (engine_error), and the worker claims
        nothing until the new engine is up: a dead engine would fail every job it took. One
        that does not start again drains the worker, whose process then leaves.
        """
        try:
            await self.engine.health()
        except Exception as exc:
            engine = self.engine
            if not isinstance(engine, Restartable):
                raise
            reason = engine.death(exc)
            if reason is None:
                raise
            log.error("the engine died (%s); starting it again", reason, exc_info=exc)
            if self.metrics is not None:
                self.metrics.engine_restarted(reason)
            self._restarting = True
            try:
                # Out of the live set while the engine starts (seconds here, minutes for a large
                # model on a GPU): a deployment with no other worker then refuses at once, and
                # an alias with a fallback sends its requests there, instead of queueing them
                # behind the restart. The first heartbeat after it brings the worker back.
                with contextlib.suppress(Exception):
                    await self.leases.leave(deployment=self.deployment, worker=self.worker_id)
                await engine.restart()
                await self._engine_restarted()
            except Exception:
                # Nothing to serve with: leave, and let the orchestrator start the process anew.
                log.exception("the engine did not start again; draining the worker")
                self.drain()
                raise
            finally:
                self._restarting = False
            log.info("the engine is up again")
        else:
            self._restarting = False  # a request's end said dead, but the engine answers

    async def _engine_restarted(self) -> None:
        """Forget what the dead engine held (a subclass's loaded adapters, say)."""
        return None

    async def _cancel_listener(self) -> None:
        while not self._closing.is_set():
            # Sharded: on a cluster the deployment's messages stay on its own node.
            pubsub = ShardedSubscriber(self.redis)
            try:
                handoffs = handoff_channel(self.deployment, self.worker_id)
                await pubsub.subscribe(cancel_channel(self.deployment), handoffs)
                loop_ok("cancels")
                while not self._closing.is_set():
                    message = await pubsub.message(timeout=1.0)
                    if message is None:
                        continue
                    channel, data = message
                    if channel == handoffs:
                        self._handed.set()
                    else:
                        self._on_cancel(data)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closing.is_set():
                    return
                # Claim-time checks of the cancel flags still catch what a gap here misses, and
                # the claim loop's short waits the jobs handed to this worker.
                loop_failed("cancels", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _on_cancel(self, data: bytes | str) -> None:
        rid = data.decode() if isinstance(data, bytes) else str(data)
        self._recent_cancels[rid] = time.monotonic()
        running = self.active.get(rid)
        if running is not None:
            running[1].cancel()

    async def _finish_in_flight(self) -> None:
        """Let in-flight jobs finish for up to the drain time, then stop the rest.

        A stopped run that another worker can carry on from its tokens is handed on: its
        output so far is written, then the job goes back to the head of its tenant's queue
        with what it produced. The others end as `worker_lost`, billing what they produced.
        """
        if not self.active:
            return
        log.info("draining %d in-flight requests", len(self.active))
        tasks = {task: job.request_id for job, task in self.active.values()}
        _, pending = await asyncio.wait(tasks, timeout=self.drain_seconds)
        for task in pending:
            self._stopped.add(tasks[task])
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._hand_on_all()

    def _handing_on(self, job: Job, exc: BaseException) -> bool:
        """Whether a run that raised was stopped by the drain, to be handed on if it can be."""
        return isinstance(exc, asyncio.CancelledError) and job.request_id in self._stopped

    def _hand_on(self, job: Job, resumed: Resumed) -> None:
        """Keep a stopped run's job, with what it produced, for _hand_on_all; free its slot."""
        self._handed_on.append(msgspec.structs.replace(job, resumed=resumed))
        self.active.pop(job.request_id, None)
        self._idle.running(len(self.active))
        self._slot_free.set()

    async def _hand_on_all(self) -> None:
        waiting, self._handed_on = self._handed_on, []
        if not waiting:
            return
        try:
            # Their output so far first: the next worker's goes after it in the reply stream.
            await self._flush_once()
            while waiting:
                job = waiting[0]
                if await self.leases.hand_on(worker=self.worker_id, job=job):
                    log.info("handed %s on after %d tokens", job.request_id, job.resumed_tokens)
                else:
                    self._finish_unstarted(job, failure_stopped())  # it ended, or was reclaimed
                waiting.pop(0)
        except Exception:
            # Those not yet handed on end here (the _helpers_stop flush writes their ends).
            log.exception("could not hand %d stopped requests on; ending them", len(waiting))
            for job in waiting:
                self._finish_unstarted(job, failure_stopped())
