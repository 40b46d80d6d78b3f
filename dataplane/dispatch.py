"""The data plane in Redis: fair job queues, leases, reply streams, cancellation and usage.

This module and quotas.py (tenant limits) are the only ones that know Redis key names. Every
key of a deployment carries the deployment name as its hash tag, so one deployment's keys live
in one Redis Cluster slot and the scripts below stay atomic there.

Queues. A deployment has one sorted set per priority class (`interactive`, `batch`). Its
members are `<tenant>:<seq>:<request id>` with equal scores, so each tenant's jobs form a
first-in-first-out lexicographic range and every script names all the keys it touches. A
second sorted set per class holds the tenants that have jobs waiting, scored by their virtual
token counter: start-time fair queuing over tokens served, in the spirit of VTC. Taking a job
picks the waiting tenant with the lowest counter and charges it prompt + max_tokens divided by
its weight; the finish settles that charge to the tokens the job really used. A tenant that
starts waiting again is lifted to the class's virtual clock, so idling earns no credit.
Interactive jobs always go before batch jobs.

Leases. A claimed job moves to a sorted set scored by its lease's end; its worker renews the
lease with each heartbeat and the reaper takes back jobs whose lease lapsed.

Prefix affinity. vLLM reuses the KV cache of a prompt prefix it has seen (prefix caching), but
only on the replica that computed it, so requests sharing a long prefix (a system prompt, a
document) should meet on one replica. Enqueue keys a job by a hash of its first PREFIX_TOKENS
prompt tokens (and its LoRA adapter); shorter prompts and embeddings get no key. A fixed window
rather than the whole prompt, so requests that share a system prompt and differ after it get
the same key. The fair order is untouched: the claim script still picks the next job as above,
charges its tenant, and leases it. Only who runs it may change: when a worker claiming with
affinity takes a keyed job, the job's owner is the live worker with the highest rendezvous hash
of (key, worker); if the owner is another worker with a free shared slot whose load (jobs it
holds) stays within PREFIX_LOAD_BOUND times the mean load (consistent hashing with bounded
loads), the job is handed to it: leased and held in its name, noted in the handoffs hash and
the owner told on its handoff channel; the claimer goes on to the next job in fair order.
Otherwise (owner dead, draining, full or over the bound) the claimer keeps the job: it is a
worker with a free slot asking for work. A worker takes the jobs handed to it, in the order they
were handed, before claiming; one that stops claiming puts them back in the queue, and the
reaper requeues any whose lease lapses before its new holder took them. Cancel, whereabouts and
finishing do not care who holds a job.
"""

from __future__ import annotations

import enum
import hashlib
import time
from array import array
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio as aredis
from redis.exceptions import ResponseError

from dataplane import scripts
from dataplane.keys import (
    INGEST_GROUP,
    MARKER_TTL_SECONDS,
    WAKE_CAP,
    cancel_channel,
    cancel_key,
    dead_usage_key,
    deployment_keys,
    deployment_of,
    final_key,
    gauges_key,
    handoff_channel,
    heartbeats_key,
    ledger_field,
    ledger_hour,
    ledger_key,
    reply_key,
    retire_key,
    usage_key,
    whereabouts_key,
)

# Until every importer reads it from dataplane.keys.
from dataplane.keys import KEY_REVOCATIONS_CHANNEL as KEY_REVOCATIONS_CHANNEL
from dataplane.redis_client import script_into
from dataplane.replies import Follower, ReplyReaders
from dataplane.types import (
    Delta,
    Event,
    Failed,
    Job,
    Started,
    Status,
    UsageEvent,
    encode,
    event_decoder,
    job_decoder,
    usage_decoder,
)

ScriptArg = bytes | str | int | float

# Prompt tokens that key a job's prefix for replica affinity: vLLM's KV-cache block on CPU (128
# tokens), eight blocks on GPU. A prompt must be longer to have a key: the cache reuses only full
# blocks and always computes the last prompt token.
PREFIX_TOKENS = 128
# A replica takes a job for its prefix only while it holds at most this many times the mean load.
PREFIX_LOAD_BOUND = 1.25


def prefix_key(job: Job, *, tokens: int = PREFIX_TOKENS) -> str:
    """Return the key of a job's prompt prefix for replica affinity; "" when it has none.

    Embeddings and prompts of `tokens` tokens or fewer have none.
    """
    if job.input_lengths or len(job.prompt_token_ids) <= tokens:
        return ""
    digest = hashlib.blake2b(job.adapter.encode(), digest_size=8)
    digest.update(array("q", job.prompt_token_ids[:tokens]).tobytes())
    return digest.hexdigest()


def retire_request_sync(client: redis.Redis, deployment: str, *, retire: bool) -> None:
    """Ask a deployment's workers to drain and leave (or, with retire=False, to stay)."""
    if retire:
        client.set(retire_key(deployment), str(time.time()))
    else:
        client.delete(retire_key(deployment))


def depth_sync(client: redis.Redis, deployment: str) -> tuple[int, int]:
    """Return (requests, reserved tokens) waiting in a deployment's queues, for control code."""
    found: Any = client.hmget(deployment_keys(deployment).depth, ["n", "tok"])
    return int(found[0] or 0), int(found[1] or 0)


def kv_cache_usage_sync(client: redis.Redis, deployment: str) -> float | None:
    """Return the highest KV-cache use any live worker of a deployment last reported."""
    values: Any = client.hvals(gauges_key(deployment))
    return max((float(v) for v in values), default=None)


def rate_sync(client: redis.Redis, deployment: str) -> float:
    """Return the reserved tokens per second a deployment's workers last measured (summed)."""
    values: Any = client.hvals(deployment_keys(deployment).rate)
    return sum(float(v) for v in values)


def live_workers_sync(client: redis.Redis, deployment: str) -> int:
    """Return how many workers of a deployment are alive, for control-plane code."""
    return int(client.zcount(heartbeats_key(deployment), time.time(), "+inf"))


@dataclass(frozen=True)
class QueueSnapshot:
    """What a deployment's shared state in Redis says now, for metrics and autoscaling."""

    waiting: dict[str, int]  # priority class -> queued jobs
    oldest_age: dict[str, float]  # priority class -> seconds the oldest queued job has waited
    backlog_tokens: int
    running: int  # jobs claimed by workers and not finished
    live_workers: int
    slots_per_worker: float  # shared slots, mean over live workers
    tokens_per_second: float | None  # measured capacity of one worker, mean; None if unknown
    ingest_lag_events: int
    ingest_lag_seconds: float
    retiring: bool = False  # the control plane asked its workers to drain and leave


# Oldest-job ages are read from at most this many queued jobs per class (the queue is bounded
# by max_queued, so this only matters for very deep batch queues).
_SNAPSHOT_SCAN = 5000


def queue_snapshot_sync(client: redis.Redis, deployment: str) -> QueueSnapshot:
    """Read a deployment's queues, workers and usage stream in two round trips."""
    keys = deployment_keys(deployment)
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.depth, "tok")
    for queue in (keys.queue_interactive, keys.queue_batch):
        pipe.zcard(queue)
        pipe.zrange(queue, 0, _SNAPSHOT_SCAN - 1)
    pipe.zcard(keys.leases)
    pipe.zrangebyscore(keys.workers, now, "+inf")
    pipe.hgetall(keys.slots)
    pipe.hgetall(keys.rate)
    pipe.xrange(keys.usage, "-", "+", count=1)
    pipe.xlen(keys.usage)
    pipe.exists(retire_key(deployment))
    tok, n_i, members_i, n_b, members_b, running, live, slots, rates, first, length, retire = (
        pipe.execute()
    )
    oldest: dict[str, str] = {}
    for cls, members in (("interactive", members_i), ("batch", members_b)):
        if members:
            # Members are "<tenant:10>:<seq:16>:<request id>"; the global sequence orders them.
            oldest[cls] = min((m.decode() for m in members), key=lambda m: m[11:27])[28:]
    ages = dict.fromkeys(("interactive", "batch"), 0.0)
    if oldest:
        encoded = client.hmget(keys.jobs, list(oldest.values()))
        for cls, payload in zip(oldest, cast(list[bytes | None], encoded), strict=True):
            if payload is not None:
                ages[cls] = max(now - job_decoder.decode(payload).enqueued_at, 0.0)
    alive = {w.decode() for w in live}
    shared = [float(v.split()[0]) for w, v in _decoded(slots).items() if w in alive]
    rate = [float(v) for w, v in _decoded(rates).items() if w in alive]
    lag_seconds = 0.0
    if first:
        # Stream ids start with their append time in milliseconds.
        lag_seconds = max(now - int(first[0][0].decode().split("-")[0]) / 1000, 0.0)
    return QueueSnapshot(
        waiting={"interactive": int(n_i), "batch": int(n_b)},
        oldest_age=ages,
        backlog_tokens=int(tok or 0),
        running=int(running),
        live_workers=len(alive),
        slots_per_worker=sum(shared) / len(shared) if shared else 0.0,
        tokens_per_second=sum(rate) / len(rate) if rate else None,
        ingest_lag_events=int(length),
        ingest_lag_seconds=lag_seconds,
        retiring=bool(retire),
    )


def _decoded(values: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in values.items()}


class Refusal(enum.Enum):
    """Why a job was not queued."""

    NO_WORKER = "no_worker"
    QUEUE_FULL = "queue_full"
    DEADLINE_UNATTAINABLE = "deadline_unattainable"


@dataclass(frozen=True)
class Refused:
    reason: Refusal
    estimated_wait_ms: int = 0


@dataclass(frozen=True)
class Whereabouts:
    tenant_id: int
    deployment: str
    # What a client resuming the request's stream needs to format it again.
    endpoint: str = ""
    version_digest: str = ""
    created: int = 0


@dataclass(frozen=True)
class Claimed:
    """Jobs a worker took: ones to run and ones whose deadline passed in the queue."""

    run: list[Job]
    expired: list[Job]


@dataclass(frozen=True)
class Depth:
    requests: int
    tokens: int


class Dispatch:
    """Data-plane operations over one async Redis client."""

    def __init__(self, client: aredis.Redis, *, reply_ttl: int = 900) -> None:
        self.redis = client
        self.reply_ttl = reply_ttl
        self._enqueue = client.register_script(scripts.ENQUEUE)
        self._claim = client.register_script(scripts.CLAIM)
        self._finalize = client.register_script(scripts.FINALIZE)
        self._unqueue = client.register_script(scripts.UNQUEUE)
        self._requeue = client.register_script(scripts.REQUEUE)
        self._replies = ReplyReaders(client)

    def _reply_ttl(self, job: Job) -> int:
        # Requests with an Idempotency-Key keep their replies as long as the key lives.
        return job.reply_ttl or self.reply_ttl

    async def finished(self, *, deployment: str, request_id: str) -> bool:
        """Return whether a request has ended."""
        return bool(await self.redis.exists(final_key(deployment, request_id)))

    # --- frontend side -------------------------------------------------------------------

    async def enqueue(
        self,
        job: Job,
        *,
        max_queued: int = 1 << 30,
        max_queued_tokens: int = 1 << 50,
        payload: bytes | None = None,
    ) -> Refused | None:
        """Queue a job for its deployment's workers; None when queued, else why not.

        Nothing is queued when no worker of the deployment is alive, when max_queued jobs
        already wait beyond what the workers' free slots take at once, when max_queued_tokens
        reserved tokens already wait, or when the backlog ahead of the job
        cannot drain before its deadline at the deployment's measured rate. `payload` is the
        job already encoded, when the caller encoded it (a frontend does, before admission).
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            script_into(
                pipe,
                self._enqueue,
                keys=list(deployment_keys(job.deployment)),
                args=[
                    encode(job) if payload is None else payload,
                    time.time(),
                    max_queued,
                    max_queued_tokens,
                    job.request_id,
                    job.tenant_id,
                    job.priority,
                    job.reserved_tokens,
                    job.weight,
                    job.deadline,
                    WAKE_CAP,
                    ledger_hour(job.enqueued_at),
                    prefix_key(job),
                ],
            )
            # Same round trip: where the request lives, so it can be cancelled by id.
            self._whereabouts_into(pipe, job)
            outcome, *_ = await pipe.execute()
        code, wait_ms = int(outcome[0]), int(outcome[1])
        if code < 0:
            # Refused: no request lives anywhere. Under a flood these would otherwise fill
            # Redis with a key per refusal for the reply TTL.
            await self.redis.delete(whereabouts_key(job.request_id))
        if code == -1:
            return Refused(Refusal.NO_WORKER)
        if code == -2:
            return Refused(Refusal.QUEUE_FULL)
        if code == -3:
            return Refused(Refusal.DEADLINE_UNATTAINABLE, estimated_wait_ms=wait_ms)
        return None

    async def whereabouts(self, request_id: str) -> Whereabouts | None:
        """Return where a recent request lives, or None."""
        found: Any = await self.redis.hmget(
            whereabouts_key(request_id), ["tenant", "deployment", "endpoint", "version", "created"]
        )
        if not found or found[0] is None or found[1] is None:
            return None
        return Whereabouts(
            tenant_id=int(found[0]),
            deployment=found[1].decode(),
            endpoint=(found[2] or b"").decode(),
            version_digest=(found[3] or b"").decode(),
            created=int(found[4] or 0),
        )

    async def cancel_by_id(self, *, where: Whereabouts, request_id: str) -> bool:
        """Cancel a request knowing only its id; return False if it had already finished."""
        if await self.finished(deployment=where.deployment, request_id=request_id):
            return False
        payload: Any = await self.redis.hget(deployment_keys(where.deployment).jobs, request_id)
        if payload is not None:
            await self.cancel(job=job_decoder.decode(payload))
        else:
            # Not queued (maybe not yet recorded): flag it; its worker checks at claim.
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(cancel_key(where.deployment, request_id), "1", ex=MARKER_TTL_SECONDS)
                pipe.publish(cancel_channel(where.deployment), request_id)
                await pipe.execute()
        return True

    async def reply_last_id(self, *, deployment: str, request_id: str) -> str | None:
        """Return the id of the newest entry of a request's reply stream, or None."""
        newest: Any = await self.redis.xrevrange(reply_key(deployment, request_id), count=1)
        if not newest:
            return None
        entry_id = newest[0][0]
        return str(entry_id.decode() if isinstance(entry_id, bytes) else entry_id)

    def follow_replies(self, *, deployment: str, request_id: str, after: str) -> Follower:
        """Follow a request's reply stream after an entry id, with this process's other
        followers of the deployment over one connection (see dataplane.replies); the caller
        closes the follower when done."""
        return self._replies.follow(
            deployment=deployment,
            key=reply_key(deployment, request_id),
            after=after,
        )

    async def read_events(
        self, *, deployment: str, request_id: str, after: str, block_ms: int
    ) -> list[tuple[str, Event]]:
        """Return the reply events after an id, waiting up to block_ms for the first (one
        XREAD of its own: for tools and tests; relays follow, see follow_replies)."""
        response: Any = await self.redis.xread(
            {reply_key(deployment, request_id): after}, count=512, block=block_ms
        )
        events: list[tuple[str, Event]] = []
        for _key, entries in response or []:
            for entry_id, fields in entries:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                events.append((eid, event_decoder.decode(fields[b"e"])))
        return events

    async def cancel(self, *, job: Job) -> bool:
        """Cancel a request; return True when it was still queued and is now finished."""
        return await self._end_queued(
            job, code="cancelled", message="request cancelled", status=Status.CANCELLED, flag=True
        )

    async def expire(self, job: Job) -> bool:
        """End a request whose deadline passed; True when it was still queued.

        A running request is not touched: its worker ends it at the same deadline.
        """
        return await self._end_queued(
            job,
            code="deadline_exceeded",
            message="the request's deadline passed while it was queued",
            status=Status.TIMEOUT,
            flag=False,
        )

    async def abandon(self, job: Job) -> bool:
        """End a request whose frontend failed while submitting it; True when it ended here.

        Queued, or never queued (the frontend failed before or during the enqueue), it is
        finished here as an `internal_error` billed nothing, so it still gets its one usage
        record; running, it is flagged cancelled and its worker ends it; ended, it is left be.
        """
        return await self._end_queued(
            job,
            code="internal_error",
            message="the platform failed while queueing this request; nothing was billed",
            status=Status.ERROR,
            flag=True,
            unqueued_too=True,
        )

    async def _end_queued(
        self,
        job: Job,
        *,
        code: str,
        message: str,
        status: Status,
        flag: bool,
        unqueued_too: bool = False,
    ) -> bool:
        # A request ended before it reached the queue used nothing, not even its prompt.
        prompt_tokens = 0 if unqueued_too else len(job.prompt_token_ids)
        terminal = Failed(
            code=code, message=message, prompt_tokens=prompt_tokens, completion_tokens=0
        )
        usage = usage_for(
            job,
            status=status,
            finished_at=time.time(),
            error_code=code,
            prompt_tokens=prompt_tokens,
        )
        keys = [
            *deployment_keys(job.deployment),
            final_key(job.deployment, job.request_id),
            reply_key(job.deployment, job.request_id),
            cancel_key(job.deployment, job.request_id),
        ]
        args: list[ScriptArg] = [
            job.request_id,
            "1" if flag else "0",
            MARKER_TTL_SECONDS,
            encode(terminal),
            encode(usage),
            self._reply_ttl(job),
            cancel_channel(job.deployment),
            ledger_hour(job.enqueued_at),
            usage.prompt_tokens + usage.completion_tokens,
            "1" if unqueued_too else "0",
        ]
        return bool(await self._unqueue(keys=keys, args=args))

    async def depth(self, deployment: str) -> Depth:
        """Return how many requests and reserved tokens wait in a deployment's queues."""
        found: Any = await self.redis.hmget(deployment_keys(deployment).depth, ["n", "tok"])
        return Depth(requests=int(found[0] or 0), tokens=int(found[1] or 0))

    # --- worker side ---------------------------------------------------------------------

    async def ensure_groups(self, deployment: str) -> None:
        """Create the usage stream's consumer group if it does not exist."""
        try:
            await self.redis.xgroup_create(
                usage_key(deployment), INGEST_GROUP, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def claim(
        self,
        *,
        deployment: str,
        count: int,
        lease_seconds: float,
        skip_tenants: frozenset[int] = frozenset(),
        worker: str = "",
        affinity: bool = False,
    ) -> Claimed:
        """Take up to count jobs in fair order, leased for lease_seconds.

        Jobs of `skip_tenants` stay queued: a worker filling its reserved slots takes only
        tenants that have nothing running on it.

        A `worker` takes the jobs handed to it first and holds what it claims in its name; with
        `affinity` it hands jobs whose prefix another live worker owns to that worker, within
        the load bound, and takes the next ones in fair order instead.
        """
        now = time.time()
        skip = "," + ",".join(str(t) for t in sorted(skip_tenants)) + ","
        ok, expired = await self._claim(
            keys=list(deployment_keys(deployment)),
            args=[
                now,
                count,
                now + lease_seconds,
                skip,
                worker,
                "1" if affinity and worker else "0",
                PREFIX_LOAD_BOUND,
                handoff_channel(deployment, ""),
            ],
        )
        return Claimed(
            run=[job_decoder.decode(p) for p in ok],
            expired=[job_decoder.decode(p) for p in expired],
        )

    async def wait_for_work(self, *, deployment: str, timeout: float) -> None:
        """Block until a job is queued for the deployment or timeout seconds pass."""
        await self.redis.blpop([deployment_keys(deployment).wake], timeout=timeout)

    async def cancelled(self, *, deployment: str, request_ids: list[str]) -> set[str]:
        """Return which of these requests have been cancelled."""
        if not request_ids:
            return set()
        flags = await self.redis.mget([cancel_key(deployment, rid) for rid in request_ids])
        return {rid for rid, flag in zip(request_ids, flags, strict=True) if flag is not None}

    async def heartbeat(
        self,
        *,
        deployment: str,
        worker: str,
        ttl: float,
        slots: tuple[int, int] | None = None,
        tokens_per_second: float | None = None,
        kv_cache_usage: float | None = None,
        leased: list[str] | None = None,
    ) -> bool:
        """Mark a worker alive for ttl seconds and forget workers whose heartbeat lapsed.

        `slots` is how many requests the worker runs at once, as (shared by all tenants,
        reserved for tenants with nothing running there); `tokens_per_second` the reserved
        tokens it finishes per second when busy. Admission sums both over live workers: free
        slots take jobs at once, and the rate estimates waits.

        `leased` are the worker's running requests: their leases are extended to the same
        end, in the same round trip.

        Returns whether the control plane asked the deployment's workers to retire.
        """
        now = time.time()
        key = heartbeats_key(deployment)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(retire_key(deployment))
            pipe.zadd(key, {worker: now + ttl})
            pipe.zremrangebyscore(key, "-inf", now)
            if slots is not None:
                pipe.hset(deployment_keys(deployment).slots, worker, f"{slots[0]} {slots[1]}")
                # Listed among the holders: jobs may be handed to it (see claim).
                pipe.hsetnx(deployment_keys(deployment).held, worker, 0)
            if tokens_per_second is not None:
                pipe.hset(deployment_keys(deployment).rate, worker, tokens_per_second)
            if kv_cache_usage is not None:
                pipe.hset(gauges_key(deployment), worker, round(kv_cache_usage, 4))
            if leased:
                pipe.zadd(
                    deployment_keys(deployment).leases, dict.fromkeys(leased, now + ttl), xx=True
                )
            results = await pipe.execute()
        return bool(results[0])

    async def leave(self, *, deployment: str, worker: str) -> None:
        """Remove a stopping worker from the live set."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(heartbeats_key(deployment), worker)
            pipe.hdel(deployment_keys(deployment).rate, worker)
            pipe.hdel(deployment_keys(deployment).slots, worker)
            pipe.hdel(gauges_key(deployment), worker)
            pipe.hdel(deployment_keys(deployment).held, worker)
            await pipe.execute()

    async def handoffs_return(self, *, deployment: str, worker: str) -> int:
        """Put the jobs handed to a worker that stops claiming back in the queue; return how many.

        Call it once the worker's heartbeat says it has no slots, so nothing more is handed to it.
        """
        keys = deployment_keys(deployment)
        handed: Any = await self.redis.hgetall(keys.handoffs)
        mine = [rid.decode() for rid, to in handed.items() if to.decode().split()[1] == worker]
        returned = 0
        for rid in mine:
            args: list[ScriptArg] = [rid, time.time(), WAKE_CAP, worker]
            returned += int(await self._requeue(keys=list(keys), args=args))
        return returned

    async def publish(self, *, job: Job, events: list[Event]) -> None:
        """Append non-terminal events to a request's reply stream."""
        async with self.redis.pipeline(transaction=False) as pipe:
            self.publish_into(pipe, job=job, events=events)
            await pipe.execute()

    def publish_into(self, pipe: aredis.client.Pipeline, *, job: Job, events: list[Event]) -> None:
        """Queue non-terminal events on a pipeline shared by many requests."""
        key = reply_key(job.deployment, job.request_id)
        for event in events:
            pipe.xadd(key, {"e": encode(event)})
            if isinstance(event, Started):
                pipe.expire(key, self._reply_ttl(job))

    async def finalize_into(
        self,
        pipe: aredis.client.Pipeline,
        *,
        job: Job,
        terminal: Event,
        usage: UsageEvent,
        charged: bool = True,
    ) -> None:
        """Queue the exactly-once finish of a request on a pipeline."""
        keys, args = self._finalize_call(job=job, terminal=terminal, usage=usage, charged=charged)
        script_into(pipe, self._finalize, keys=keys, args=args)

    async def finalize(
        self, *, job: Job, terminal: Event, usage: UsageEvent, charged: bool = True
    ) -> bool:
        """Finish a request exactly once; return False if something else finished it first.

        `charged` says whether the job was charged to its tenant's fair-share counter (it was
        unless its deadline passed in the queue).
        """
        keys, args = self._finalize_call(job=job, terminal=terminal, usage=usage, charged=charged)
        return bool(await self._finalize(keys=keys, args=args))

    async def answer_here(
        self, *, job: Job, events: list[Event], terminal: Event, usage: UsageEvent
    ) -> None:
        """Answer a request without a worker (from a cache): reply, finish, ledger, one trip.

        It is admitted in the ledger and recorded where it lives as a queued request would be,
        so reconciliation counts it and it can be looked up (and attached to) by id.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(ledger_key(job.deployment), ledger_field(job.enqueued_at, "admitted"), 1)
            self._whereabouts_into(pipe, job)
            self.publish_into(pipe, job=job, events=events)
            await self.finalize_into(pipe, job=job, terminal=terminal, usage=usage, charged=False)
            await pipe.execute()

    def _whereabouts_into(self, pipe: aredis.client.Pipeline, job: Job) -> None:
        """Record where a request lives, so it can be cancelled and followed by id alone."""
        pipe.hset(
            whereabouts_key(job.request_id),
            mapping={
                "tenant": job.tenant_id,
                "deployment": job.deployment,
                "endpoint": job.endpoint,
                "version": job.model_version,
                "created": int(job.enqueued_at),
            },
        )
        pipe.expire(whereabouts_key(job.request_id), self._reply_ttl(job))

    def _finalize_call(
        self, *, job: Job, terminal: Event, usage: UsageEvent, charged: bool
    ) -> tuple[list[str], list[ScriptArg]]:
        keys = [
            *deployment_keys(job.deployment),
            final_key(job.deployment, job.request_id),
            reply_key(job.deployment, job.request_id),
        ]
        used = usage.prompt_tokens + usage.completion_tokens if charged else -1
        args: list[ScriptArg] = [
            encode(terminal),
            encode(usage),
            MARKER_TTL_SECONDS,
            job.request_id,
            self._reply_ttl(job),
            used,
            ledger_hour(job.enqueued_at),
            usage.prompt_tokens + usage.completion_tokens,
        ]
        return keys, args

    # --- reaper --------------------------------------------------------------------------

    async def reclaim_expired(self, *, deployment: str) -> int:
        """Take back jobs whose lease lapsed: requeue unstarted ones, end started ones.

        A started job cannot be resumed elsewhere without repeating tokens the client has
        seen, so it ends with a `worker_lost` error and bills what was produced.
        """
        keys = deployment_keys(deployment)
        now = time.time()
        lapsed: Any = await self.redis.zrangebyscore(keys.leases, "-inf", now, start=0, num=100)
        reclaimed = 0
        for raw in lapsed:
            rid = raw.decode()
            payload: Any = await self.redis.hget(keys.jobs, rid)
            if payload is None:
                await self.redis.zrem(keys.leases, rid)
                continue
            job = job_decoder.decode(payload)
            history: Any = await self.redis.xrange(reply_key(deployment, rid))
            events = [event_decoder.decode(fields[b"e"]) for _id, fields in history]
            if not events:
                reclaimed += int(
                    await self._requeue(keys=list(keys), args=[rid, time.time(), WAKE_CAP])
                )
                continue
            await self._end_lost(job, events)
            reclaimed += 1
        return reclaimed

    async def _end_lost(self, job: Job, events: list[Event]) -> None:
        produced = sum(e.tokens for e in events if isinstance(e, Delta))
        started_at = next((e.at for e in events if isinstance(e, Started)), None)
        terminal = Failed(
            code="worker_lost",
            message="the worker serving this request stopped; partial output was billed",
            prompt_tokens=len(job.prompt_token_ids),
            completion_tokens=produced,
        )
        usage = usage_for(
            job,
            status=Status.WORKER_LOST,
            finished_at=time.time(),
            started_at=started_at,
            completion_tokens=produced,
            error_code="worker_lost",
        )
        await self.finalize(job=job, terminal=terminal, usage=usage)

    async def expire_queued(self, *, deployment: str) -> int:
        """End queued jobs whose deadline passed (their frontend may be gone)."""
        keys = deployment_keys(deployment)
        overdue: Any = await self.redis.zrangebyscore(
            keys.deadlines, "-inf", time.time(), start=0, num=200
        )
        ended = 0
        for raw in overdue:
            payload: Any = await self.redis.hget(keys.jobs, raw.decode())
            if payload is None:
                await self.redis.zrem(keys.deadlines, raw)
                continue
            ended += int(await self.expire(job_decoder.decode(payload)))
        return ended

    # --- ingester ------------------------------------------------------------------------

    async def read_usage(
        self, *, deployments: list[str], consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, str, UsageEvent]]:
        """Return new usage events as (deployment, entry id, event) for this consumer."""
        if not deployments:
            return []
        streams: Any = {usage_key(d): ">" for d in deployments}
        response: Any = await self.redis.xreadgroup(
            INGEST_GROUP,
            consumer,
            streams,
            count=count,
            block=block_ms,  # type: ignore[arg-type]
        )
        return self._usage_entries(response or [])

    async def reclaim_usage(
        self, *, deployment: str, consumer: str, min_idle_ms: int
    ) -> list[tuple[str, str, UsageEvent]]:
        """Take over usage events another ingester read but never acknowledged."""
        response: Any = await self.redis.xautoclaim(
            usage_key(deployment), INGEST_GROUP, consumer, min_idle_time=min_idle_ms, count=4000
        )
        return self._usage_entries([(usage_key(deployment).encode(), response[1])])

    async def ack_usage(self, *, entries: list[tuple[str, str]]) -> None:
        """Acknowledge and delete ingested usage entries given as (deployment, entry id)."""
        by_stream: dict[str, list[str]] = {}
        for deployment, entry_id in entries:
            by_stream.setdefault(usage_key(deployment), []).append(entry_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, ids in by_stream.items():
                pipe.xack(key, INGEST_GROUP, *ids)
                pipe.xdel(key, *ids)
            await pipe.execute()

    async def dead_letter_usage(self, *, deployment: str, event: UsageEvent, reason: str) -> None:
        """Keep a usage event the database refused, for an operator to inspect and replay."""
        await self.redis.xadd(dead_usage_key(deployment), {"u": encode(event), "why": reason})

    @staticmethod
    def _usage_entries(response: Any) -> list[tuple[str, str, UsageEvent]]:
        out = []
        for key, entries in response:
            name = key.decode() if isinstance(key, bytes) else key
            deployment = deployment_of(name)
            for entry_id, fields in entries:
                if not fields:
                    continue
                eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                out.append((deployment, eid, usage_decoder.decode(fields[b"u"])))
        return out


def usage_for(
    job: Job,
    *,
    status: Status,
    finished_at: float,
    started_at: float | None = None,
    first_token_at: float | None = None,
    completion_tokens: int = 0,
    finish_reason: str = "",
    error_code: str = "",
    cached_tokens: int = 0,
    prompt_tokens: int | None = None,
) -> UsageEvent:
    """Build the usage event of a job; its prompt counts in full unless told otherwise."""
    return UsageEvent(
        request_id=job.request_id,
        tenant_id=job.tenant_id,
        api_key_id=job.api_key_id,
        deployment=job.deployment,
        model_version=job.model_version,
        endpoint=job.endpoint,
        status=status,
        finish_reason=finish_reason,
        error_code=error_code,
        prompt_tokens=len(job.prompt_token_ids) if prompt_tokens is None else prompt_tokens,
        completion_tokens=completion_tokens,
        enqueued_at=job.enqueued_at,
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=finished_at,
        shadow=job.shadow,
        user=job.user,
        priority=job.priority,
        cached_tokens=cached_tokens,
        trace_id=job.trace_id,
    )
