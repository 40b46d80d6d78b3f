"""Finishing a request: its reply events, and its one terminal event and usage record.

A worker appends a request's events to its reply stream as it runs (`publish`), then finishes it
exactly once (`finalize`): the first caller writes the terminal event and the usage event and
settles its tenant's fair-share counter; later callers (a worker racing the reaper, a cancel
racing a finish) do nothing. A frontend answering from its cache finishes through the same
script (dataplane.frontdoor).
"""

from __future__ import annotations

import redis.asyncio as aredis

from dataplane import scripts
from dataplane.keys import MARKER_TTL_SECONDS, deployment_keys, final_key, ledger_hour, reply_key
from dataplane.redis_client import ScriptArg, script_into
from dataplane.types import Event, Job, Started, UsageEvent, encode


def reply_ttl_of(job: Job, default: int) -> int:
    """How long a request's reply stream and whereabouts live."""
    # Requests with an Idempotency-Key keep their replies as long as the key lives.
    return job.reply_ttl or default


class Finisher:
    """Publishes requests' events and finishes them, over one async Redis client."""

    def __init__(self, client: aredis.Redis, *, reply_ttl: int = 900) -> None:
        self.redis = client
        self.reply_ttl = reply_ttl
        self._finalize = client.register_script(scripts.FINALIZE)

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
                pipe.expire(key, reply_ttl_of(job, self.reply_ttl))

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
            reply_ttl_of(job, self.reply_ttl),
            used,
            ledger_hour(job.enqueued_at),
            usage.prompt_tokens + usage.completion_tokens,
        ]
        return keys, args
