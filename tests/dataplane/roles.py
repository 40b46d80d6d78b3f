"""Every data-plane role over one client, for tests that drive a deployment's whole queue."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aredis

from dataplane.finish import Finisher
from dataplane.frontdoor import FrontDoor
from dataplane.leases import Leases
from dataplane.reaper import Reaper
from dataplane.snapshots import Depth, depth
from dataplane.usage import UsageStream


@dataclass
class Roles:
    """A frontend's, a worker's, the reaper's and the ingester's side of the queue at once."""

    redis: aredis.Redis
    reply_ttl: int
    front: FrontDoor
    leases: Leases
    finisher: Finisher
    reaper: Reaper
    usage: UsageStream

    async def depth(self, deployment: str) -> Depth:
        return await depth(self.redis, deployment)


def roles(client: aredis.Redis, *, reply_ttl: int = 900) -> Roles:
    return Roles(
        redis=client,
        reply_ttl=reply_ttl,
        front=FrontDoor(client, reply_ttl=reply_ttl),
        leases=Leases(client),
        finisher=Finisher(client, reply_ttl=reply_ttl),
        reaper=Reaper(client, reply_ttl=reply_ttl),
        usage=UsageStream(client),
    )
