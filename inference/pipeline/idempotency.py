"""Idempotency-Key, as Stripe defines it, kept per tenant in Redis for 24 hours.

The first request with a key owns it. A later request with the same key and the same body
gets the first one's result: a finished non-streaming request is replayed from its reply
stream (kept as long as the key), a streaming one attaches to the same stream from its start.
The same key with a different body is a 422; a non-streaming request whose original is still
running is a 409. Only successes are kept: a request refused at admission or ended by an
error releases its key, so the client's retry with that key runs again.

A key's record goes through three states: claimed (the body's digest and its owner's
request id, for 60 s), bound (the request id, deployment and deadline, written before the
request is queued and kept 24 hours) and queued (marked once the queue took it). A frontend
that dies between binding and marking leaves a bound record whose request may or may not be
queued: a retry a few seconds later asks the deployment in one step, which either finds the
request queued (the retry follows it) or fences it out for good (the retry runs in its
place). A request runs once under its key, whichever frontend dies where.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aredis

from dataplane.frontdoor import FrontDoor
from dataplane.keys import idempotency_key
from dataplane.scripts import (
    IDEMPOTENCY_BEGIN,
    IDEMPOTENCY_BIND,
    IDEMPOTENCY_RELEASE,
    IDEMPOTENCY_TAKE,
)
from inference.base.errors import ApiError

R = TypeVar("R")
KEY_TTL_SECONDS = 24 * 3600
# How long a key stays claimed by a request that has not yet been bound (its frontend may die).
_PENDING_TTL_SECONDS = 60
# How long a retry leaves a bound request to be queued before it asks where that request is:
# binding and queueing take milliseconds on a live frontend.
BIND_GRACE_SECONDS = 5.0
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class Original:
    """The request that first used a key: enough to replay or attach to its reply stream."""

    request_id: str
    deployment: str
    model: str
    version: str
    created: int
    deadline: float
    queued: bool = True  # False: bound, and not (yet) known to be queued
    bound_at: float = 0.0
    # Its answer's running usage counts thinking tokens: its version splits a chat's thinking.
    thinking: bool = False


def key_in_use(message: str) -> ApiError:
    """The 409 of a request whose Idempotency-Key another request holds: retry shortly."""
    return ApiError(409, "idempotency_key_in_use", message, param="Idempotency-Key", retry_after=1)


def body_digest(*, endpoint: str, body: dict[str, Any]) -> str:
    """Return a digest of what a request asks for, independent of JSON key order."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{endpoint}\n{canonical}".encode()).hexdigest()


def record_key(tenant_id: int, key: str) -> str:
    """The Redis key of a tenant's Idempotency-Key record."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return idempotency_key(tenant_id, digest)


class Idempotency:
    def __init__(self, client: aredis.Redis, front: FrontDoor | None = None) -> None:
        self.redis = client
        self.front = front if front is not None else FrontDoor(client)
        self._begin = client.register_script(IDEMPOTENCY_BEGIN)
        self._bind = client.register_script(IDEMPOTENCY_BIND)
        self._take = client.register_script(IDEMPOTENCY_TAKE)
        self._release = client.register_script(IDEMPOTENCY_RELEASE)

    async def begin(
        self, *, tenant_id: int, key: str, digest: str, request_id: str
    ) -> Original | None:
        """Claim a key for a new request (None), or return the request that already has it.

        Raises 422 when the key was used with a different body and 409 while its first
        request has not yet been bound.
        """
        result: Any = await self._begin(
            keys=[record_key(tenant_id, key)], args=[digest, _PENDING_TTL_SECONDS, request_id]
        )
        outcome = result[0].decode()
        if outcome == "new":
            return None
        if outcome == "mismatch":
            raise ApiError(
                422,
                "idempotency_key_reused",
                "This Idempotency-Key was used with a different request body; use a new key.",
                param="Idempotency-Key",
            )
        fields = dict(zip(result[1][::2], result[1][1::2], strict=True))
        if b"rid" not in fields:
            raise key_in_use(
                "A request with this Idempotency-Key is still being admitted; retry shortly."
            )
        return Original(
            request_id=fields[b"rid"].decode(),
            deployment=fields[b"deployment"].decode(),
            model=fields[b"model"].decode(),
            version=fields[b"version"].decode(),
            created=int(fields[b"created"]),
            deadline=float(fields[b"deadline"]),
            # A record without "bound" predates the states: it was written once queued.
            queued=b"bound" not in fields or fields.get(b"queued") == b"1",
            bound_at=float(fields.get(b"bound", 0)),
            thinking=fields.get(b"thinking") == b"1",
        )

    async def bind(self, *, tenant_id: int, key: str, original: Original) -> None:
        """Bind a key to its request before that request is queued, for the key's lifetime.

        Raises 409 when the key is no longer this request's (a retry took it over).
        """
        bound = await self._bind(
            keys=[record_key(tenant_id, key)],
            args=[
                original.request_id,
                KEY_TTL_SECONDS,
                "rid",
                original.request_id,
                "deployment",
                original.deployment,
                "model",
                original.model,
                "version",
                original.version,
                "created",
                original.created,
                "deadline",
                original.deadline,
                "bound",
                time.time(),
                "queued",
                0,
                "thinking",
                int(original.thinking),
            ],
        )
        if not bound:
            raise key_in_use(
                "A retry with this request's Idempotency-Key took its place; retry with the "
                "same key for that request's result."
            )

    async def queued(self, *, tenant_id: int, key: str, request_id: str) -> None:
        """Mark a bound key's request queued (its retries follow it without asking)."""
        await self._bind(
            keys=[record_key(tenant_id, key)],
            args=[request_id, KEY_TTL_SECONDS, "queued", 1],
        )

    async def replayed_or_claimed(
        self,
        *,
        tenant_id: int,
        key: str,
        digest: str,
        replay: Callable[[Original], Awaitable[R | None]],
        request_id: str,
    ) -> tuple[Original, R] | None:
        """The first request's answer again (with it), or None with the key claimed here.

        `replay` answers the first request again, or None when it failed: its key passes to
        this request (`request_id`), which runs in its place (a 409 while another retry took
        the key first). A first request bound but not known to be queued for longer than
        BIND_GRACE_SECONDS is looked up in its deployment: queued, it is followed; not, it is
        fenced out and this request runs in its place.
        """
        original = await self.begin(
            tenant_id=tenant_id, key=key, digest=digest, request_id=request_id
        )
        if original is None:
            return None
        if not original.queued:
            if time.time() - original.bound_at < BIND_GRACE_SECONDS:
                raise key_in_use(
                    "A request with this Idempotency-Key is still being admitted; retry shortly."
                )
            reached = await self.front.shut_out(
                deployment=original.deployment,
                request_id=original.request_id,
                ttl=KEY_TTL_SECONDS,
            )
            if not reached:
                # Its frontend stalled or died before queueing it; it never will now.
                await self._taken(tenant_id, key, original, request_id)
                return None
            await self.queued(tenant_id=tenant_id, key=key, request_id=original.request_id)
        replayed = await replay(original)
        if replayed is not None:
            return original, replayed
        await self._taken(tenant_id, key, original, request_id)
        return None

    async def _taken(self, tenant_id: int, key: str, original: Original, request_id: str) -> None:
        """Take over a key whose first request will never answer, or raise 409."""
        taken = await self._take(
            keys=[record_key(tenant_id, key)],
            args=[original.request_id, original.deployment, request_id, _PENDING_TTL_SECONDS],
        )
        if not taken:
            raise key_in_use("Another request with this Idempotency-Key is running; retry shortly.")

    async def release(self, *, tenant_id: int, key: str, request_id: str) -> None:
        """Free a key whose request was refused or failed, so a retry runs again.

        Only while `request_id` owns it: a key a retry took over stays that retry's.
        """
        await self._release(keys=[record_key(tenant_id, key)], args=[request_id])
