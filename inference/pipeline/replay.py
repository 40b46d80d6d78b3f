"""What every endpoint that takes an Idempotency-Key does with it, in one place.

A request with a key either answers a retry with its first request's answer (marked replayed)
or claims the key and runs; if it is refused, fails or is cancelled before it is running, the
key goes back, so that a retry runs again. A retry that asks for a whole answer while the first
request is still running is told to come back (a stream follows it instead).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.http.response import HttpResponseBase

from inference.pipeline.admission import VERSION_HEADER, key_free
from inference.pipeline.auth import Principal
from inference.pipeline.clients import dispatch_get, idempotency_get, routing_get
from inference.pipeline.idempotency import Original, body_digest, key_in_use

Replay = Callable[[Original], Awaitable[HttpResponseBase | None]]


async def replayed_or_claimed(
    *,
    principal: Principal,
    model: str,
    key: str,
    endpoint: str,
    body: dict[str, Any],
    replay: Replay,
    request_id: str,
) -> HttpResponseBase | None:
    """The first request's answer again, marked replayed; or None with the key claimed here.

    `replay` answers the first request again, or None when it failed: this request then runs
    in its place. A retry is a request for `model` like any other: one the key may not call
    now (a grant revoked since, say) is routing's 404, not the first answer again.
    """
    await routing_get(model, principal=principal)
    found = await idempotency_get().replayed_or_claimed(
        tenant_id=principal.tenant_id,
        key=key,
        digest=body_digest(endpoint=endpoint, body=body),
        replay=replay,
        request_id=request_id,
    )
    if found is None:
        return None
    original, replayed = found
    return replayed_marked(replayed, original)


@contextmanager
def key_freed_on_failure(*, tenant_id: int, key: str | None, request_id: str) -> Iterator[None]:
    """Free the key if what runs inside raises: refused, failed or cancelled, in the claim too
    (its answer lost). Only while `request_id` holds it: a key a retry took over stays its."""
    try:
        yield
    except BaseException:
        if key is not None:
            key_free(tenant_id=tenant_id, key=key, request_id=request_id)
        raise


async def finished_check(original: Original) -> None:
    """Refuse (409) to answer a whole response for a first request that is still running."""
    if not await dispatch_get().finished(
        deployment=original.deployment, request_id=original.request_id
    ):
        raise key_in_use(
            "The request with this Idempotency-Key is still running; retry when it has finished."
        )


def replayed_marked(response: HttpResponseBase, original: Original) -> HttpResponseBase:
    """A replayed answer says so, and names the request that made it."""
    response["Idempotent-Replayed"] = "true"
    response["x-request-id"] = original.request_id
    response[VERSION_HEADER] = original.version
    return response
