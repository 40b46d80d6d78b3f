"""The data plane in Redis: job queues, leases, reply streams, cancellation and usage events.

This module and quotas.py (tenant limits) are the only ones that know Redis key names. Every
key of a deployment carries the deployment name as its hash tag, so one deployment's keys live
in one Redis Cluster slot and the scripts below stay atomic there.

Jobs are entries of a stream read by the consumer group of the deployment's workers: a claimed
entry sits in the group's pending list, which is the lease. Workers renew it by resetting its
idle time; the reaper reclaims entries idle longer than the lease.
"""

from __future__ import annotations

import contextlib
import enum
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import ResponseError

from inference.background import spawn
from inference.types import (
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

WORKERS_GROUP = "workers"
INGEST_GROUP = "ingest"
KEY_REVOCATIONS_CHANNEL = "sy:keys:revoked"
MARKER_TTL_SECONDS = 24 * 3600


def _tag(deployment: str) -> str:
    return f"sy:{{{deployment}}}"


def jobs_key(deployment: str) -> str:
    return f"{_tag(deployment)}:jobs"


def reply_key(deployment: str, request_id: str) -> str:
    return f"{_tag(deployment)}:reply:{request_id}"


def cancel_key(deployment: str, request_id: str) -> str:
    return f"{_tag(deployment)}:cancel:{request_id}"


def final_key(deployment: str, request_id: str) -> str:
    return f"{_tag(deployment)}:final:{request_id}"


def usage_key(deployment: str) -> str:
    return f"{_tag(deployment)}:usage"


def dead_usage_key(deployment: str) -> str:
    return f"{_tag(deployment)}:usage:dead"


def cancel_channel(deployment: str) -> str:
    return f"{_tag(deployment)}:cancel"


def whereabouts_key(request_id: str) -> str:
    # Tagged by the request: the one key a frontend can find knowing only a request id.
    return f"sy:{{r{request_id}}}:where"


def heartbeats_key(deployment: str) -> str:
    return f"{_tag(deployment)}:workers"


def live_workers_sync(client: redis.Redis, deployment: str) -> int:
    """Return how many workers of a deployment are alive, for control-plane code."""
    return int(client.zcount(heartbeats_key(deployment), time.time(), "+inf"))


# Finish a request exactly once: the first caller writes the terminal event and the usage
# event; later callers (a worker racing the reaper, a cancel racing a finish) do nothing.
_FINALIZE = """
local won = redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[3])
if won then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[1])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
  redis.call('XADD', KEYS[3], '*', 'u', ARGV[2])
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[4], ARGV[5], ARGV[4])
  redis.call('XDEL', KEYS[4], ARGV[4])
end
if won then return 1 end
return 0
"""

# Flag a request cancelled and tell its worker; a job no worker has claimed yet is removed
# and finished here, so it never runs and still gets its one usage record.
_CANCEL = """
redis.call('SET', KEYS[1], '1', 'EX', ARGV[4])
redis.call('PUBLISH', ARGV[8], ARGV[1])
if ARGV[2] == '' then return 0 end
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[2], ARGV[3], ARGV[2], ARGV[2], 1)
if ok and #pending > 0 then return 0 end
if #redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2]) == 0 then return 0 end
redis.call('XDEL', KEYS[2], ARGV[2])
if redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[4]) then
  redis.call('XADD', KEYS[4], '*', 'e', ARGV[5])
  redis.call('EXPIRE', KEYS[4], ARGV[7])
  redis.call('XADD', KEYS[5], '*', 'u', ARGV[6])
  return 1
end
return 0
"""

# Enqueue a job only while its deployment has a live worker: one round trip, and no job is
# left behind in a queue nobody serves.
_ENQUEUE = """
if redis.call('ZCOUNT', KEYS[2], ARGV[2], '+inf') == 0 then return {-1} end
local waiting = redis.call('XLEN', KEYS[1])
local ok, summary = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[4])
if ok then waiting = waiting - tonumber(summary[1]) end
if waiting >= tonumber(ARGV[3]) then return {-2} end
return {0, redis.call('XADD', KEYS[1], '*', 'j', ARGV[1])}
"""

# Put a reclaimed job that never started back at the tail of the queue.
_REQUEUE = """
redis.call('XADD', KEYS[1], '*', 'j', ARGV[1])
redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
return 1
"""


class Refusal(enum.Enum):
    """Why a job was not queued."""

    NO_WORKER = "no_worker"
    QUEUE_FULL = "queue_full"


@dataclass(frozen=True)
class Whereabouts:
    tenant_id: int
    deployment: str
    entry_id: str


@dataclass(frozen=True)
class Claimed:
    entry_id: str
    job: Job


class Dispatch:
    """Data-plane operations over one async Redis client."""

    def __init__(self, client: aredis.Redis, *, reply_ttl: int = 900) -> None:
        self.redis = client
        self.reply_ttl = reply_ttl
        self._finalize = client.register_script(_FINALIZE)
        self._cancel = client.register_script(_CANCEL)
        self._requeue = client.register_script(_REQUEUE)
        self._enqueue = client.register_script(_ENQUEUE)

    # --- frontend side -------------------------------------------------------------------

    async def enqueue(self, job: Job, *, max_queued: int = 1 << 30) -> str | Refusal:
        """Append a job to its deployment's queue and return its entry id.

        Nothing is queued, and a Refusal says why, when no worker of the deployment is alive
        or more than max_queued jobs already wait for one.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            await self._enqueue(
                keys=[jobs_key(job.deployment), heartbeats_key(job.deployment)],
                args=[encode(job), time.time(), max_queued, WORKERS_GROUP],
                client=pipe,
            )
            # Same round trip: where the request lives, so it can be cancelled by id.
            pipe.hset(
                whereabouts_key(job.request_id),
                mapping={"tenant": job.tenant_id, "deployment": job.deployment},
            )
            pipe.expire(whereabouts_key(job.request_id), self.reply_ttl)
            outcome, *_ = await pipe.execute()
        if int(outcome[0]) == -1:
            return Refusal.NO_WORKER
        if int(outcome[0]) == -2:
            return Refusal.QUEUE_FULL
        entry = outcome[1]
        entry_id = entry.decode() if isinstance(entry, bytes) else str(entry)
        # Off the request's path: a cancel by id that finds no entry still flags the request.
        spawn(self._remember_entry(job.request_id, entry_id))
        return entry_id

    async def _remember_entry(self, request_id: str, entry_id: str) -> None:
        # Best effort: without it a cancel by id still works through the cancel flag.
        with contextlib.suppress(Exception):
            await self.redis.hset(whereabouts_key(request_id), "entry", entry_id)

    async def whereabouts(self, request_id: str) -> Whereabouts | None:
        """Return where a recent request lives, or None."""
        found: Any = await self.redis.hmget(
            whereabouts_key(request_id), ["tenant", "deployment", "entry"]
        )
        if not found or found[0] is None or found[1] is None:
            return None
        entry = found[2].decode() if found[2] is not None else ""
        return Whereabouts(tenant_id=int(found[0]), deployment=found[1].decode(), entry_id=entry)

    async def cancel_by_id(self, *, where: Whereabouts, request_id: str) -> bool:
        """Cancel a request knowing only its id; return False if it had already finished."""
        if await self.redis.exists(final_key(where.deployment, request_id)):
            return False
        entries: Any = (
            await self.redis.xrange(jobs_key(where.deployment), where.entry_id, where.entry_id)
            if where.entry_id
            else []
        )
        if entries:
            job = job_decoder.decode(entries[0][1][b"j"])
            await self.cancel(job=job, entry_id=where.entry_id)
        else:
            # Running (its worker aborts it) or not yet recorded (checked again at claim).
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(cancel_key(where.deployment, request_id), "1", ex=MARKER_TTL_SECONDS)
                pipe.publish(cancel_channel(where.deployment), request_id)
                await pipe.execute()
        return True

    async def read_events(
        self, *, deployment: str, request_id: str, after: str, block_ms: int
    ) -> list[tuple[str, Event]]:
        """Return the reply events after an id, waiting up to block_ms for the first."""
        response: Any = await self.redis.xread(
            {reply_key(deployment, request_id): after}, count=512, block=block_ms
        )
        events: list[tuple[str, Event]] = []
        for _key, entries in response or []:
            for entry_id, fields in entries:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                events.append((eid, event_decoder.decode(fields[b"e"])))
        return events

    async def cancel(self, *, job: Job, entry_id: str) -> bool:
        """Cancel a request; return True when it was still queued and is now finished."""
        now = time.time()
        terminal = Failed(
            code="cancelled",
            message="request cancelled",
            prompt_tokens=len(job.prompt_token_ids),
            completion_tokens=0,
        )
        usage = usage_for(job, status=Status.CANCELLED, finished_at=now, error_code="cancelled")
        keys = [
            cancel_key(job.deployment, job.request_id),
            jobs_key(job.deployment),
            final_key(job.deployment, job.request_id),
            reply_key(job.deployment, job.request_id),
            usage_key(job.deployment),
        ]
        args: list[ScriptArg] = [
            job.request_id,
            entry_id,
            WORKERS_GROUP,
            MARKER_TTL_SECONDS,
            encode(terminal),
            encode(usage),
            self.reply_ttl,
            cancel_channel(job.deployment),
        ]
        return bool(await self._cancel(keys=keys, args=args))

    # --- worker side ---------------------------------------------------------------------

    async def ensure_groups(self, deployment: str) -> None:
        """Create the consumer groups of a deployment's streams if they do not exist."""
        for key, group in (
            (jobs_key(deployment), WORKERS_GROUP),
            (usage_key(deployment), INGEST_GROUP),
        ):
            try:
                await self.redis.xgroup_create(key, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def claim(
        self, *, deployment: str, worker: str, count: int, block_ms: int
    ) -> list[Claimed]:
        """Take up to count new jobs for this worker, waiting up to block_ms for one."""
        response: Any = await self.redis.xreadgroup(
            WORKERS_GROUP, worker, {jobs_key(deployment): ">"}, count=count, block=block_ms
        )
        claimed = []
        for _key, entries in response or []:
            for entry_id, fields in entries:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                claimed.append(Claimed(entry_id=eid, job=job_decoder.decode(fields[b"j"])))
        return claimed

    async def cancelled(self, *, deployment: str, request_ids: list[str]) -> set[str]:
        """Return which of these requests have been cancelled."""
        if not request_ids:
            return set()
        flags = await self.redis.mget([cancel_key(deployment, rid) for rid in request_ids])
        return {rid for rid, flag in zip(request_ids, flags, strict=True) if flag is not None}

    async def renew(self, *, deployment: str, worker: str, entry_ids: list[str]) -> None:
        """Reset the idle time of this worker's claimed jobs, which renews their leases."""
        if entry_ids:
            await self.redis.xclaim(
                jobs_key(deployment), WORKERS_GROUP, worker, 0, list(entry_ids), justid=True
            )

    async def heartbeat(self, *, deployment: str, worker: str, ttl: float) -> None:
        """Mark a worker alive for ttl seconds and forget workers whose heartbeat lapsed."""
        now = time.time()
        key = heartbeats_key(deployment)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {worker: now + ttl})
            pipe.zremrangebyscore(key, "-inf", now)
            await pipe.execute()

    async def leave(self, *, deployment: str, worker: str) -> None:
        """Remove a stopping worker from the live set."""
        await self.redis.zrem(heartbeats_key(deployment), worker)

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
                pipe.expire(key, self.reply_ttl)

    async def finalize_into(
        self,
        pipe: aredis.client.Pipeline,
        *,
        job: Job,
        entry_id: str,
        terminal: Event,
        usage: UsageEvent,
    ) -> None:
        """Queue the exactly-once finish of a request on a pipeline."""
        keys, args = self._finalize_call(job=job, entry_id=entry_id, terminal=terminal, usage=usage)
        await self._finalize(keys=keys, args=args, client=pipe)

    async def finalize(
        self, *, job: Job, entry_id: str, terminal: Event, usage: UsageEvent
    ) -> bool:
        """Finish a request exactly once; return False if something else finished it first."""
        keys, args = self._finalize_call(job=job, entry_id=entry_id, terminal=terminal, usage=usage)
        return bool(await self._finalize(keys=keys, args=args))

    def _finalize_call(
        self, *, job: Job, entry_id: str, terminal: Event, usage: UsageEvent
    ) -> tuple[list[str], list[ScriptArg]]:
        keys = [
            final_key(job.deployment, job.request_id),
            reply_key(job.deployment, job.request_id),
            usage_key(job.deployment),
            jobs_key(job.deployment),
        ]
        args: list[ScriptArg] = [
            encode(terminal),
            encode(usage),
            MARKER_TTL_SECONDS,
            entry_id,
            WORKERS_GROUP,
            self.reply_ttl,
        ]
        return keys, args

    # --- reaper --------------------------------------------------------------------------

    async def reclaim_expired(self, *, deployment: str, lease_seconds: float) -> int:
        """Reclaim jobs whose lease lapsed: requeue unstarted ones, end started ones.

        A started job cannot be resumed elsewhere without repeating tokens the client has
        seen, so it ends with a `worker_lost` error and bills what was produced.
        """
        try:
            response: Any = await self.redis.xautoclaim(
                jobs_key(deployment),
                WORKERS_GROUP,
                "reaper",
                min_idle_time=int(lease_seconds * 1000),
                start_id="0-0",
                count=100,
            )
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                return 0
            raise
        reclaimed = 0
        for entry_id, fields in response[1]:
            if not fields:
                continue
            eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            job = job_decoder.decode(fields[b"j"])
            await self._reclaim_one(job=job, entry_id=eid)
            reclaimed += 1
        return reclaimed

    async def _reclaim_one(self, *, job: Job, entry_id: str) -> None:
        reply = reply_key(job.deployment, job.request_id)
        history: Any = await self.redis.xrange(reply)
        events = [event_decoder.decode(fields[b"e"]) for _id, fields in history]
        if not events:
            await self._requeue(
                keys=[jobs_key(job.deployment)], args=[encode(job), WORKERS_GROUP, entry_id]
            )
            return
        produced = sum(e.tokens for e in events if isinstance(e, Delta))
        started_at = next((e.at for e in events if isinstance(e, Started)), None)
        now = time.time()
        terminal = Failed(
            code="worker_lost",
            message="the worker serving this request stopped; partial output was billed",
            prompt_tokens=len(job.prompt_token_ids),
            completion_tokens=produced,
        )
        usage = usage_for(
            job,
            status=Status.WORKER_LOST,
            finished_at=now,
            started_at=started_at,
            completion_tokens=produced,
            error_code="worker_lost",
        )
        await self.finalize(job=job, entry_id=entry_id, terminal=terminal, usage=usage)

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
            usage_key(deployment), INGEST_GROUP, consumer, min_idle_time=min_idle_ms, count=500
        )
        return self._usage_entries([(usage_key(deployment).encode(), response[1])])

    async def ack_usage(self, *, entries: list[tuple[str, str]]) -> None:
        """Acknowledge and delete ingested usage entries given as (deployment, entry id)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for deployment, entry_id in entries:
                pipe.xack(usage_key(deployment), INGEST_GROUP, entry_id)
                pipe.xdel(usage_key(deployment), entry_id)
            await pipe.execute()

    async def dead_letter_usage(self, *, deployment: str, event: UsageEvent, reason: str) -> None:
        """Keep a usage event the database refused, for an operator to inspect and replay."""
        await self.redis.xadd(dead_usage_key(deployment), {"u": encode(event), "why": reason})

    @staticmethod
    def _usage_entries(response: Any) -> list[tuple[str, str, UsageEvent]]:
        out = []
        for key, entries in response:
            name = key.decode() if isinstance(key, bytes) else key
            deployment = name[len("sy:{") : name.index("}")]
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
) -> UsageEvent:
    """Build the usage event of a job."""
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
        prompt_tokens=len(job.prompt_token_ids),
        completion_tokens=completion_tokens,
        enqueued_at=job.enqueued_at,
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=finished_at,
    )
