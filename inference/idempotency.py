"""Idempotency-Key, as Stripe defines it, kept per tenant in Redis for 24 hours.

The first request with a key owns it. A later request with the same key and the same body
gets the first one's result: a finished non-streaming request is replayed from its reply
stream (kept as long as the key), a streaming one attaches to the same stream from its start.
The same key with a different body is a 422; a non-streaming request whose original is still
running is a 409. Only successes are kept: a request refused at admission or ended by an
error releases its key, so the client's retry with that key runs again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aredis

from dataplane.keys import idempotency_key
from dataplane.scripts import IDEMPOTENCY_BEGIN
from inference.errors import ApiError

R = TypeVar("R")
KEY_TTL_SECONDS = 24 * 3600
# How long a key stays claimed by a request that has not yet been queued (its frontend may die).
_PENDING_TTL_SECONDS = 60
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


def key_validate(raw: str | None) -> str | None:
    """Return the Idempotency-Key header's value, or raise a 400 if it is malformed."""
    if raw is None:
        return None
    if not 0 < len(raw) <= MAX_KEY_LENGTH or not raw.isprintable():
        raise ApiError(
            400,
            "invalid_value",
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable characters.",
            param="Idempotency-Key",
        )
    return raw


def body_digest(*, endpoint: str, body: dict[str, Any]) -> str:
    """Return a digest of what a request asks for, independent of JSON key order."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{endpoint}\n{canonical}".encode()).hexdigest()


def record_key(tenant_id: int, key: str) -> str:
    """The Redis key of a tenant's Idempotency-Key record."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return idempotency_key(tenant_id, digest)


class Idempotency:
    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._begin = client.register_script(IDEMPOTENCY_BEGIN)

    async def begin(self, *, tenant_id: int, key: str, digest: str) -> Original | None:
        """Claim a key for a new request (None), or return the request that already has it.

        Raises 422 when the key was used with a different body and 409 while its first
        request has not yet been queued.
        """
        result: Any = await self._begin(
            keys=[record_key(tenant_id, key)], args=[digest, _PENDING_TTL_SECONDS]
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
            raise ApiError(
                409,
                "idempotency_key_in_use",
                "A request with this Idempotency-Key is still being admitted; retry shortly.",
                param="Idempotency-Key",
                retry_after=1,
            )
        return Original(
            request_id=fields[b"rid"].decode(),
            deployment=fields[b"deployment"].decode(),
            model=fields[b"model"].decode(),
            version=fields[b"version"].decode(),
            created=int(fields[b"created"]),
            deadline=float(fields[b"deadline"]),
        )

    async def bind(self, *, tenant_id: int, key: str, original: Original) -> None:
        """Record the queued request that owns a key, for the key's full lifetime."""
        record = record_key(tenant_id, key)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(
                record,
                mapping={
                    "rid": original.request_id,
                    "deployment": original.deployment,
                    "model": original.model,
                    "version": original.version,
                    "created": original.created,
                    "deadline": original.deadline,
                },
            )
            pipe.expire(record, KEY_TTL_SECONDS)
            await pipe.execute()

    async def replayed_or_claimed(
        self,
        *,
        tenant_id: int,
        key: str,
        digest: str,
        replay: Callable[[Original], Awaitable[R | None]],
    ) -> tuple[Original, R] | None:
        """The first request's answer again (with it), or None with the key claimed here.

        `replay` answers the first request again, or None when it failed: its key is freed
        and this request runs in its place (a 409 while another retry took the key first).
        """
        original = await self.begin(tenant_id=tenant_id, key=key, digest=digest)
        if original is None:
            return None
        replayed = await replay(original)
        if replayed is not None:
            return original, replayed
        await self.release(tenant_id=tenant_id, key=key)
        if await self.begin(tenant_id=tenant_id, key=key, digest=digest) is not None:
            raise ApiError(
                409,
                "idempotency_key_in_use",
                "Another request with this Idempotency-Key is running; retry shortly.",
                param="Idempotency-Key",
                retry_after=1,
            )
        return None

    async def release(self, *, tenant_id: int, key: str) -> None:
        """Free a key whose request was refused or failed, so a retry runs again."""
        await self.redis.delete(record_key(tenant_id, key))
