"""The usage stream: one usage event per finished request, read by the usage ingesters.

Each deployment has one stream (dataplane.keys.usage_key) and one consumer group; an ingester
reads new events, takes over those another ingester read but never acknowledged, acknowledges
and deletes what it stored, and dead-letters what the database refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import ResponseError

from dataplane.keys import INGEST_GROUP, dead_usage_key, deployment_of, usage_key
from dataplane.redis_client import slot_groups, text_of
from dataplane.types import UsageEvent, encode, usage_decoder


class UsageStream:
    """The usage streams of deployments, over one async Redis client."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client

    async def ensure_groups(self, deployment: str) -> None:
        """Create the usage stream's consumer group if it does not exist."""
        try:
            await self.redis.xgroup_create(
                usage_key(deployment), INGEST_GROUP, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_usage(
        self,
        *,
        deployments: list[str],
        consumer: str,
        count: int,
        block_ms: int | None = None,
        pending: bool = False,
    ) -> list[tuple[str, str, UsageEvent]]:
        """Return usage events as (deployment, entry id, event) for this consumer: new ones,
        or with `pending` those it read before and has not acknowledged (from the oldest)."""
        if not deployments:
            return []
        start = "0" if pending else ">"
        # One read per slot: with a cluster, a read may name only streams of one slot.
        groups = slot_groups(self.redis, [usage_key(d) for d in deployments])
        responses: list[Any] = await asyncio.gather(
            *(
                self.redis.xreadgroup(
                    INGEST_GROUP,
                    consumer,
                    dict.fromkeys(keys, start),
                    count=count,
                    block=None if pending else block_ms,
                )
                for keys in groups
            )
        )
        return self._usage_entries([stream for response in responses for stream in response or []])

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
            name = text_of(key)
            deployment = deployment_of(name)
            for entry_id, fields in entries:
                if not fields:
                    continue
                eid = text_of(entry_id)
                out.append((deployment, eid, usage_decoder.decode(fields[b"u"])))
        return out
