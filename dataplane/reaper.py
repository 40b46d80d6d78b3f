"""The reaper: what a lost worker or a gone frontend leaves behind in a deployment's queue.

A job whose lease lapsed before it started goes back to the head of its tenant's queue; one that
had started ends with a `worker_lost` error billing what was produced (it cannot resume
elsewhere without repeating tokens its client saw). Queued jobs whose deadline passed end as
timeouts. The usage ingesters run it (billing.ingester).

A lease that lapsed while Redis itself was down says nothing about its worker: the worker could
not renew it. So nothing is reclaimed until the server has been up for a whole lease (its own
uptime, which a restart resets), and the ingester waits a lease after it finds Redis again.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aredis

from dataplane import scripts
from dataplane.finish import Finisher
from dataplane.frontdoor import FrontDoor
from dataplane.keys import WAKE_CAP, deployment_keys, reply_key
from dataplane.redis_client import server_uptime
from dataplane.types import (
    Delta,
    Event,
    Failed,
    Job,
    Started,
    Status,
    event_decoder,
    job_decoder,
    usage_for,
)


class Reaper:
    """Takes back lapsed leases and ends overdue queued jobs, over one async Redis client."""

    def __init__(
        self, client: aredis.Redis, *, reply_ttl: int = 900, lease_seconds: float = 0.0
    ) -> None:
        self.redis = client
        self.lease_seconds = lease_seconds
        self._requeue = client.register_script(scripts.REQUEUE)
        self._finisher = Finisher(client, reply_ttl=reply_ttl)
        self._front = FrontDoor(client, reply_ttl=reply_ttl)

    async def reclaim_expired(self, *, deployment: str) -> int:
        """Take back jobs whose lease lapsed: requeue unstarted ones, end started ones.

        A started job cannot be resumed elsewhere without repeating tokens the client has
        seen, so it ends with a `worker_lost` error and bills what was produced.
        """
        keys = deployment_keys(deployment)
        now = time.time()
        lapsed: Any = await self.redis.zrangebyscore(keys.leases, "-inf", now, start=0, num=100)
        if not lapsed or not await self._up_for_a_lease(keys.leases):
            return 0
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

    async def _up_for_a_lease(self, leases_key: str) -> bool:
        """Whether the server has been up long enough for every live worker to have renewed."""
        if self.lease_seconds <= 0:
            return True
        return await server_uptime(self.redis, leases_key) >= self.lease_seconds

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
        await self._finisher.finalize(job=job, terminal=terminal, usage=usage)

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
            ended += int(await self._front.expire(job_decoder.decode(payload)))
        return ended
