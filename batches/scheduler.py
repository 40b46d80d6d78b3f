"""Which batch runs next: tenants take turns, the one served least recently first.

ROUNDHOUSE_BATCH_RUNNERS runners drive every tenant's batches. A runner is a chain of Celery
tasks on the `batches` queue, each one turn: it picks the unfinished batch whose tenant's
batches were stepped least recently (and of that tenant's, the one stepped least recently),
runs one step of it (batches.runner) and queues the runner's next turn. A tenant with ten
batches is one tenant among the others: another tenant's new batch gets the next turn any
runner takes, not a turn after each of the ten. The choice is made when a turn starts, so it
holds however many turns are queued.

A runner's turns carry its ticket, kept in Redis while the runner runs; a turn whose ticket
is no longer the runner's does nothing. Creating a batch starts the runners that are not
running. Resuming (when a Celery worker starts, and every minute) gives every runner a new
ticket and queues a turn with it: a runner whose turn was lost with a worker that died goes
on, and one whose turn is still queued is not doubled, as its older turn finds its ticket
replaced and ends. A runner with nothing to run ends; the next batch created starts it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.models import F, Max, Window
from django.utils import timezone
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError, LockNotOwnedError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.lock import Lock

from batches.models import UNFINISHED, Batch
from batches.runner import batch_step, batch_step_failed
from dataplane.keys import batch_lease_key, batch_runner_key
from dataplane.redis_client import redis_sync_client

log = logging.getLogger(__name__)
# Steps of a batch that may fail in a row before it ends failed: a step that fails that often
# fails for the batch itself, not for a passing fault.
STEP_ATTEMPTS = 5
# A database or Redis that cannot be reached fails every batch alike: the step waits for it.
_OUTAGES = (OperationalError, InterfaceError, RedisConnectionError, RedisTimeoutError)
# How long a runner's ticket outlives its last turn: longer than any wait in the queue should
# be. A ticket that lapsed anyway ends its runner, and the next resume starts it again.
_TICKET_SECONDS = 3600


def _ticket(redis: Redis, slot: int, ticket: str) -> Lock:
    """The runner's ticket as a lock whose token is the ticket (compare-and-delete, extend)."""
    lock = Lock(redis, batch_runner_key(slot), timeout=_TICKET_SECONDS, thread_local=False)
    lock.local.token = ticket.encode()
    return lock


def _runners_wanted() -> int:
    """How many runners should run: one per unfinished batch, up to the runners there are."""
    unfinished = Batch.objects.filter(status__in=UNFINISHED).count()
    return min(settings.ROUNDHOUSE_BATCH_RUNNERS, unfinished)


def _turn_queue(slot: int, ticket: str, *, countdown: float = 0) -> None:
    from batches.tasks import batches_turn

    batches_turn.apply_async((slot, ticket), countdown=countdown or None)


def runners_wake() -> int:
    """Start the runners that should run and are not running; return how many started.

    Called once a batch is created. A runner whose ticket is held is running (or its turn
    was lost, and resuming starts it again).
    """
    started = 0
    with redis_sync_client() as redis:
        for slot in range(_runners_wanted()):
            ticket = secrets.token_hex(8)
            if _ticket(redis, slot, ticket).acquire(blocking=False, token=ticket):
                _turn_queue(slot, ticket)
                started += 1
    return started


def runners_resume() -> int:
    """Give every runner that should run a new ticket and queue a turn with it; return how many.

    A runner's turn still queued finds its ticket replaced and ends; one under way ends after
    its step: either way one turn goes on.
    """
    wanted = _runners_wanted()
    with redis_sync_client() as redis:
        for slot in range(wanted):
            ticket = secrets.token_hex(8)
            redis.set(batch_runner_key(slot), ticket, ex=_TICKET_SECONDS)
            _turn_queue(slot, ticket)
    return wanted


def _candidates(*, most: int) -> list[str]:
    """The unfinished batches in the order runners take them: least recently served first.

    A tenant was served when a step of one of its batches last began; a tenant none of whose
    batches has had a step yet goes first. Within a tenant, its batches take turns the same way.
    """
    served = Window(Max("stepped_at"), partition_by=[F("tenant_id")])
    return list(
        Batch.objects.filter(status__in=UNFINISHED)
        .annotate(tenant_served=served)
        .order_by(
            F("tenant_served").asc(nulls_first=True),
            F("stepped_at").asc(nulls_first=True),
            "created_at",
        )
        .values_list("pk", flat=True)[:most]
    )


def turn_take(*, slot: int, ticket: str) -> str:
    """Take one turn of a runner: one step of the batch served next, then queue the next turn.

    Returns what became of the turn: "superseded" (the ticket is no longer the runner's),
    "idle" (the runner is not needed and ends), "busy" (other runners hold every batch it
    could take; it looks again once a lease could have lapsed), or what `batch_advance` says.
    """
    with redis_sync_client() as redis:
        lock = _ticket(redis, slot, ticket)
        if not lock.owned():
            return "superseded"
        try:
            said = _turn(redis, lock, slot)
        except _OUTAGES:
            log.warning("batch runner %d: its turn failed; it tries again", slot, exc_info=True)
            said = "retrying"
        if said in ("superseded", "idle"):
            return said
        try:
            lock.reacquire()
        except LockNotOwnedError:
            # Resumed meanwhile: the turn queued with the new ticket goes on.
            return said
        lapsed = settings.ROUNDHOUSE_BATCH_LEASE_SECONDS + 1
        _turn_queue(slot, ticket, countdown=lapsed if said in ("busy", "retrying") else 0)
        return said


def _turn(redis: Redis, lock: Lock, slot: int) -> str:
    if slot >= _runners_wanted():
        try:
            lock.release()
        except LockError:
            return "superseded"
        # A batch created just now may have found this ticket still held and started nothing.
        if slot < _runners_wanted():
            runners_wake()
        return "idle"
    # Leases are held by the runners under way, and by steps whose runner died (for a while).
    candidates = _candidates(most=2 * settings.ROUNDHOUSE_BATCH_RUNNERS + 1)
    with redis.pipeline(transaction=False) as pipe:
        for batch_id in candidates:
            pipe.exists(batch_lease_key(batch_id))
        leased = pipe.execute()
    for batch_id, held in zip(candidates, leased, strict=True):
        if not held:
            said = batch_advance(batch_id=batch_id)
            if said != "busy":
                return said
    return "busy"


def batch_advance(*, batch_id: str) -> str:
    """Run one step of a batch; return "continuing", "ended", "busy" or "retrying".

    "busy": another runner holds it. "retrying": the step failed; after STEP_ATTEMPTS failures
    in a row (an unreachable database or Redis is not counted) the batch ends failed, and a
    cancelled batch or one past its window ends whatever its steps do.
    """
    Batch.objects.filter(pk=batch_id).update(stepped_at=timezone.now())
    try:
        ended = asyncio.run(batch_step(batch_id))
    except Exception as exc:
        return _step_failed(batch_id, outage=isinstance(exc, _OUTAGES))
    if ended is None:
        return "busy"
    Batch.objects.filter(pk=batch_id, step_failures__gt=0).update(step_failures=0)
    return "ended" if ended else "continuing"


def _step_failed(batch_id: str, *, outage: bool) -> str:
    """Count a failed step (logged with its exception) and end the batch if it need not run."""
    failures = Batch.objects.filter(pk=batch_id)
    if not outage:
        failures.update(step_failures=F("step_failures") + 1)
    count = failures.values_list("step_failures", flat=True).first() or 0
    log.exception("batch %s: step failed (%d in a row)", batch_id, count)
    try:
        if asyncio.run(batch_step_failed(batch_id, give_up=count >= STEP_ATTEMPTS)):
            return "ended"
    except Exception:
        log.exception("batch %s: could not end it after a failed step", batch_id)
    return "retrying"
