"""A request's share of its tenant's limits: counted, reserved, explained and settled.

A request is counted against its tenant's requests per minute as soon as its key is known,
reserves its tokens and cost when admitted, and settles the reservation to what it used
when it ends; a refusal is a 429 whose x-ratelimit-* headers say which limit and for how long.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.http import HttpResponseBase

from billing.selectors import tenant_month_spend_micros
from config.db import db_call
from dataplane.background import spawn
from dataplane.frontdoor import Refusal, Refused
from dataplane.quotas import Decision, Limits, Usage, cost_micros
from dataplane.redis_client import until_reachable
from dataplane.types import Failed, Finished, Job
from inference.base.errors import ApiError, should_retry
from inference.base.metrics import admission_decided
from inference.pipeline.answer_cache import CacheUse
from inference.pipeline.auth import Principal
from inference.pipeline.capping import CAPPED_HEADER
from inference.pipeline.clients import dispatch_get, idempotency_get, quotas_get
from inference.pipeline.idempotency import key_in_use
from models_registry.selectors import Route
from privacy.services import content_retain
from safety.policy import Policy

log = logging.getLogger(__name__)
# The model version that answered, on every response a version gave.
VERSION_HEADER = "x-roundhouse-model-version"
# On a response an alias's fallback gave: the alias the client named, and why it could not.
FALLBACK_FROM_HEADER = "x-roundhouse-fallback-from"
FALLBACK_REASON_HEADER = "x-roundhouse-fallback-reason"
# Refusals that say the platform cannot take a request on this model now, not that the
# request or its tenant is at fault: an alias's fallback may take it (generation_submit).
FALLBACK_REASONS = frozenset({"queue_full", "model_unavailable", "deadline_unattainable"})
# The reason given when the alias's circuit breaker sent the request on before asking it.
CIRCUIT_OPEN = "circuit_open"


def request_id_new() -> str:
    return uuid.uuid4().hex


_Response = TypeVar("_Response", bound=HttpResponseBase)


@dataclass(frozen=True)
class Submitted:
    job: Job
    route: Route
    principal: Principal
    decision: Decision
    idempotency_key: str | None = None
    cache: CacheUse | None = None
    # The prompt as the client sent it, kept only for a tenant that retains its text.
    prompt_text: str | None = None
    policy: Policy | None = None  # the tenant's safety policy, which filters the output
    # The alias the client named, when it could not take the request and its fallback did.
    fallback_from: str = ""
    fallback_reason: str = ""  # the refusal's code that sent it on
    # The alias whose circuit breaker this request's end feeds: the one that took it, when it
    # has a fallback to send requests on to (inference/pipeline/breaker.py); "" for none.
    breaker_alias: str = ""
    # The chat template as rendered for the engine, for an answer that carries it (vLLM's
    # return_prompt_text); None otherwise.
    rendered_prompt: str | None = None

    @property
    def bill_percent(self) -> int:
        """The share of the full price this request bills."""
        return self.cache.bill_percent if self.cache is not None and self.cache.hit else 100

    def headers(self) -> dict[str, str]:
        """The headers its response carries: the version, the cache's use, a fallback or a cap
        that degraded it, and the rate limits."""
        headers = {VERSION_HEADER: self.route.version}
        if self.cache is not None:
            headers["x-roundhouse-cache"] = "hit" if self.cache.hit else "miss"
        if self.fallback_from:
            headers[FALLBACK_FROM_HEADER] = self.fallback_from
            headers[FALLBACK_REASON_HEADER] = self.fallback_reason
        if self.job.max_tokens_requested:
            headers[CAPPED_HEADER] = str(self.job.sampling.max_tokens)
        return headers | ratelimit_headers(self.principal.limits, self.decision)

    def headed(self, response: _Response) -> _Response:
        """Its answer, carrying its headers (headers())."""
        for name, value in self.headers().items():
            response[name] = value
        return response


def queue_full_error(model: str, *, deployment: str | None = None) -> ApiError:
    """The fast refusal of a full queue; counted here when no enqueue attempt counts it."""
    if deployment is not None:
        admission_decided(deployment=deployment, reason="queue_full")
    return ApiError(
        503,
        "queue_full",
        f"'{model}' has more work waiting than it accepts; retry shortly.",
        retry_after=1,
    )


def refusal_error(refused: Refused, *, model: str, job: Job) -> ApiError:
    """The 503 that tells a client the platform, not its tenant, cannot take the request."""
    if refused.reason is Refusal.QUEUE_FULL:
        return queue_full_error(model)
    if refused.reason is Refusal.SHUT_OUT:
        return key_in_use(
            "A retry with this request's Idempotency-Key took its place after it stalled; "
            "retry with the same key for that request's result."
        )
    if refused.reason is Refusal.DEADLINE_UNATTAINABLE:
        wait = refused.estimated_wait_ms / 1000
        allowed = job.deadline - job.enqueued_at
        return ApiError(
            503,
            "deadline_unattainable",
            f"'{model}' has about {wait:.1f} s of work queued ahead of this request, longer "
            f"than its {allowed:.1f} s deadline; retry later or allow more time.",
            retry_after=max(1, math.ceil(wait - allowed)),
        )
    return ApiError(
        503,
        "model_unavailable",
        f"No worker is serving '{model}' right now; retry shortly.",
        retry_after=5,
    )


def route_cost(route: Route, *, prompt: int, completion: int) -> int:
    """The cost of `prompt` and `completion` tokens at a route's prices, in micros."""
    return cost_micros(
        price_input_per_1k=route.price_input_per_1k,
        price_output_per_1k=route.price_output_per_1k,
        prompt=prompt,
        completion=completion,
    )


_REJECTIONS = {
    "rate_limit_exceeded": "You have sent too many requests this minute.",
    "tokens_per_minute_exceeded": "This request would exceed your tokens-per-minute limit.",
    "concurrency_limit_exceeded": "You have too many requests in flight.",
    "budget_exceeded": "Your monthly budget is spent.",
}


async def request_count(*, principal: Principal) -> Decision:
    """Count a request against its tenant's requests per minute, or raise the 429.

    Called as soon as an API request's key is known, before its body is parsed or tokenised:
    a request that fails later (a bad body, a prompt too long, a refusal) has still counted,
    so a flood of bad requests throttles its own tenant only.
    """
    decision = await quotas_get().take_request(
        tenant_id=principal.tenant_id, limits=principal.limits
    )
    if not decision.admitted:
        raise _limit_error(principal, decision)
    return decision


async def body_bytes_count(*, principal: Principal, size: int, read: bool = False) -> None:
    """Count a large request body against its tenant's large-body bytes per minute, or raise
    the 429 (the tenant's quota, else ROUNDHOUSE_LARGE_BODY_BYTES_PER_MINUTE; 0: no limit).

    Called from the Content-Length before the body is read, so a tenant posting megabytes in
    a loop costs a frontend their headers once its share is spent. A body of unknown length is
    counted once `read`: it is taken whatever is left, so the next ones wait longer.
    """
    own = principal.large_body_bytes_per_minute
    per_minute = int(settings.ROUNDHOUSE_LARGE_BODY_BYTES_PER_MINUTE if own is None else own)
    if per_minute <= 0 or size < settings.ROUNDHOUSE_LARGE_BODY_BYTES:
        return
    wait_ms = await quotas_get().take_body_bytes(
        tenant_id=principal.tenant_id, size=size, per_minute=per_minute, force=read
    )
    if wait_ms:
        raise ApiError(
            429,
            "body_bytes_exceeded",
            f"You have sent more than {per_minute // (1024 * 1024)} MiB of request bodies of "
            f"{settings.ROUNDHOUSE_LARGE_BODY_BYTES // (1024 * 1024)} MiB or more this minute.",
            retry_after=wait_ms / 1000,
        )


async def admit(
    *,
    principal: Principal,
    request_id: str,
    reserve: Usage,
    request_taken: bool = False,
    admission: str = "",
) -> Decision:
    """Reserve the request's share of its tenant's limits or raise the 429 that explains why.

    With `request_taken`, `request_count` counted the request already; `admission` marks
    the reservation for a give-back that must undo it alone (`reservation_return`).
    """

    async def attempt(spent: int | None) -> Decision | None:
        return await quotas_get().admit(
            tenant_id=principal.tenant_id,
            request_id=request_id,
            limits=principal.limits,
            reserve=reserve,
            lease_seconds=settings.ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS + 60,
            spent_this_month=spent,
            request_taken=request_taken,
            admission=admission,
        )

    decision = await attempt(None)
    if decision is None:
        # Redis has no spend for this month yet: start it from the usage records.
        decision = await attempt(
            await db_call(tenant_month_spend_micros, tenant_id=principal.tenant_id)
        )
        assert decision is not None
    if decision.admitted:
        return decision
    raise _limit_error(principal, decision)


def _limit_error(principal: Principal, decision: Decision) -> ApiError:
    """The 429 that says which of its tenant's limits refused a request, and for how long."""
    reason = decision.reason or "rate_limit_exceeded"
    retry_ms = {
        "rate_limit_exceeded": decision.reset_requests_ms,
        "tokens_per_minute_exceeded": decision.reset_tokens_ms,
        "concurrency_limit_exceeded": 1000,
    }.get(reason, -1)
    return ApiError(
        429,
        reason,
        _REJECTIONS[reason],
        retry_after=retry_ms / 1000 if retry_ms > 0 else None,
        headers=ratelimit_headers(principal.limits, decision),
    )


# Failures that happen after admission; none of them is the client's fault.
_FAILURE_STATUS = {
    "invalid_request": 400,  # the engine refused what the frontend let through
    "timeout": 503,
    "deadline_exceeded": 503,
    "worker_lost": 503,
    "engine_error": 503,
    "adapter_unavailable": 503,
    "cancelled": 503,
}


def request_failure(event: Failed) -> ApiError:
    """The error a client sees for a request that failed after it was admitted.

    A failure a retry cannot mend (its deadline passed, it was cancelled) names no wait.
    """
    status = _FAILURE_STATUS.get(event.code, 503)
    retry_after = 1 if should_retry(status, event.code) else None
    return ApiError(status, event.code, event.message, retry_after=retry_after)


def request_ended(submitted: Submitted, event: Finished | Failed) -> None:
    """Settle a request's reservation; free its Idempotency-Key if it failed."""
    spawn(usage_settle(submitted, event))
    key = submitted.idempotency_key
    if key is not None and isinstance(event, Failed):
        key_free(tenant_id=submitted.job.tenant_id, key=key, request_id=submitted.job.request_id)


def key_free(*, tenant_id: int, key: str, request_id: str) -> None:
    """Free an Idempotency-Key if `request_id` holds it, so that a retry runs again.

    In the background, and again while Redis is unreachable (a minute at most): a claim whose
    answer was lost when Redis went away holds the key too, and a retry would be told the key
    is in use until the claim lapsed.
    """

    spawn(
        until_reachable(
            lambda: idempotency_get().release(tenant_id=tenant_id, key=key, request_id=request_id),
            "free an Idempotency-Key",
        )
    )


async def reservation_return(job: Job, *, admission: str = "") -> None:
    """Give back all an admitted request reserved: it used nothing (refused, or abandoned).

    With `admission`, only what that admission reserved: the request id may have been
    admitted again since (a fallback's attempt), and that reservation is not this one's.
    """
    await quotas_get().release(
        tenant_id=job.tenant_id,
        request_id=job.request_id,
        admitted_at=job.enqueued_at,
        used=Usage(tokens=0, cost_micros=0),
        admission=admission,
    )


async def request_abandon(job: Job) -> None:
    """End an admitted request whose submission or relay failed half-way; settle what it holds.

    The data plane finishes it here when no worker has it (an `internal_error` billed nothing:
    its one usage record) and its reservation goes back at once; a worker running it is told
    to cancel, and its end settles it as any end does. Spawn it: it runs on when its caller is
    a cancelled task. While Redis is unreachable it tries again, for a minute; after that the
    queue's deadline and the admission lease settle the request.
    """
    try:
        if await until_reachable(lambda: dispatch_get().abandon(job), "abandon a request"):
            await until_reachable(lambda: reservation_return(job), "give back a reservation")
    except Exception:
        log.warning("could not end the abandoned request %s", job.request_id, exc_info=True)


async def content_keep(submitted: Submitted, completion: str) -> None:
    """Store an ended request's text for a tenant that retains it; never fail the request."""
    if submitted.prompt_text is None:
        return
    try:
        await db_call(
            content_retain,
            tenant_id=submitted.job.tenant_id,
            request_id=submitted.job.request_id,
            prompt=submitted.prompt_text,
            completion=completion,
            retention_days=submitted.principal.retention_days,
        )
    except Exception:
        # The text itself is never logged, only that it could not be kept.
        log.warning("could not retain the text of %s", submitted.job.request_id, exc_info=True)


async def usage_settle(submitted: Submitted, event: Finished | Failed) -> None:
    """Settle an ended request's reservation to what it used (the ingester does it otherwise).

    Not on the frontend's own timeout or a relay that failed: the worker may still be producing
    tokens then, and the ingester settles to the count it finally bills.
    """
    if isinstance(event, Failed) and event.code in ("timeout", "relay_failed"):
        return
    full = route_cost(
        submitted.route, prompt=event.prompt_tokens, completion=event.completion_tokens
    )
    used = Usage(
        tokens=event.prompt_tokens + event.completion_tokens,
        cost_micros=full * submitted.bill_percent // 100,
    )
    await quotas_get().release(
        tenant_id=submitted.job.tenant_id,
        request_id=submitted.job.request_id,
        admitted_at=submitted.job.enqueued_at,
        used=used,
    )


def _duration(ms: int) -> str:
    """Format a wait as OpenAI's headers do: `250ms`, `1.5s`, `6m0s`."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{int(minutes)}m{seconds:.0f}s" if minutes else f"{seconds:g}s"


def ratelimit_headers(limits: Limits, decision: Decision) -> dict[str, str]:
    """Return the x-ratelimit-* headers of a response."""
    return {
        "x-ratelimit-limit-requests": str(limits.requests_per_minute),
        "x-ratelimit-remaining-requests": str(decision.remaining_requests),
        "x-ratelimit-reset-requests": _duration(decision.reset_requests_ms),
        "x-ratelimit-limit-tokens": str(limits.tokens_per_minute),
        "x-ratelimit-remaining-tokens": str(decision.remaining_tokens),
        "x-ratelimit-reset-tokens": _duration(max(decision.reset_tokens_ms, 0)),
    }
