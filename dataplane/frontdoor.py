"""The front door of a deployment's queue: what frontends do with a request before and after
a worker takes it.

A frontend queues a job (`enqueue`), follows its reply stream, cancels it, ends it when its
deadline passes while queued or when the frontend failed while submitting it, finds a request by
id alone (`whereabouts`), and answers from its cache without a worker (`answer_here`).

Queues. A deployment has one sorted set per priority class (`interactive`, `batch`). Its
members are `<tenant>:<seq>:<request id>` with equal scores, so each tenant's jobs form a
first-in-first-out lexicographic range and every script names all the keys it touches. A
second sorted set per class holds the tenants that have jobs waiting, scored by their virtual
token counter: start-time fair queuing over tokens served, in the spirit of VTC. Taking a job
(dataplane.leases) picks the waiting tenant with the lowest counter and charges it prompt +
max_tokens divided by its weight; the finish settles that charge to the tokens the job really
used. A tenant that starts waiting again is lifted to the class's virtual clock, so idling earns
no credit. Interactive jobs always go before batch jobs.

Admission. A job is refused when no worker of the deployment is alive, when the queue is full
beyond what the workers' free slots take at once, or when the backlog ahead of it cannot drain
before its deadline at the rate the workers measured (lua/enqueue.lua). A request id is queued
once: a second submission of one queued, running or ended already queues nothing and follows the
first (a batch step that took over a line whose first submission stalled, a retried script).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from array import array
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from dataplane import scripts
from dataplane.coalesce import coalescer_of
from dataplane.finish import Finisher, reply_ttl_of
from dataplane.keys import (
    MARKER_TTL_SECONDS,
    WAKE_CAP,
    cancel_channel,
    cancel_key,
    deployment_keys,
    fence_key,
    final_key,
    ledger_field,
    ledger_hour,
    ledger_key,
    reply_key,
    whereabouts_key,
)
from dataplane.redis_client import (
    ScriptArg,
    cluster_of,
    pipeline_execute,
    script_into,
    text_of,
)
from dataplane.replies import Follower, ReplyReaders
from dataplane.types import (
    Event,
    Failed,
    Job,
    Status,
    UsageEvent,
    encode,
    event_decoder,
    job_decoder,
    usage_for,
)

log = logging.getLogger(__name__)

# Prompt tokens that key a job's prefix for replica affinity (dataplane.leases): vLLM's KV-cache
# block on CPU (128 tokens), eight blocks on GPU. A prompt must be longer to have a key: the
# cache reuses only full blocks and always computes the last prompt token.
PREFIX_TOKENS = 128


def prefix_key(job: Job, *, tokens: int = PREFIX_TOKENS) -> str:
    """Return the key of a job's prompt prefix for replica affinity; "" when it has none.

    Embeddings and prompts of `tokens` tokens or fewer have none. The key includes the job's
    prefix-cache salt (its tenant): a cached prefix serves only requests with the same salt, so
    two tenants sending one prompt have nothing to gain from meeting on one replica.
    """
    if job.input_lengths or len(job.prompt_token_ids) <= tokens:
        return ""
    digest = hashlib.blake2b(f"{job.adapter}\0{job.prefix_salt}".encode(), digest_size=8)
    digest.update(array("q", job.prompt_token_ids[:tokens]).tobytes())
    return digest.hexdigest()


class Refusal(enum.Enum):
    """Why a job was not queued."""

    NO_WORKER = "no_worker"
    QUEUE_FULL = "queue_full"
    DEADLINE_UNATTAINABLE = "deadline_unattainable"
    # A retry with the request's Idempotency-Key took its place (FrontDoor.shut_out).
    SHUT_OUT = "shut_out"
    # It would start before its deadline but not finish by it; only when asked (`finish_by`).
    FINISHES_LATE = "finishes_late"


@dataclass(frozen=True)
class Refused:
    reason: Refusal
    estimated_wait_ms: int = 0
    # FINISHES_LATE: the seconds one reserved token takes at one slot's share of the rate.
    seconds_per_token: float = 0.0


@dataclass(frozen=True)
class Whereabouts:
    tenant_id: int
    deployment: str
    # What a client resuming the request's stream needs to format it again.
    endpoint: str = ""
    version_digest: str = ""
    created: int = 0


class FrontDoor:
    """A frontend's side of the queue, over one async Redis client."""

    def __init__(self, client: aredis.Redis, *, reply_ttl: int = 900) -> None:
        self.redis = client
        self.reply_ttl = reply_ttl
        self._enqueue = client.register_script(scripts.ENQUEUE)
        self._unqueue = client.register_script(scripts.UNQUEUE)
        self._shut_out = client.register_script(scripts.SHUT_OUT)
        self._turns = coalescer_of(client)
        self._finisher = Finisher(client, reply_ttl=reply_ttl)
        self._replies = ReplyReaders(client)

    async def finished(self, *, deployment: str, request_id: str) -> bool:
        """Return whether a request has ended."""
        return bool(await self.redis.exists(final_key(deployment, request_id)))

    async def reached_queue(self, *, deployment: str, request_id: str) -> bool:
        """Return whether a request whose whereabouts exist ever got into its queue.

        A submission cut off half-way can write the whereabouts and not the job: on a cluster
        they live on different nodes. Such a request would never end; one that got in is
        queued or running (its job is kept until it ends) or has ended. The job is read first:
        the script that ends a request drops the job and marks it ended in one step.
        """
        keys = deployment_keys(deployment)
        if await self.redis.hexists(keys.jobs, request_id):
            return True
        return await self.finished(deployment=deployment, request_id=request_id)

    async def shut_out(self, *, deployment: str, request_id: str, ttl: int) -> bool:
        """Return whether a request reached its queue; if it has not, make sure it never will.

        Its enqueue is then refused (`Refusal.SHUT_OUT`) for `ttl` seconds: long enough for any
        frontend still holding it to give up. One step in the deployment's slot, so a request
        is either queued (or ended) or fenced out, never both.
        """
        keys = [
            deployment_keys(deployment).jobs,
            final_key(deployment, request_id),
            fence_key(deployment, request_id),
        ]
        return bool(await self._shut_out(keys=keys, args=[request_id, ttl]))

    async def enqueue(
        self,
        job: Job,
        *,
        max_queued: int = 1 << 30,
        max_queued_tokens: int = 1 << 50,
        payload: bytes | None = None,
        finish_by: bool = False,
    ) -> Refused | None:
        """Queue a job for its deployment's workers; None when queued, else why not.

        None too when its request id is queued, running or ended already: it is not queued a
        second time, and its caller follows that request by id as it would its own.

        Nothing is queued when no worker of the deployment is alive, when max_queued jobs
        already wait beyond what the workers' free slots take at once, when max_queued_tokens
        reserved tokens already wait, or when the backlog ahead of the job
        cannot drain before its deadline at the deployment's measured rate. `payload` is the
        job already encoded, when the caller encoded it (a frontend does, before admission).

        With `finish_by`, a job that would start before its deadline but, at one slot's share
        of the measured rate, not serve its reserved tokens by then is not queued either
        (`Refusal.FINISHES_LATE`): its caller may cap its max_tokens (inference.pipeline.capping).
        """
        on_cluster = cluster_of(self.redis) is not None
        if on_cluster:
            # On a cluster the whereabouts live on another node than the queue, and a pipeline
            # to both is two sends. Written first, a submission cut off half-way leaves
            # whereabouts without a job, which `reached_queue` finds (a resumed batch line is
            # then submitted again), never a job without whereabouts, which nothing could
            # find: its line would be queued twice.
            async with self.redis.pipeline(transaction=False) as pipe:
                self._whereabouts_into(pipe, job)
                await pipe.execute()

        def fill(pipe: aredis.client.Pipeline) -> None:
            script_into(
                pipe,
                self._enqueue,
                keys=[
                    *deployment_keys(job.deployment),
                    fence_key(job.deployment, job.request_id),
                    final_key(job.deployment, job.request_id),
                ],
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
                    "1" if finish_by else "0",
                ],
            )
            if not on_cluster:
                # Same round trip: where the request lives, so it can be cancelled by id.
                self._whereabouts_into(pipe, job)

        # With the other requests' calls of this turn of the loop, in one round trip.
        outcome, *_ = await self._turns.run(fill)
        code, wait_ms = int(outcome[0]), int(outcome[1])
        if code == -5:
            # Queued, running or ended already under this id (its first submission): this one
            # follows that request, which its whereabouts name.
            log.info("request %s was queued already; not queued again", job.request_id)
            return None
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
        if code == -4:
            return Refused(Refusal.SHUT_OUT)
        if code == -6:
            per_token = int(outcome[2]) / 1_000_000
            return Refused(
                Refusal.FINISHES_LATE, estimated_wait_ms=wait_ms, seconds_per_token=per_token
            )
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
            await self._cancelled(job_decoder.decode(payload))
        else:
            # Not queued (maybe not yet recorded): flag it; its worker checks at claim.
            # Two calls: a cluster client takes no SPUBLISH in a pipeline.
            await self.redis.set(
                cancel_key(where.deployment, request_id), "1", ex=MARKER_TTL_SECONDS
            )
            await self.redis.spublish(cancel_channel(where.deployment), request_id)
        return True

    async def reply_last_id(self, *, deployment: str, request_id: str) -> str | None:
        """Return the id of the newest entry of a request's reply stream, or None."""
        newest: Any = await self.redis.xrevrange(reply_key(deployment, request_id), count=1)
        if not newest:
            return None
        entry_id = newest[0][0]
        return text_of(entry_id)

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
                eid = text_of(entry_id)
                events.append((eid, event_decoder.decode(fields[b"e"])))
        return events

    async def cancel(self, *, job: Job) -> bool:
        """Cancel a request; return True when it was still queued and is now finished."""
        # Queued again after a worker handed it on, it bills what it had made: the stored
        # job says so, the caller's copy does not.
        stored: Any = await self.redis.hget(deployment_keys(job.deployment).jobs, job.request_id)
        return await self._cancelled(job if stored is None else job_decoder.decode(stored))

    async def _cancelled(self, job: Job) -> bool:
        """Cancel a request whose job is the stored one (or none is stored)."""
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
            code=code,
            message=message,
            prompt_tokens=prompt_tokens,
            completion_tokens=job.resumed_tokens,
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
            reply_ttl_of(job, self.reply_ttl),
            cancel_channel(job.deployment),
            ledger_hour(job.enqueued_at),
            usage.prompt_tokens + usage.completion_tokens,
            "1" if unqueued_too else "0",
        ]
        return bool(await self._unqueue(keys=keys, args=args))

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
            self._finisher.publish_into(pipe, job=job, events=events)
            await self._finisher.finalize_into(
                pipe, job=job, terminal=terminal, usage=usage, charged=False
            )
            await pipeline_execute(pipe)

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
        pipe.expire(whereabouts_key(job.request_id), reply_ttl_of(job, self.reply_ttl))
