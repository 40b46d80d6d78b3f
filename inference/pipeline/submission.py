"""Submit a request: route it, tokenise it, build its job, admit it and enqueue it.

A generation or embeddings request becomes a job here; its admission against its tenant's
limits is in inference.pipeline.admission, the shared clients and route cache in
inference.pipeline.clients.

Routing picks the version (the alias's split, a fallback while its breaker holds) and then
the pool: a version with one deployment costs nothing; with several, each frontend process
reads the pools' load from Redis at most every quarter second per version and picks a pool
per request (dataplane/pools.py decides), so the staleness is bounded and the draw in
proportion to each pool's rate keeps requests from herding onto one pool between two reads.

The job carries what the request asks of the engine: its sampling parameters, its reasoning
and the tool calls to parse. They are checked against the route and the tenant here, on the
frontend, so a request the engine would refuse is a 400 before anything is reserved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import secrets
import time
from dataclasses import replace
from typing import Any

import msgspec
from django.conf import settings

from dataplane.background import spawn
from dataplane.frontdoor import Refusal
from dataplane.pools import PoolLoad, pool_loads, pool_pick
from dataplane.quotas import Decision, Usage
from dataplane.redis_client import UNREACHABLE, until_reachable
from dataplane.tracing import TraceContext
from dataplane.types import (
    Job,
    Reasoning,
    Sampling,
    Tools,
    encode,
)
from inference.base.errors import ApiError, invalid
from inference.base.metrics import (
    RequestClock,
    admission_decided,
    fallback_taken,
    max_tokens_capped,
)
from inference.body.fields import CHAT
from inference.body.parser import EMBEDDINGS, EmbeddingRequest, GenerationRequest
from inference.pipeline.admission import (
    CIRCUIT_OPEN,
    FALLBACK_REASONS,
    Submitted,
    admit,
    queue_full_error,
    ratelimit_headers,
    refusal_error,
    request_abandon,
    request_count,
    reservation_return,
    route_cost,
)
from inference.pipeline.answer_cache import CacheLookup, cache_answer, cache_lookup
from inference.pipeline.auth import Principal
from inference.pipeline.breaker import breaker_admits
from inference.pipeline.capping import job_capped, max_tokens_fitting, max_tokens_within
from inference.pipeline.clients import answer_cache_get, dispatch_get, idempotency_get, routing_get
from inference.pipeline.idempotency import KEY_TTL_SECONDS, Original
from inference.pipeline.preprocessing import preprocessed
from inference.pipeline.safety import input_screen, policy_get, token_output_check
from inference.pipeline.tokenization import (
    INLINE_TOKENIZE_CHARS,
    input_ids,
    input_too_long,
    prepared_inline,
    prompt_ids,
    prompts_read,
    tokenizer_of,
    turns_fitted,
)
from models_registry.models import FALLBACK_HOPS, Task
from models_registry.selectors import Route, Routing
from models_registry.tokenizer import CONTENT_PARTS

log = logging.getLogger(__name__)
SHADOW_REPLY_TTL_SECONDS = 60

# After a queue_full refusal this frontend refuses that deployment's requests of the class
# refused (and of the batch class, after an interactive one) at once for a moment: 50 ms is
# short next to a request's service time and long next to a flood's gaps.
QUEUE_FULL_BACKOFF_SECONDS = 0.05
# How long a refusal waits for its reservation to be given back before it is answered.
GIVE_BACK_WAIT_SECONDS = 1.0
_full_until: dict[tuple[str, str], float] = {}


def queue_limits(route: Route, job: Job) -> tuple[int, int]:
    """The queue's limits (jobs, reserved tokens) a job is admitted under.

    Interactive work may fill the deployment's whole queue; batch work (batch lines, shadow
    copies) only its `ROUNDHOUSE_BATCH_QUEUE_SHARE`, so under overload the batch class is
    shed first and interactive requests still find room. A batch job that alone reserves
    more than the share still gets in when no tokens wait ahead of it.
    """
    if job.priority == "interactive":
        return route.max_queued, route.max_queued_tokens
    share = settings.ROUNDHOUSE_BATCH_QUEUE_SHARE
    return (
        int(route.max_queued * share),
        max(int(route.max_queued_tokens * share), job.reserved_tokens),
    )


def _queue_full_recently(deployment: str, priority: str) -> bool:
    """Whether the queue refused this class a moment ago (an interactive refusal: any class)."""
    interactive = _full_until.get((deployment, "interactive"), 0.0)
    until = max(interactive, _full_until.get((deployment, priority), 0.0))
    return until > time.monotonic()


def _prompt_text(request: GenerationRequest) -> str:
    """The prompt as retained: chat messages as JSON, a completion prompt as it came."""
    if request.messages is not None:
        # The messages as the client wrote them, without the parts form kept for rendering
        # (a batch's conversations as an array of them).
        shown = [
            [{k: v for k, v in m.items() if k != CONTENT_PARTS} for m in chat]
            for chat in request.chats()
        ]
        return json.dumps(shown if request.conversations else shown[0], ensure_ascii=False)
    if len(request.prompts) > 1 or isinstance(request.prompt, list):
        return json.dumps(list(request.prompts), ensure_ascii=False)
    return request.prompt or ""


async def _fallback_routing(
    fallback: str, refused: ApiError | None, *, principal: Principal
) -> Routing | None:
    """Where an alias's fallback routes now for the caller, or None where it routes nowhere
    (for it: a fallback its tenant or key may not call is not taken).

    A refusal that sent the request on stands when there is nowhere to send it: raised.
    """
    try:
        return await routing_get(fallback, principal=principal)
    except ApiError:
        if refused is not None:
            raise refused from None
        return None


async def generation_submit(
    *,
    principal: Principal,
    request: GenerationRequest,
    request_id: str,
    timeout: float | None = None,
    priority: str = "interactive",
    idempotency_key: str | None = None,
    reply_ttl: int = 0,
    clock: RequestClock | None = None,
    trace: TraceContext | None = None,
    request_taken: bool = False,
    endpoint: str | None = None,
    capping: bool = False,
) -> Submitted:
    """Admit a request and enqueue it for its deployment's workers.

    `endpoint` names the API the request came through on its usage record, where that is not
    the request's own (the Responses API runs as chat). `capping`: its answer carries response
    headers, so a tenant that caps output may have its max_tokens capped
    (inference/pipeline/capping.py); a WebSocket frame or a batch line has no place to say so.

    Its deadline is the soonest of the client's timeout, the tenant's maximum and the
    platform's maximum. `clock` times its preprocessing and admission; `trace` is the
    caller's span, which the worker continues. `request_taken`: `request_count` counted it.

    An interactive request that its alias's deployment cannot take (see FALLBACK_REASONS)
    goes to the alias's fallback, and on down its chain: admitted there from the start (its
    prompt rendered by the fallback's template, its reservation at the fallback's prices),
    once what it reserved here has been given back. Batch work waits for its own model.
    While the alias's circuit breaker is open (its recent requests failed; see
    inference/pipeline/breaker.py), the fallback is asked first, `circuit_open` the reason.
    """
    routing = await routing_get(request.model, principal=principal)
    if routing.fallback and priority == "interactive" and not request_taken:
        # Counted once, here, whichever model takes it (an attempt refused before admission
        # would not have counted it).
        await request_count(principal=principal)
        request_taken = True
    named, reason = request.model, ""
    tried = {named}  # each alias once, whatever a change made of the chain meanwhile
    while True:
        follow = (
            bool(routing.fallback)
            and priority == "interactive"
            and routing.fallback not in tried
            and len(tried) <= FALLBACK_HOPS
        )
        refused: ApiError | None = None
        # The alias's breaker is open: its recent requests failed; the fallback is asked first.
        held = follow and not breaker_admits(request.model, principal.tenant_id, request_id)
        if not held:
            try:
                submitted = await _generation_admit(
                    routing=routing,
                    principal=principal,
                    request=request,
                    request_id=request_id,
                    timeout=timeout,
                    priority=priority,
                    idempotency_key=idempotency_key,
                    reply_ttl=reply_ttl,
                    clock=clock,
                    trace=trace,
                    request_taken=request_taken,
                    endpoint=endpoint,
                    fallback_from=named if request.model != named else "",
                    capping=capping and principal.output_capping,
                )
            except ApiError as exc:
                if not follow or exc.code not in FALLBACK_REASONS:
                    raise
                refused = exc
            else:
                if routing.fallback:
                    submitted = replace(submitted, breaker_alias=request.model)
                if request.model == named:
                    return submitted
                return replace(submitted, fallback_from=named, fallback_reason=reason)
        onward = await _fallback_routing(routing.fallback, refused, principal=principal)
        if onward is None:
            # Held by its breaker, but the fallback routes nowhere now: the alias is asked after
            # all, and nothing else.
            tried.add(routing.fallback)
            continue
        code = refused.code if refused is not None else CIRCUIT_OPEN
        fallback_taken(model=request.model, fallback=routing.fallback, reason=code)
        reason = code
        tried.add(routing.fallback)
        request = replace(request, model=routing.fallback)
        routing = onward


async def _generation_admit(
    *,
    routing: Routing,
    principal: Principal,
    request: GenerationRequest,
    request_id: str,
    timeout: float | None,
    priority: str,
    idempotency_key: str | None,
    reply_ttl: int,
    clock: RequestClock | None,
    trace: TraceContext | None,
    request_taken: bool,
    endpoint: str | None,
    fallback_from: str,
    capping: bool,
) -> Submitted:
    """One attempt of generation_submit, on one model's routing."""
    route = routing.pick(tenant_id=principal.tenant_id, user=request.user)
    task_check(route, embeddings=False, model=request.model)
    reasoning = reasoning_build(request, route)
    route = await pool_route(route, priority=priority)
    if clock is not None:
        clock.deployment = route.deployment
    if _queue_full_recently(route.deployment, priority):
        # The queue refused a request a moment ago: refuse before tokenising or touching
        # Redis, so a flood costs the platform almost nothing.
        raise queue_full_error(request.model, deployment=route.deployment)
    # The served version's policy: whatever name reached it (an alias, the model, pinned).
    policy = await policy_get(tenant_id=principal.tenant_id, version=route.version)
    token_output_check(request, policy=policy)
    request = await input_screen(
        request, policy=policy, tenant_id=principal.tenant_id, request_id=request_id
    )
    context = min(route.context_length, principal.max_context_tokens)
    await tokenizer_of(route)  # its first load off the event loop
    if request.truncate_turns:
        request = await preprocessed(
            principal.tenant_id,
            turns_fitted,
            request,
            route,
            context=context,
            seconds=settings.ROUNDHOUSE_PREPROCESS_SECONDS,
        )
    if prepared_inline(request):
        prompts, text = prompts_read(request, route, context=context)
    else:
        # Long prompts, many messages and templates with tools are prepared off the event
        # loop, in their tenant's turn, so they stall no other stream.
        prompts, text = await preprocessed(
            principal.tenant_id, prompts_read, request, route, context=context
        )
    rendered = text if request.return_prompt_text else None
    sampling = sampling_build(
        request=request,
        route=route,
        principal=principal,
        prompt_tokens=max(len(p) for p in prompts),
    )
    if idempotency_key is not None and request.answered_with_prompt_ids:
        # A retry is answered from the reply stream alone, and this answer lists its prompts'
        # token ids: they go in it too.
        sampling = msgspec.structs.replace(sampling, prompt_ids_in_reply=True)
    tools = tools_build(request, route)
    now = time.time()
    job = Job(
        request_id=request_id,
        tenant_id=principal.tenant_id,
        api_key_id=principal.key_id,
        deployment=route.deployment,
        model_version=route.version_digest,
        endpoint=endpoint or request.endpoint,
        prompt_token_ids=[t for p in prompts for t in p],
        input_lengths=[len(p) for p in prompts] if len(prompts) > 1 else [],
        sampling=sampling,
        tools=tools,
        reasoning=reasoning,
        priority=priority,
        weight=principal.priority_weight,
        enqueued_at=now,
        deadline=_deadline(principal, now, timeout),
        reply_ttl=KEY_TTL_SECONDS if idempotency_key is not None else reply_ttl,
        adapter=route.adapter,
        user=(request.user or "")[:64],
        stream=request.stream,
        trace_id=trace.trace_id if trace else "",
        parent_span_id=trace.span_id if trace else "",
        fallback_from=fallback_from,
        cache_salt=request.cache_salt or "",
    )
    payload = _envelope(job)
    cache = await cache_lookup(answer_cache_get(), principal, job)
    if idempotency_key is not None:
        # Bound before it is queued: a retry then knows which request to look for, whatever
        # happens to this frontend from here (inference/pipeline/idempotency.py).
        await idempotency_get().bind(
            tenant_id=principal.tenant_id,
            key=idempotency_key,
            original=Original(
                request_id=request_id,
                deployment=route.deployment,
                model=route.served_name,
                version=route.version,
                created=int(now),
                deadline=job.deadline,
                thinking=job.reasoning is not None,
            ),
        )
    decision, job = await _job_submit(
        principal=principal,
        route=route,
        job=job,
        payload=payload,
        model=request.model,
        clock=clock,
        cache=cache,
        request_taken=request_taken,
        capping=capping,
    )
    if job.max_tokens_requested:
        # Capped: its answer is not the one its request asks for, so it fills no cache.
        cache = None
    try:
        shadow = routing.shadow_for(request_id=request_id)
        if shadow is not None and shadow.version_digest != route.version_digest:
            spawn(_shadow_submit(request, job, shadow))
        submitted = Submitted(
            job=job,
            route=route,
            principal=principal,
            decision=decision,
            idempotency_key=idempotency_key,
            cache=cache.use if cache is not None else None,
            prompt_text=_prompt_text(request) if principal.retention_days > 0 else None,
            policy=policy,
            rendered_prompt=rendered,
        )
        if idempotency_key is not None:
            await idempotency_get().queued(
                tenant_id=principal.tenant_id, key=idempotency_key, request_id=request_id
            )
    except BaseException:
        # Queued, but its caller will never follow it: it ends now, through the one path.
        spawn(request_abandon(job))
        raise
    return submitted


def _envelope(job: Job) -> bytes:
    """Encode a job for the queue, or raise the 400 of input that cannot be encoded.

    Done before admission, so such a request reserves nothing.
    """
    try:
        return encode(job)
    except (ValueError, OverflowError, msgspec.EncodeError):
        texts = {"user": [job.user], "stop": job.sampling.stop, "bad_words": job.sampling.bad_words}
        param = next((name for name, found in texts.items() if not _encodable(found)), "body")
        message = f"'{param}' holds text that cannot be encoded as UTF-8 (a lone surrogate?)."
        raise invalid(param, message) from None


def _encodable(texts: list[str]) -> bool:
    try:
        for text in texts:
            text.encode()
    except UnicodeEncodeError:
        return False
    return True


async def _job_submit(
    *,
    principal: Principal,
    route: Route,
    job: Job,
    model: str,
    clock: RequestClock | None,
    cache: CacheLookup | None = None,
    payload: bytes | None = None,
    request_taken: bool = False,
    capping: bool = False,
) -> tuple[Decision, Job]:
    """Reserve a built job's share of its tenant's limits and queue it, or raise why not.

    A request found in its tenant's response cache is admitted the same way, then answered
    from the cache instead of queued. `payload` is the job's encoding, if made already.
    Returns the decision and the job as queued: with `capping`, capped when its tenant's
    tokens per minute would refuse it or it would finish late (inference/pipeline/capping.py).
    """
    if clock is not None:
        clock.lap("preprocess")
    try:
        _queue_fit_check(route, job, model=model)
        reserve = _reservation(route, job)
        # This attempt's mark on its reservation: its give-backs undo it and nothing else
        # (the same request id is admitted again by a fallback, or a batch's next step).
        admission = secrets.token_hex(8)

        def give_back() -> asyncio.Task[Any]:
            return spawn(
                until_reachable(
                    lambda: reservation_return(job, admission=admission),
                    "give back a reservation",
                )
            )

        try:
            try:
                decision = await admit(
                    principal=principal,
                    request_id=job.request_id,
                    reserve=reserve,
                    request_taken=request_taken,
                    admission=admission,
                )
            except ApiError as refusal:
                # Refused: the script took nothing. A tenant that caps its output gets what its
                # tokens per minute have left now rather than a 429 to wait out.
                capped = _tokens_capped(refusal, job) if capping else None
                if capped is None:
                    raise
                job, payload = capped, None
                decision = await admit(
                    principal=principal,
                    request_id=job.request_id,
                    reserve=_reservation(route, job),
                    request_taken=request_taken,
                    admission=admission,
                )
        except ApiError:
            raise  # refused: the script took nothing
        except BaseException:
            # Redis went away or the client did while the admission script was in flight: it
            # may have run with its answer lost, and then it holds a reservation (a slot, the
            # reserved cost charged to the month) that no end would ever settle. Giving it
            # back is a no-op when it never ran; it goes on in the background until Redis is
            # back (a minute at most), as the refusal is answered.
            give_back()
            raise
        try:
            if cache is not None and cache.answer is not None:
                await cache_answer(dispatch_get(), job=job, use=cache.use, answer=cache.answer)
            else:
                job = await _enqueue(
                    route=route,
                    job=job,
                    model=model,
                    payload=payload,
                    capping=capping,
                )
        except ApiError as exc:
            # Admitted, then refused by the queue: nothing was queued, so the reservation goes
            # back at once and the request leaves no usage record, like any other refusal.
            released = give_back()
            # Given back before the refusal is answered, so that the tenant's slot is free for
            # a fallback's attempt. Waited for briefly: with Redis away it goes on trying in
            # the background and the refusal is answered (a late give-back undoes this
            # attempt's reservation only). A cancel of this request still lets it finish.
            await asyncio.wait({released}, timeout=GIVE_BACK_WAIT_SECONDS)
            raise exc.with_headers(ratelimit_headers(principal.limits, decision)) from None
        except BaseException:
            # Admitted, then anything else (any exception, a cancelled task): the job may or
            # may not be queued. It ends through the one path that settles its reservation
            # and leaves exactly one usage record.
            spawn(request_abandon(job))
            raise
    except ApiError as exc:
        admission_decided(deployment=route.deployment, reason=exc.code)
        raise
    finally:
        if clock is not None:
            clock.lap("admission")
    admission_decided(deployment=route.deployment, reason="admitted")
    if job.max_tokens_requested:
        max_tokens_capped(deployment=route.deployment)
    return decision, job


def _reservation(route: Route, job: Job) -> Usage:
    """What admission reserves for a job: its tokens, and their cost at the route's price."""
    return Usage(
        tokens=job.reserved_tokens,
        cost_micros=route_cost(
            route,
            prompt=len(job.prompt_token_ids),
            completion=job.sampling.max_tokens * job.choices,
        ),
    )


def _tokens_capped(refusal: ApiError, job: Job) -> Job | None:
    """The job capped to what its tenant's tokens per minute have left, when its refusal was
    for them and a cap at or above the floor fits; else None (inference/pipeline/capping.py)."""
    if refusal.code != "tokens_per_minute_exceeded" or job.input_lengths or job.shadow:
        return None
    try:
        left = int(refusal.headers.get("x-ratelimit-remaining-tokens", ""))
    except ValueError:
        return None
    cap = max_tokens_within(
        tokens_left=left,
        prompt_tokens=len(job.prompt_token_ids),
        choices=job.choices,
        floor=max(settings.ROUNDHOUSE_CAPPED_MAX_TOKENS_FLOOR, job.sampling.min_tokens),
    )
    return None if cap is None or cap >= job.sampling.max_tokens else job_capped(job, cap)


def _queue_fit_check(route: Route, job: Job, *, model: str) -> None:
    """Refuse a request that reserves more tokens than its deployment queues at all.

    The queue refuses it as full whatever waits ahead of it, so a 503 queue_full would have
    the client retry for ever: it is a 400 that names what to lower, before anything is
    reserved.
    """
    limit = route.max_queued_tokens
    if job.reserved_tokens <= limit:
        return
    prompt = len(job.prompt_token_ids)
    if job.endpoint == EMBEDDINGS:
        message = (
            f"This request's input is {prompt} tokens, more than '{model}' queues at once "
            f"({limit} tokens). Send fewer or shorter inputs."
        )
        raise ApiError(400, "exceeds_queue_capacity", message, param="input")
    # Name n when max_tokens for one choice would fit: it is the choices that overflow.
    param = "n" if job.choices > 1 and prompt + job.sampling.max_tokens <= limit else "max_tokens"
    message = (
        f"This request reserves {job.reserved_tokens} tokens ({prompt} in its prompts and "
        f"max_tokens {job.sampling.max_tokens} for each of its {job.choices} choices), more "
        f"than '{model}' queues at once ({limit} tokens). Lower max_tokens or n."
    )
    raise ApiError(400, "exceeds_queue_capacity", message, param=param)


async def _enqueue(
    *, route: Route, job: Job, model: str, payload: bytes | None = None, capping: bool = False
) -> Job:
    """Queue an admitted job for its deployment's workers, or raise why the queue refused it.

    With `capping` (its tenant opted in), a generation that would finish after its deadline
    is queued with the max_tokens that fits, when one at or above the floor does, and as it
    is otherwise (inference/pipeline/capping.py). Returns the job as queued.
    """
    max_queued, max_queued_tokens = queue_limits(route, job)
    finish_by = capping and not job.input_lengths and not job.shadow
    refused = await dispatch_get().enqueue(
        job,
        max_queued=max_queued,
        max_queued_tokens=max_queued_tokens,
        payload=payload,
        finish_by=finish_by,
    )
    if refused is not None and refused.reason is Refusal.FINISHES_LATE:
        cap = max_tokens_fitting(
            seconds_left=job.deadline - time.time(),
            wait_seconds=refused.estimated_wait_ms / 1000,
            seconds_per_token=refused.seconds_per_token,
            prompt_tokens=len(job.prompt_token_ids),
            choices=job.choices,
            floor=max(settings.ROUNDHOUSE_CAPPED_MAX_TOKENS_FLOOR, job.sampling.min_tokens),
        )
        if cap is not None and cap < job.sampling.max_tokens:
            job, payload = job_capped(job, cap), None
        # Asked once more without the finish check: the queue may have moved meanwhile, and
        # the request is then refused, or queued, as any other tenant's would be.
        refused = await dispatch_get().enqueue(
            job, max_queued=max_queued, max_queued_tokens=max_queued_tokens, payload=payload
        )
    if refused is not None:
        if refused.reason is Refusal.QUEUE_FULL:
            key = (route.deployment, job.priority)
            _full_until[key] = time.monotonic() + QUEUE_FULL_BACKOFF_SECONDS
        raise refusal_error(refused, model=model, job=job)
    return job


def _deadline(principal: Principal, now: float, timeout: float | None) -> float:
    """The soonest of the client's timeout, the tenant's maximum and the platform's maximum."""
    return now + min(
        timeout or math.inf,
        principal.max_request_seconds,
        settings.ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS,
    )


def task_check(route: Route, *, embeddings: bool, model: str) -> None:
    """Refuse a request sent to an endpoint its model does not serve."""
    if (route.task == Task.EMBEDDING) == embeddings:
        return
    if embeddings:
        message = f"'{model}' is a {route.task} model; call /v1/chat/completions instead."
    else:
        message = f"'{model}' is an embedding model; call /v1/embeddings instead."
    raise ApiError(400, "wrong_endpoint_for_model", message, param="model")


async def embedding_submit(
    *,
    principal: Principal,
    request: EmbeddingRequest,
    request_id: str,
    timeout: float | None = None,
    priority: str | None = None,
    reply_ttl: int = 0,
    clock: RequestClock | None = None,
    trace: TraceContext | None = None,
    request_taken: bool = False,
) -> Submitted:
    """Admit an embeddings request and enqueue it for its encoder deployment's workers."""
    routing = await routing_get(request.model, principal=principal)
    route = routing.pick(tenant_id=principal.tenant_id, user=request.user)
    task_check(route, embeddings=True, model=request.model)
    route = await pool_route(route, priority=priority or request.priority)
    if clock is not None:
        clock.deployment = route.deployment
    if request.dimensions is not None and request.dimensions not in route.dimensions:
        allowed = ", ".join(str(d) for d in route.dimensions)
        raise invalid(
            "dimensions",
            f"'{request.model}' returns vectors of {allowed} dimensions, not {request.dimensions}.",
        )
    if _queue_full_recently(route.deployment, priority or request.priority):
        raise queue_full_error(request.model, deployment=route.deployment)
    context = min(route.context_length, principal.max_context_tokens)
    await tokenizer_of(route)  # its first load off the event loop
    if sum(len(i) for i in request.inputs) > INLINE_TOKENIZE_CHARS:
        inputs = await preprocessed(principal.tenant_id, input_ids, request, route, context=context)
    else:
        inputs = input_ids(request, route, context=context)
    for index, ids in enumerate(inputs):
        if len(ids) > context:
            raise input_too_long(index, str(len(ids)), context)
    now = time.time()
    job = Job(
        request_id=request_id,
        tenant_id=principal.tenant_id,
        api_key_id=principal.key_id,
        deployment=route.deployment,
        model_version=route.version_digest,
        endpoint=EMBEDDINGS,
        prompt_token_ids=[t for ids in inputs for t in ids],
        input_lengths=[len(ids) for ids in inputs],
        use_activation=request.use_activation,
        sampling=Sampling(max_tokens=0),
        priority=priority or request.priority,
        weight=principal.priority_weight,
        enqueued_at=now,
        deadline=_deadline(principal, now, timeout),
        user=(request.user or "")[:64],
        reply_ttl=reply_ttl,
        trace_id=trace.trace_id if trace else "",
        parent_span_id=trace.span_id if trace else "",
    )
    payload = _envelope(job)
    decision, job = await _job_submit(
        principal=principal,
        route=route,
        job=job,
        payload=payload,
        model=request.model,
        clock=clock,
        request_taken=request_taken,
    )
    return Submitted(job=job, route=route, principal=principal, decision=decision)


async def _shadow_submit(request: GenerationRequest, job: Job, route: Route) -> None:
    """Enqueue a copy of an accepted request for a candidate version.

    The copy is tokenised with the candidate's tokenizer, runs at batch priority, reserves no
    quota and is never billed; nobody reads its output. Its usage record (marked shadow) gives
    the candidate's latencies and errors for comparison.
    """
    try:
        prompts = await preprocessed(job.tenant_id, prompt_ids, request, route)
        copy = msgspec.structs.replace(
            job,
            request_id=f"{job.request_id}-shadow",
            deployment=route.deployment,
            model_version=route.version_digest,
            adapter=route.adapter,
            prompt_token_ids=[t for p in prompts for t in p],
            input_lengths=[len(p) for p in prompts] if len(prompts) > 1 else [],
            priority="batch",
            reply_ttl=SHADOW_REPLY_TTL_SECONDS,
            shadow=True,
        )
        max_queued, max_queued_tokens = queue_limits(route, copy)
        refused = await dispatch_get().enqueue(
            copy, max_queued=max_queued, max_queued_tokens=max_queued_tokens
        )
        if refused is not None:
            log.info("shadow copy of %s not queued: %s", job.request_id, refused.reason)
    except Exception:
        log.warning("shadow copy of %s failed", job.request_id, exc_info=True)


GREEDY_TEMPERATURE = 1e-5  # below it vLLM samples greedily
# The most log probabilities an answer's prompt_logprobs may list (positions x (alternatives
# + 1) x the choices that each list their prompt's): about 16 MB of JSON, which a frontend
# builds on its event loop. An 8k-token prompt with 20 alternatives fits; 128 choices of a
# long prompt would be hundreds of megabytes, and would stall every stream on that frontend.
MAX_PROMPT_LOGPROBS = 2**18


def sampling_build(
    *, request: GenerationRequest, route: Route, principal: Principal, prompt_tokens: int
) -> Sampling:
    """Return the sampling parameters of a request after enforcing token and context limits.

    `prompt_tokens` is the longest prompt's length (a completions request may send several).
    """
    prompt_param = "messages" if request.endpoint == CHAT else "prompt"
    if prompt_tokens == 0:
        # The engine refuses an empty prompt; the client hears why, not a 503.
        message = f"The {prompt_param} is empty: it has no tokens."
        raise ApiError(400, "invalid_value", message, param=prompt_param)
    context = min(route.context_length, principal.max_context_tokens)
    if prompt_tokens >= context:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, your "
            f"{prompt_param} resulted in {prompt_tokens} tokens.",
            param=prompt_param,
        )
    cap = principal.max_tokens_per_request
    if request.max_tokens is not None and request.max_tokens > cap:
        raise ApiError(
            400,
            "max_tokens_exceeded",
            f"max_tokens is {request.max_tokens}, but this tenant allows at most {cap}.",
            param="max_tokens",
        )
    max_tokens = request.max_tokens or min(cap, context - prompt_tokens)
    if request.truncate_prompt_tokens is not None:
        # A client that has its prompt truncated asks for the request to fit: as vLLM's server
        # does then, the output gets what the context has left after the prompt kept.
        max_tokens = min(max_tokens, context - prompt_tokens)
    if prompt_tokens + max_tokens > context:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_param}, "
            f"{max_tokens} in the completion). Reduce the {prompt_param} or max_tokens.",
            param="max_tokens",
        )
    if request.min_tokens > max_tokens:
        raise ApiError(
            400, "invalid_value", "'min_tokens' cannot exceed max_tokens.", param="min_tokens"
        )
    defaults = route.sampling_defaults
    temperature = (
        request.temperature
        if request.temperature is not None
        else float(defaults.get("temperature", 1.0))
    )
    if request.n > 1 and temperature < GREEDY_TEMPERATURE and not request.beam_search:
        # Greedy choices would all be the same text: vLLM refuses it, so does the platform.
        message = f"n must be 1 when using greedy sampling, got {request.n}."
        raise ApiError(400, "invalid_value", message, param="n")
    prompt_logprobs = prompt_logprobs_asked(request)
    if prompt_logprobs is not None:
        _prompt_logprobs_bound(request, prompt_logprobs, prompt_tokens)
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=request.top_p if request.top_p is not None else float(defaults.get("top_p", 1.0)),
        top_k=request.top_k if request.top_k is not None else int(defaults.get("top_k", 0)),
        seed=request.seed,
        stop=request.stop,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        n=request.n,
        repetition_penalty=request.repetition_penalty,
        repetition_detection=request.repetition_detection,
        min_p=request.min_p,
        stop_token_ids=list(request.stop_token_ids),
        bad_words=list(request.bad_words),
        logit_bias=dict(request.logit_bias or {}),
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        logprobs=request.logprobs,
        logprob_token_ids=list(request.logprob_token_ids or ()),
        prompt_logprobs=prompt_logprobs,
        prompt_in_logprobs=_echoes_logprobs(request),
        structured=request.structured,
        allowed_token_ids=(
            None if request.allowed_token_ids is None else list(request.allowed_token_ids)
        ),
        logprob_tokens_as_ids=request.tokens_as_ids,
        output_token_ids=request.return_token_ids,
        beam_search=request.beam_search,
        length_penalty=request.length_penalty,
        thinking_token_budget=request.thinking_token_budget,
    )


def prompt_logprobs_asked(request: GenerationRequest) -> int | None:
    """How many of the likeliest tokens each prompt token comes with, as vLLM's server asks its
    engine: what the request says, else with `echo` what its logprobs say (chat's
    top_logprobs, 0 when not asked).

    The engine then scores the whole prompt, so it reads none of it from the prefix cache.
    """
    if request.prompt_logprobs is not None or not request.echo:
        return request.prompt_logprobs
    if request.conversations:
        return None  # a batch's answer has no place for them (vLLM's server drops them)
    if request.endpoint == CHAT:
        return request.logprobs or 0
    return request.logprobs


def _echoes_logprobs(request: GenerationRequest) -> bool:
    """Whether the prompt's log probabilities open the text's (completions' echo with logprobs)."""
    return request.echo and request.endpoint != CHAT and request.logprobs is not None


def _prompt_logprobs_bound(request: GenerationRequest, alternatives: int, longest: int) -> None:
    """Refuse prompt_logprobs whose answer would list more than MAX_PROMPT_LOGPROBS entries.

    Chat lists them once on the body; completions on every choice, and an echo's logprobs
    repeat them. `longest` is the longest prompt's length.
    """
    copies = 1 if request.endpoint == CHAT else request.n * max(len(request.prompts), 1)
    if _echoes_logprobs(request):
        copies *= 2
    entries = longest * (alternatives + 1) * copies
    if entries > MAX_PROMPT_LOGPROBS:
        field = "prompt_logprobs" if request.prompt_logprobs is not None else "logprobs"
        raise ApiError(
            400,
            "invalid_value",
            f"The answer would list {entries} prompt log probabilities ({longest} prompt "
            f"tokens × {alternatives + 1} × {copies} choices), more than the "
            f"{MAX_PROMPT_LOGPROBS} one answer carries: ask for fewer alternatives, fewer "
            "choices or a shorter prompt.",
            param=field,
        )


def reasoning_build(request: GenerationRequest, route: Route) -> Reasoning | None:
    """What the worker needs to split a reasoning model's thinking from its answer; None for
    a version without a reasoning parser, which refuses what only such a model can do."""
    if not route.reasoning_parser:
        if request.thinking_token_budget is not None:
            raise _no_reasoning(request, "thinking_token_budget")
        if not request.include_reasoning:
            raise _no_reasoning(request, "include_reasoning")
        return None
    if request.endpoint != CHAT:
        return None  # a completion is the model's raw text: nothing to split
    return Reasoning(
        parser=route.reasoning_parser,
        template_kwargs=json.dumps(request.chat_template_kwargs or {}),
        include=request.include_reasoning,
        running=request.continuous_usage,
    )


def _no_reasoning(request: GenerationRequest, field: str) -> ApiError:
    return ApiError(
        400,
        "unsupported_parameter",
        f"'{request.model}' has no reasoning parser in its manifest: it does not think apart "
        f"from its answer, so '{field}' cannot apply; leave it out.",
        param=field,
    )


def tools_build(request: GenerationRequest, route: Route) -> Tools | None:
    """What the worker needs to parse tool calls out of the output; None when none can come."""
    use = request.tools
    if use is None or (use.choice == "none" and not use.named):
        return None
    if not route.tool_parser:
        raise ApiError(
            400,
            "unsupported_parameter",
            f"'{request.model}' has no tool parser in its manifest, so it cannot call tools; "
            "leave 'tool_choice' out or send \"none\".",
            param="tools",
        )
    return Tools(
        parser=route.tool_parser,
        tools=json.dumps(use.tools),
        choice=use.choice_json,
        parallel=use.parallel,
    )


REFRESH_SECONDS = 0.25

_loads: dict[tuple[str, ...], tuple[float, dict[str, PoolLoad]]] = {}


async def pool_route(route: Route, *, priority: str) -> Route:
    """The route with the pool this request joins as its deployment."""
    if len(route.pools) < 2:
        return route
    names = tuple(p.deployment for p in route.pools)
    cached = _loads.get(names)
    if cached is not None and time.monotonic() - cached[0] < REFRESH_SECONDS:
        loads = cached[1]
    else:
        try:
            loads = await pool_loads(dispatch_get().redis, names)
        except UNREACHABLE:
            return route  # admission meets the same outage and answers 503
        _loads[names] = (time.monotonic(), loads)
    chosen = pool_pick(route.pools, loads, priority=priority)
    if chosen == route.deployment:
        return route
    pool = next(p for p in route.pools if p.deployment == chosen)
    return dataclasses.replace(
        route,
        deployment=pool.deployment,
        max_queued=pool.max_queued,
        max_queued_tokens=pool.max_queued_tokens,
    )
