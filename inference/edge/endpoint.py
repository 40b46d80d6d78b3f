"""What every /v1 endpoint shares: the decorator that answers each failure as an OpenAI
error, what a view reads from its request (body, key, deadline, clock and trace), and a
generating view's one call into the pipeline.

That call is where an Idempotency-Key is honoured, for every API at once: a request with a key
either answers a retry with its first request's answer (marked replayed) or claims the key and
runs; if it is refused, fails or is cancelled before it is running, the key goes back, so that
a retry runs again. A retry that asks for a whole answer while the first request is still
running is told to come back (a stream follows it instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from config.json_body import shown
from dataplane.redis_client import UNREACHABLE
from dataplane.tracing import TraceContext, bind, trace_start
from dataplane.types import Event
from inference.base.errors import ApiError, internal_error, invalid
from inference.base.metrics import RequestClock, requests_total, stream_keepalives
from inference.body.parser import GenerationRequest, body_parse
from inference.edge.asgi import (
    CHECKED_PRINCIPAL,
    COUNTED,
    COUNTS_REQUESTS,
    TURN_OVER,
    LastPart,
    LastPartResponse,
    refusal_held,
    unread_request_count,
)
from inference.pipeline.admission import (
    VERSION_HEADER,
    Submitted,
    key_free,
    ratelimit_headers,
    request_id_new,
)
from inference.pipeline.auth import Principal, authenticate, credentials, scope_check
from inference.pipeline.clients import dispatch_get, idempotency_get, quotas_get, routing_get
from inference.pipeline.collect import Collector, completion_collect
from inference.pipeline.idempotency import MAX_KEY_LENGTH, Original, body_digest, key_in_use
from inference.pipeline.preprocessing import preprocessed
from inference.pipeline.submission import generation_submit

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()
View = Callable[..., Awaitable[HttpResponseBase]]
# Django's stubs type views as sync callables; URL patterns accept async ones at run time.
Routable = Callable[..., Any]
T = TypeVar("T")


def api_endpoint(*methods: str, counted: bool = False) -> Callable[[View], Routable]:
    """Give every response an x-request-id and turn every failure into an OpenAI error.

    A `counted` endpoint's requests count against their tenant's requests per minute: before
    the body is read (inference/edge/asgi.py finds such endpoints in the URL table by this mark),
    or else when `request_principal` authenticates them.
    """

    def decorate(view: View) -> Routable:
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            request_id = request_id_new()
            clock = RequestClock(endpoint=view.__name__)
            trace = trace_start(request.headers.get("traceparent"))
            request.META[_CLOCK] = clock
            request.META[_TRACE] = trace
            request.META[_COUNTED] = counted
            bind(request_id=request_id, trace_id=trace.trace_id)
            try:
                if request.method not in methods:
                    raise ApiError(
                        405,
                        "method_not_allowed",
                        f"{request.method} is not allowed here; use {', '.join(methods)}.",
                        headers={"Allow": ", ".join(methods)},
                    )
                response: HttpResponseBase = await view(request, request_id, *args, **kwargs)
            except ApiError as exc:
                response = exc.response(request.path)
            except UNREACHABLE:
                # The platform, not the client, is at fault, and retrying soon may work: a fast
                # 503 rather than a 500 or a hang (connections time out in seconds).
                log.warning("the queue store is unreachable (%s)", request.path)
                response = ApiError(
                    503,
                    "service_unavailable",
                    "The platform cannot reach its queue store right now; retry shortly.",
                    retry_after=1,
                ).response(request.path)
            except (OperationalError, InterfaceError):
                # PostgreSQL is down or restarting and this request needed what no cache held
                # (a key, route or model list older than its TTL and grace): the same fast 503.
                log.warning("the database is unreachable (%s)", request.path)
                response = ApiError(
                    503,
                    "service_unavailable",
                    "The platform cannot reach its database right now; retry shortly.",
                    retry_after=1,
                ).response(request.path)
            except Exception:
                log.exception("unhandled error in %s", request.path)
                response = internal_error().response(request.path)
            principal = request.META.get(_PRINCIPAL)
            if principal is not None and "x-ratelimit-limit-requests" not in response:
                # Every response to a known tenant says where its limits stand.
                await _add_ratelimit_headers(response, principal)
            if "x-request-id" not in response:
                response["x-request-id"] = request_id
            response["traceparent"] = trace.traceparent
            requests_total.labels(endpoint=view.__name__, code=str(response.status_code)).inc()
            if not isinstance(response, StreamingHttpResponse):
                if clock.dispatched:
                    clock.lap("relay")
                clock.finish()  # a stream's ends when its last chunk is written
            # A refusal is an answer, not a server fault: Django need not log each one (a flood
            # of 503s would otherwise cost a log line apiece). Real faults are logged above.
            response._has_been_logged = True  # type: ignore[attr-defined]
            return response

        setattr(wrapper, COUNTS_REQUESTS, counted)
        return wrapper

    return decorate


def json_response(body: bytes | dict[str, Any], status: int = 200) -> HttpResponse:
    payload = body if isinstance(body, bytes) else _json.encode(body)
    return HttpResponse(payload, status=status, content_type="application/json")


# What a stream sends when it has had nothing to send for a while: an SSE comment, which every
# client's parser skips. /v1/messages sends Anthropic's `ping` event instead.
SSE_KEEPALIVE = b": keep-alive\n\n"


def sse_response(
    chunks: AsyncIterator[bytes], *, keepalive: bytes = SSE_KEEPALIVE
) -> LastPartResponse:
    """A stream of server-sent events, marked so that no proxy caches or buffers it, that sends
    `keepalive` after ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS without an event.

    What the stream makes while its last part is being sent goes out in one write, and its last
    part ends the body in the same write (`kept_alive`, `LastPart`)."""
    seconds = float(settings.ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS)
    last = LastPart()
    chunks = kept_alive(chunks, keepalive=keepalive, seconds=max(seconds, 0.0), last=last)
    response = LastPartResponse(chunks, last=last, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# What a stream's maker may make ahead of its send: a reader that falls behind gets its events
# gathered into writes of about this size, and the stream's events wait in its reply stream.
AHEAD_BYTES = 64 * 1024


async def kept_alive(
    chunks: AsyncIterator[bytes],
    *,
    keepalive: bytes,
    seconds: float,
    last: LastPart | None = None,
) -> AsyncGenerator[bytes, None]:
    """Yield CHUNKS as they come, and KEEPALIVE each time SECONDS pass without one (0: never).

    A queued request or a long prefill sends nothing, and a proxy or load balancer with an
    idle timeout (60 s is common) would cut the stream; the client would retry into a longer
    queue. The chunks are made in a task of their own, and one timer per stream (not one per
    chunk) adds a keep-alive when the stream has been silent for SECONDS and nothing waits.
    Whatever ends this stream (its end, a disconnect, a write timeout) ends that task, which
    closes the generator: its request is cancelled there as before.

    What the task makes before this stream takes it is joined into one part, one write: the
    chunks made in one go (a request's last tokens and its end arrive together) and those made
    while a slow reader's last part was being sent. The task makes up to AHEAD_BYTES ahead, then
    waits for the send. With LAST, the part after which the stream ends says so, for its
    sender to end the body in the same write.
    """
    loop = asyncio.get_running_loop()
    made: list[bytes] = []
    size = 0  # the bytes in `made`
    done = False
    failure: BaseException | None = None
    ready = asyncio.Event()  # something to take: chunks, the end or a failure
    taken = asyncio.Event()  # the stream took what was made
    sent_at = loop.time()  # when the stream last sent something
    timer: asyncio.TimerHandle | None = None

    async def make() -> None:
        nonlocal size, done, failure
        try:
            async for chunk in chunks:
                while size >= AHEAD_BYTES:
                    taken.clear()
                    await taken.wait()
                made.append(chunk)
                size += len(chunk)
                ready.set()
        except BaseException as exc:  # raised again where the stream is sent
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
                raise  # the stream ended and stopped its maker (below)
            # Whatever else ended the chunks, a BaseException too, reaches the stream: a maker
            # that died with it silently left the stream sending keep-alives for ever.
            failure = exc
            ready.set()
            return
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
        done = True
        ready.set()

    def silent() -> None:
        nonlocal timer, size
        now = loop.time()
        if now - sent_at >= seconds and not ready.is_set():
            made.append(keepalive)
            size += len(keepalive)
            ready.set()
            stream_keepalives.inc()
        # Next when this silence would reach the period again; a part waiting for a slow
        # reader needs none: look again a period on.
        timer = loop.call_at(max(sent_at + seconds, now + seconds / 2), silent)

    maker = asyncio.create_task(make())
    if seconds > 0:
        timer = loop.call_at(sent_at + seconds, silent)
    try:
        while True:
            await ready.wait()
            ready.clear()
            part = made[0] if len(made) == 1 else b"".join(made)
            made.clear()
            size = 0
            taken.set()
            if failure is not None:
                if part:
                    yield part
                raise failure
            if done:
                if part:
                    if last is not None:
                        last.reached = True
                    yield part
                return
            yield part
            sent_at = loop.time()
    finally:
        if timer is not None:
            timer.cancel()
        maker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await maker


def pieces_response(pieces: Iterator[bytes], *, content_type: str) -> StreamingHttpResponse:
    """A whole answer sent a piece at a time, each made once the one before was handed on.

    The connection holds one piece, not the answer, while its client reads (a client that
    stops is cut after the write timeout, inference/edge/asgi.py), and a fast client's large answer
    lets other requests run between its pieces.
    """

    async def taken() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
            await asyncio.sleep(0)  # the send did not wait: let others run before the next

    return StreamingHttpResponse(taken(), content_type=content_type)


async def request_body(request: HttpRequest) -> bytes:
    """The request's body, or a 413 when it is larger than the API accepts."""
    length = request.headers.get("Content-Length")
    limit = settings.MAX_REQUEST_BYTES
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, "request_too_large", f"The request body exceeds {limit} bytes.")
    try:
        body = request.body
    except RequestDataTooBig as exc:
        raise ApiError(
            413, "request_too_large", f"The request body exceeds {limit} bytes."
        ) from exc
    if len(body) > limit:
        raise ApiError(413, "request_too_large", f"The request body exceeds {limit} bytes.")
    return body


# Bodies longer than this are parsed, and their fields read, off the event loop: JSON of many
# small values costs about a millisecond every 16 KiB (150 KB of 4,096 messages: 8 ms).
INLINE_BODY_BYTES = 16 * 1024


async def request_json(request: HttpRequest) -> dict[str, Any]:
    """The request's body as a JSON object (see `body_parse`), or the 4xx saying why not."""
    body, _ = await request_read(request, _nothing)
    return body


def _nothing(body: dict[str, Any]) -> None:
    return None


async def request_read(
    request: HttpRequest, read: Callable[[dict[str, Any]], T]
) -> tuple[dict[str, Any], T]:
    """The request's body as a JSON object, and what `read` makes of it (its fields, read and
    checked), or the 4xx saying why not.

    A body over INLINE_BODY_BYTES is parsed and read on the preprocessing threads, in its
    tenant's turn (inference.pipeline.preprocessing), so that a tenant's large or many-valued bodies
    hold no other request's event loop. A large body's reading turn ends here, once it is
    parsed (inference/edge/asgi.py, _turns).
    """
    try:
        raw = await request_body(request)

        def parsed() -> tuple[dict[str, Any], T]:
            body = body_parse(raw)
            return body, read(body)

        if len(raw) <= INLINE_BODY_BYTES:
            return parsed()
        principal = request.META.get(_PRINCIPAL)
        return await preprocessed(principal.tenant_id if principal else 0, parsed)
    finally:
        over = getattr(request, "scope", {}).get(TURN_OVER)
        if over is not None:
            over()


def _timeout(raw: str | None) -> float | None:
    """Return the client's own deadline in seconds (`x-request-timeout`), if it sent one."""
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ApiError(
            400,
            "invalid_value",
            "x-request-timeout must be a positive number of seconds.",
            param="x-request-timeout",
        )
    return seconds


_PRINCIPAL = "roundhouse.principal"
_CLOCK = "roundhouse.clock"
_TRACE = "roundhouse.trace"
_COUNTED = "roundhouse.counted_endpoint"


def request_clock(request: HttpRequest) -> RequestClock:
    clock: RequestClock = request.META[_CLOCK]
    return clock


def request_trace(request: HttpRequest) -> TraceContext:
    trace: TraceContext = request.META[_TRACE]
    return trace


async def request_principal(request: HttpRequest, scope: str) -> Principal:
    """Authenticate a request's API key for a scope; later headers name its limits.

    A request to a counted endpoint (`api_endpoint(counted=True)`) takes its token from the
    tenant's requests per minute here, before its body is parsed, so that it counts (or gets
    its 429) whatever its body holds; unless the handler counted it before its body was read
    (inference/edge/asgi.py).
    """
    scope_of = getattr(request, "scope", {})
    checked = scope_of.get(CHECKED_PRINCIPAL)
    if checked is not None:
        principal = scope_check(checked, scope=scope)  # its key was checked before its body
    else:
        principal = await authenticate(
            credentials(request.headers.get("Authorization"), request.headers.get("x-api-key")),
            scope=scope,
        )
    request.META[_PRINCIPAL] = principal
    if request.META.get(_COUNTED) and not scope_of.get(COUNTED):
        # As the handler counts a body's request: a refusal is remembered a moment, so a flood
        # of reads past the limit costs no round trip each, and held until a retry could pass.
        refusal = await unread_request_count(principal=principal, size=None)
        if refusal is not None:
            raise await refusal_held(principal.tenant_id, refusal)
    clock = request.META.get(_CLOCK)
    if clock is not None:
        clock.lap("auth")
    return principal


async def _add_ratelimit_headers(response: HttpResponseBase, principal: Principal) -> None:
    try:
        decision = await quotas_get().peek(tenant_id=principal.tenant_id, limits=principal.limits)
    except Exception:
        log.warning("could not read the rate-limit state of tenant %s", principal.tenant_slug)
        return
    for name, value in ratelimit_headers(principal.limits, decision).items():
        response[name] = value


def idempotency_key(request: HttpRequest) -> str | None:
    """The request's Idempotency-Key header, or None; a 400 if it is malformed."""
    raw = request.headers.get("Idempotency-Key")
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


def client_timeout(request: HttpRequest, body_timeout: float | None) -> float | None:
    """The sooner of the `x-request-timeout` header and the body's `timeout`, if either."""
    timeouts = [t for t in (_timeout(request.headers.get("x-request-timeout")), body_timeout) if t]
    return min(timeouts, default=None)


MAX_PAGE = 100  # the most objects one page of a list holds


def list_page(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """A page of a list as OpenAI's lists answer: its objects, the first and last ids."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def limit_query(request: HttpRequest, *, default: int = 20, most: int = MAX_PAGE) -> int:
    """A list's `limit`: an integer from 1 to `most`, `default` when not given."""
    raw = request.GET.get("limit")
    if raw is None:
        return default
    # ASCII digits only, and few: "²" is a digit to str.isdigit, and int() refuses it, as it
    # refuses a string of thousands of digits.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(most))) or not (
        1 <= int(raw) <= most
    ):
        raise invalid("limit", f"'limit' must be an integer from 1 to {most}.")
    return int(raw)


def page_query(
    request: HttpRequest, *, default: int = 20, most: int = MAX_PAGE
) -> tuple[int, str, str | None]:
    """A list's query as OpenAI's lists read it: `limit` (1 to 100, 20, unless the list says
    otherwise), `order` (`asc` or `desc`, the default) and `after` (an object's id: the page
    starts past it)."""
    limit = limit_query(request, default=default, most=most)
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "'order' must be 'asc' or 'desc'.")
    return limit, order, request.GET.get("after")


@api_endpoint("GET", "POST", "PUT", "PATCH", "DELETE")
async def not_found(request: HttpRequest, request_id: str, path: str = "") -> HttpResponse:
    raise ApiError(404, "not_found", f"No endpoint {request.method} {shown(request.path)}.")


async def generation_submitted(
    request: HttpRequest,
    *,
    principal: Principal,
    chat: GenerationRequest,
    body: dict[str, Any],
    request_id: str,
    api: str,
    key: str | None,
    replay: Replay,
    before: Callable[[], Awaitable[None]] | None = None,
    refused: Callable[[ApiError], ApiError] | None = None,
) -> Submitted | HttpResponseBase:
    """A generation view's one call into the pipeline: the answer of a retried Idempotency-Key
    again (a response, marked replayed), or the request submitted (routed, tokenised,
    admitted and queued) with the key claimed for it.

    Every API that generates (chat, completions, Responses, Messages) runs through here, so
    the key's choreography is written once: a retry answers with its first request's answer,
    or runs in its place when that failed; whatever refuses, fails or cancels the request
    before it runs frees the key again. `api` names the endpoint its usage record and key's
    original name; `before` runs the view's own last check once the key is claimed (the
    Responses API's storage bound); `refused` renames a refusal into the API's own terms.
    """
    with key_freed_on_failure(tenant_id=principal.tenant_id, key=key, request_id=request_id):
        if key is not None:
            replayed = await replayed_or_claimed(
                principal=principal,
                model=chat.model,
                key=key,
                endpoint=api,
                body=body,
                replay=replay,
                request_id=request_id,
            )
            if replayed is not None:
                return replayed
        if before is not None:
            await before()
        try:
            return await generation_submit(
                principal=principal,
                request=chat,
                request_id=request_id,
                timeout=client_timeout(request, chat.timeout),
                priority=chat.priority,
                idempotency_key=key,
                clock=request_clock(request),
                trace=request_trace(request),
                request_taken=True,
                endpoint=api,
                capping=True,  # its response's headers say so
            )
        except ApiError as exc:
            if refused is None:
                raise
            raise refused(exc) from None


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


async def whole_replayed(events: AsyncIterator[Event], collector: Collector) -> HttpResponse | None:
    """A first request's whole answer again, collected from its reply stream; None when that
    request failed (its retry then runs in its place)."""
    try:
        return json_response(await completion_collect(events, collector, on_end=None))
    except ApiError:
        return None


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
