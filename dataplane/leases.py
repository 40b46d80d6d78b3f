"""Leases: how workers take jobs from a deployment's queue, keep them, and hand them on.

A worker claims jobs in the fair order dataplane.frontdoor describes (lua/claim.lua), waits on
the deployment's wake list when there are none, and checks which of its jobs were cancelled.
An idle worker sends its next claim behind its blocking pop of the wake list, in one round trip
(`wait_then_claim`): Valkey runs the claim the moment a job's enqueue wakes the pop, before the
worker itself has woken, so a job reaches an idle worker's engine a round trip sooner.

Leases. A claimed job moves to a sorted set scored by its lease's end; its worker renews the
lease with each heartbeat and the reaper (dataplane.reaper) takes back jobs whose lease lapsed.
A heartbeat also marks the worker alive and reports its slots, measured rate and KV-cache use,
which admission and the autoscaler read.

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

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from dataplane import scripts
from dataplane.keys import (
    WAKE_CAP,
    cancel_key,
    deployment_keys,
    gauges_key,
    handoff_channel,
    heartbeats_key,
    retire_key,
    worker_wake_key,
)
from dataplane.redis_client import (
    ScriptArg,
    cluster_of,
    pipeline_execute,
    script_into,
    text_of,
)
from dataplane.types import Job, encode, job_decoder

# A replica takes a job for its prefix only while it holds at most this many times the mean load.
PREFIX_LOAD_BOUND = 1.25
# A worker's own wake list outlives the worker by this much at most.
WAKE_TTL_SECONDS = 60


def batch_every(share: float) -> int:
    """Return how often a claim takes batch work while interactive work waits too.

    `share` is the least part of the jobs handed out that goes to the batch class while both
    classes wait (at most half); 0 is strict priority, under which sustained interactive load
    starves batch work. A share of 0.05 is one job in every 20.
    """
    if share <= 0:
        return 0
    return max(2, round(1 / min(share, 0.5)))


@dataclass(frozen=True)
class Claimed:
    """Jobs a worker took: ones to run and ones whose deadline passed in the queue; `drained`
    when the claim left nothing queued for the deployment (a job queued after it wakes a
    waiting worker, so claiming again at once would find nothing more); `cancelled`, the
    requests of `run` cancelled before the claim took them (stop them as they start)."""

    run: list[Job]
    expired: list[Job]
    drained: bool
    cancelled: frozenset[str]


@dataclass(frozen=True)
class ClaimAsk:
    """What a claim asks for: its arguments but the deployment (see `Leases.claim`)."""

    count: int
    lease_seconds: float
    skip_tenants: frozenset[int] = frozenset()
    worker: str = ""
    affinity: bool = False
    batch_every: int = 0
    room: Mapping[int, int] | None = None
    room_default: int | None = None


class Leases:
    """A worker's side of the queue, over one async Redis client."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._claim = client.register_script(scripts.CLAIM)
        self._requeue = client.register_script(scripts.REQUEUE)
        self._pipelined = cluster_of(client) is None

    async def claim(
        self,
        *,
        deployment: str,
        count: int,
        lease_seconds: float,
        skip_tenants: frozenset[int] = frozenset(),
        worker: str = "",
        affinity: bool = False,
        batch_every: int = 0,
        room: Mapping[int, int] | None = None,
        room_default: int | None = None,
    ) -> Claimed:
        """Take up to count jobs in fair order, leased for lease_seconds.

        Jobs of `skip_tenants` stay queued: a worker filling its reserved slots takes only
        tenants that have nothing running on it. `room` caps the jobs each tenant it names may
        take, `room_default` those of any other tenant (None: no cap); a tenant with no room
        left is passed over like a skipped one (a worker's per-tenant caps, workers/fairness.py).

        A `worker` takes the jobs handed to it first and holds what it claims in its name; with
        `affinity` it hands jobs whose prefix another live worker owns to that worker, within
        the load bound, and takes the next ones in fair order instead.

        Interactive work goes before batch work; with `batch_every` > 0 (see `batch_every`),
        every batch_every-th job taken while both classes wait is a batch one instead.
        """
        ask = ClaimAsk(
            count=count,
            lease_seconds=lease_seconds,
            skip_tenants=skip_tenants,
            worker=worker,
            affinity=affinity,
            batch_every=batch_every,
            room=room,
            room_default=room_default,
        )
        return await self.claim_asked(deployment=deployment, ask=ask)

    async def claim_asked(self, *, deployment: str, ask: ClaimAsk) -> Claimed:
        """Claim as `claim` does, with its arguments in `ask`."""
        keys, args = _claim_call(deployment=deployment, now=time.time(), ask=ask)
        return _claimed(await self._claim(keys=keys, args=args))

    def pipelined(self) -> bool:
        """Whether `wait_then_claim` is one round trip: not on a cluster, whose client sends
        a blocking pop on its own."""
        return self._pipelined

    async def wait_then_claim(self, *, deployment: str, timeout: float, ask: ClaimAsk) -> Claimed:
        """Block until a job is queued, the worker `ask` names is woken (`wake`) or `timeout`
        seconds pass, then claim as `claim_asked` does.

        The claim is pipelined behind the pop on one connection, so Valkey runs it as soon as
        the pop returns. Its clock is the one of the send, up to `timeout` old when it runs:
        a lease ends that much early, and a job whose deadline passed meanwhile is started
        rather than expired (its run ends at once, on its deadline). Not on a cluster
        (`pipelined`).
        """
        call = _claim_call(deployment=deployment, now=time.time(), ask=ask)
        keys = deployment_keys(deployment)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.blpop([keys.wake, worker_wake_key(deployment, ask.worker)], timeout=timeout)
            script_into(pipe, self._claim, keys=call[0], args=call[1])
            _, answer = await pipeline_execute(pipe)
        return _claimed(answer)

    async def wake(self, *, deployment: str, worker: str) -> None:
        """Make the worker's pending `wait_then_claim` pop return now, and its claim run."""
        key = worker_wake_key(deployment, worker)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lpush(key, "1")
            pipe.ltrim(key, 0, 0)  # one token wakes it: more would only wake it again
            pipe.expire(key, WAKE_TTL_SECONDS)
            await pipe.execute()

    async def wait_for_work(self, *, deployment: str, timeout: float) -> None:
        """Block until a job is queued for the deployment or timeout seconds pass."""
        await self.redis.blpop([deployment_keys(deployment).wake], timeout=timeout)

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

    async def hand_on(self, *, worker: str, job: Job) -> bool:
        """Put a running job back at the head of its tenant's queue for another worker to carry
        on; `job` carries what was produced (Job.resumed). False if it is no longer this
        worker's to hand on (it ended, or its lease lapsed and was reclaimed)."""
        keys = deployment_keys(job.deployment)
        args: list[ScriptArg] = [
            job.request_id, time.time(), WAKE_CAP, worker, "resume", encode(job)
        ]  # fmt: skip
        return bool(await self._requeue(keys=list(keys), args=args))

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


def _claimed(answer: Any) -> Claimed:
    """The claim script's answer, decoded."""
    ok, expired, drained, cancelled = answer
    return Claimed(
        run=[job_decoder.decode(p) for p in ok],
        expired=[job_decoder.decode(p) for p in expired],
        drained=bool(int(drained)),
        cancelled=frozenset(text_of(rid) for rid in cancelled),
    )


def _claim_call(*, deployment: str, now: float, ask: ClaimAsk) -> tuple[list[str], list[ScriptArg]]:
    """The claim script's keys and arguments (see `Leases.claim`)."""
    skip = "," + ",".join(str(t) for t in sorted(ask.skip_tenants)) + ","
    rooms = "," + ",".join(f"{t}:{max(n, 0)}" for t, n in sorted((ask.room or {}).items())) + ","
    return list(deployment_keys(deployment)), [
        now,
        ask.count,
        now + ask.lease_seconds,
        skip,
        ask.worker,
        "1" if ask.affinity and ask.worker else "0",
        PREFIX_LOAD_BOUND,
        handoff_channel(deployment, ""),
        ask.batch_every,
        rooms,
        -1 if ask.room_default is None else max(ask.room_default, 0),
        cancel_key(deployment, ""),
    ]
