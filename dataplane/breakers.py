"""Circuit breakers shared between frontends: which alias and tenant breakers hold, until when.

Each frontend keeps its own breakers (inference.pipeline.breaker) and learns from the requests it
relays. One that opens writes here until when it holds and tells the other frontends, which
hold that tenant's requests for the alias too until then; one whose probe succeeds takes it
back. A frontend that starts, or subscribes again after an outage, reads what holds now. The
state is soft: a lost message costs the other frontends their own failures to learn it.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aredis

from dataplane.keys import BREAKERS_CHANNEL, BREAKERS_KEY


def _field(alias: str, tenant_id: int) -> str:
    return f"{tenant_id}:{alias}"


def _field_read(field: str, until: str) -> tuple[str, int, float] | None:
    """(alias, tenant, until) of a hash field and its value, or None if malformed."""
    try:
        tenant, alias = field.split(":", 1)
        return alias, int(tenant), float(until)
    except ValueError:
        return None


def breaker_message_read(data: str) -> tuple[str, int, float] | None:
    """(alias, tenant, until) of a message on BREAKERS_CHANNEL; until 0: it closed."""
    field, _, until = data.rpartition(" ")
    return _field_read(field, until)


async def breaker_share(client: aredis.Redis, *, alias: str, tenant_id: int, until: float) -> None:
    """Record that a tenant's breaker for an alias holds until `until` (0: it closed), and say so.

    Entries past their time are dropped on the way: this runs only when a breaker changes.
    """
    field = _field(alias, tenant_id)
    held: Any = await client.hgetall(BREAKERS_KEY)
    now = time.time()
    lapsed = [f for f, t in held.items() if float(t) <= now and f.decode() != field]
    async with client.pipeline(transaction=False) as pipe:
        if until > now:
            pipe.hset(BREAKERS_KEY, field, until)
        else:
            pipe.hdel(BREAKERS_KEY, field)
        if lapsed:
            pipe.hdel(BREAKERS_KEY, *lapsed)
        await pipe.execute()
    # Apart from the pipeline: a cluster client takes no PUBLISH in one.
    await client.publish(BREAKERS_CHANNEL, f"{field} {until if until > now else 0}")


async def breakers_held(client: aredis.Redis) -> dict[tuple[str, int], float]:
    """Every breaker some frontend holds now: (alias, tenant) -> until."""
    held: Any = await client.hgetall(BREAKERS_KEY)
    now = time.time()
    found: dict[tuple[str, int], float] = {}
    for field, until in held.items():
        read = _field_read(field.decode(), until.decode())
        if read is not None and read[2] > now:
            found[(read[0], read[1])] = read[2]
    return found
