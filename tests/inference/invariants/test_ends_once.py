"""Every admitted request ends exactly once, whatever raises after its admission.

Real Valkey and PostgreSQL, the real API views and WebSocket consumer in-process, a real
worker loop and the real ingester steps. The engine is a stand-in that streams a few tokens:
it is the boundary where the worker stage's failures are injected. Each request runs on a
deployment of its own test, so nothing else claims or ingests its jobs.

The four facts checked after each failure: the tenant's reservation is settled (no held
reservation, spend moved by exactly what the usage record costs), its concurrency slot is free,
the client got one terminal event, and exactly one usage record exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
import redis.asyncio as redis
from asgiref.testing import ApplicationCommunicator
from channels.routing import URLRouter
from django.test import AsyncClient
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from billing.ingester import Ingester
from billing.models import UsageRecord
from billing.services import IngestResult, usage_ingest
from dataplane.frontdoor import FrontDoor
from dataplane.quotas import MICROS, Quotas, month_of
from dataplane.redis_client import redis_client_new
from dataplane.types import Sampling
from inference.chat.format import Formatter
from inference.edge import endpoint
from inference.pipeline import submission
from inference.pipeline.idempotency import Idempotency
from inference.urls import websocket_urlpatterns
from inference.websocket import views as ws
from models_registry.selectors import Routing
from tenants.models import Tenant
from tenants.services import api_key_issue, tenant_create
from tests.conftest import ALIAS
from tests.dataplane.roles import Roles, roles
from workers import generative
from workers.engine import AdapterRef, Step
from workers.generative import GenerativeWorker

pytestmark = pytest.mark.django_db

TOKENS = 4


# Far past what a scenario takes (a second or two): only a hang reaches it.
SCENARIO_SECONDS = 120


class Boom(BaseException):
    """A failure that is not an Exception: no `except Exception` catches it."""


FAILURES: list[type[BaseException]] = [
    ValueError,
    KeyError,
    RuntimeError,
    ZeroDivisionError,
    UnicodeEncodeError,
    Boom,
    asyncio.CancelledError,  # at the stages where a cancel can land (see the test)
]


def _failure(kind: type[BaseException]) -> BaseException:
    if kind is UnicodeEncodeError:
        return UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
    return kind("injected")


@dataclasses.dataclass(frozen=True)
class Lane:
    """A tenant and a deployment that only this module's requests use."""

    tenant_id: int
    key: str
    deployment: str


@pytest.fixture(scope="module")
def tenant(world: Any, django_db_blocker: Any) -> tuple[int, str]:
    with django_db_blocker.unblock():
        created: Tenant = tenant_create(slug=f"ends-once-{uuid.uuid4().hex[:6]}")
        return created.pk, api_key_issue(tenant=created, name="tests").token


@pytest.fixture
def lane(tenant: tuple[int, str], monkeypatch: pytest.MonkeyPatch) -> Lane:
    deployment = f"ends-{uuid.uuid4().hex[:8]}"
    real_routing_get = submission.routing_get

    async def routing_get(name: str, *, principal: Any) -> Routing:
        routing = await real_routing_get(name, principal=principal)
        return Routing(primary=dataclasses.replace(routing.primary, deployment=deployment))

    monkeypatch.setattr(submission, "routing_get", routing_get)
    return Lane(tenant_id=tenant[0], key=tenant[1], deployment=deployment)


class _Engine:
    """Streams TOKENS tokens a few milliseconds apart; `fail` raises at a chosen step."""

    prefix_caching = False

    def __init__(self) -> None:
        self.fail: tuple[int, BaseException] | None = None

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        adapter: AdapterRef | None = None,
        cache_salt: str = "",
        prompt_ranked: bool = True,
        priority: int = 0,
    ) -> AsyncIterator[Step]:
        for index in range(TOKENS):
            if self.fail is not None and self.fail[0] == index:
                raise self.fail[1]
            await asyncio.sleep(0.005)
            last = index == TOKENS - 1
            yield Step(
                text=" yard",
                tokens=1,
                finish_reason="length" if last else None,
                prompt_tokens=len(prompt_token_ids),
            )

    async def health(self) -> None:
        return None

    def kv_cache_usage(self) -> float | None:
        return 0.0


class _Ingester(Ingester):
    """The real ingester, writing on the test's own connection (so its transaction holds)."""

    async def _record(self, entries: list) -> IngestResult:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        try:
            return usage_ingest(events=[event for _, _, event in entries])
        finally:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@contextlib.asynccontextmanager
async def _worker(lane: Lane, engine: _Engine) -> AsyncIterator[Roles]:
    """A live worker of the lane's deployment for the length of the block."""
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    worker = GenerativeWorker(
        deployment=lane.deployment,
        engine=engine,  # type: ignore[arg-type]
        client=dispatch.redis,
        reply_ttl=dispatch.reply_ttl,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        capacity=4,
        lease_seconds=10,
        drain_seconds=5,
    )
    ready = asyncio.Event()

    async def on_ready() -> None:
        ready.set()

    task = asyncio.create_task(worker.run(on_ready=on_ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield dispatch
    finally:
        worker.drain()
        await asyncio.wait_for(task, 20)
        await client.aclose()


def _keys(lane: Lane, request_id: str) -> tuple[str, str, str]:
    tag = f"sy:{{t{lane.tenant_id}}}"
    return f"{tag}:held:{request_id}", f"{tag}:inflight", f"{tag}:spent:{month_of(time.time())}"


async def _spent(dispatch: Roles, lane: Lane) -> int:
    return int(await dispatch.redis.get(_keys(lane, "")[2]) or 0)


async def _ended_once(
    dispatch: Roles, lane: Lane, request_ids: list[str], spent_before: int
) -> None:
    """Ingest the lane's usage until its requests have settled; check the four facts' three."""
    ingester = _Ingester(client=dispatch.redis, reply_ttl=dispatch.reply_ttl, consumer="ends-once")
    await dispatch.usage.ensure_groups(lane.deployment)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 15
    while True:
        entries = await dispatch.usage.read_usage(
            deployments=[lane.deployment], consumer="ends-once", count=100, block_ms=50
        )
        if entries:
            for _, _, event in entries:
                seen[event.request_id] = seen.get(event.request_id, 0) + 1
            await ingester._ingest(entries)
        held = [await dispatch.redis.exists(_keys(lane, rid)[0]) for rid in request_ids]
        if all(rid in seen for rid in request_ids) and not any(held):
            break
        assert time.monotonic() < deadline, f"not settled: usage {seen}, held {held}"
    await asyncio.sleep(0.3)  # anything written twice would have arrived by now
    for _, _, event in await dispatch.usage.read_usage(
        deployments=[lane.deployment], consumer="ends-once", count=100, block_ms=10
    ):
        seen[event.request_id] = seen.get(event.request_id, 0) + 1
    assert {rid: seen.get(rid) for rid in request_ids} == dict.fromkeys(request_ids, 1)
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        records = list(UsageRecord.objects.filter(request_id__in=request_ids))
    finally:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    assert sorted(r.request_id for r in records) == sorted(request_ids)
    inflight = _keys(lane, "")[1]
    for rid in request_ids:
        assert await dispatch.redis.zscore(inflight, rid) is None, "the slot is still taken"
    # Settled to what was billed: the spend moved by the records' costs, nothing held back.
    billed = sum(math.ceil(r.cost * MICROS) for r in records)
    assert abs(await _spent(dispatch, lane) - spent_before - billed) <= len(records)


def _recording_ids(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []

    def request_id_new() -> str:
        made.append(uuid.uuid4().hex)
        return made[-1]

    monkeypatch.setattr(endpoint, "request_id_new", request_id_new)
    monkeypatch.setattr(ws, "request_id_new", request_id_new)
    return made


def _inject(
    monkeypatch: pytest.MonkeyPatch, stage: str, failure: BaseException, engine: _Engine
) -> None:
    """Make one stage after admission raise `failure` (once)."""
    raised: list[bool] = []

    def once() -> None:
        if not raised:
            raised.append(True)
            raise failure

    if stage == "before enqueue":
        real_enqueue = FrontDoor.enqueue

        async def enqueue(self: FrontDoor, *args: Any, **kwargs: Any) -> Any:
            once()
            return await real_enqueue(self, *args, **kwargs)

        monkeypatch.setattr(FrontDoor, "enqueue", enqueue)
    elif stage == "after enqueue":
        real_enqueue = FrontDoor.enqueue

        async def enqueue_then_fail(self: FrontDoor, *args: Any, **kwargs: Any) -> Any:
            refused = await real_enqueue(self, *args, **kwargs)
            once()  # queued, but the frontend never learns it
            return refused

        monkeypatch.setattr(FrontDoor, "enqueue", enqueue_then_fail)
    elif stage == "idempotency queued":
        # Queued, then failing to mark its Idempotency-Key's record queued.
        real_queued = Idempotency.queued

        async def queued(self: Idempotency, **kwargs: Any) -> None:
            await real_queued(self, **kwargs)
            once()

        monkeypatch.setattr(Idempotency, "queued", queued)
    elif stage == "relay":
        # Formatting a token for the client (SSE, WebSocket) or the whole body (JSON).
        real_chunk, real_complete = Formatter.chunk, Formatter.complete

        def chunk(self: Formatter, *args: Any, **kwargs: Any) -> bytes | None:
            once()
            return real_chunk(self, *args, **kwargs)

        def complete(self: Formatter, *args: Any, **kwargs: Any) -> bytes:
            once()
            return real_complete(self, *args, **kwargs)

        monkeypatch.setattr(Formatter, "chunk", chunk)
        monkeypatch.setattr(Formatter, "complete", complete)
        real_send = ws.GenerationConsumer._send

        async def send(self: ws.GenerationConsumer, message: dict[str, Any]) -> None:
            if message["type"] == "delta":
                once()
            await real_send(self, message)

        monkeypatch.setattr(ws.GenerationConsumer, "_send", send)
    elif stage == "engine":
        engine.fail = (1, failure)
    elif stage == "worker end":
        real_usage_for = generative.usage_for

        def usage_for(*args: Any, **kwargs: Any) -> Any:
            once()
            return real_usage_for(*args, **kwargs)

        monkeypatch.setattr(generative, "usage_for", usage_for)
    else:
        raise AssertionError(stage)


async def _holds_nothing(
    dispatch: Roles, lane: Lane, request_id: str, spent_before: int, *, within: float = 0
) -> None:
    """Check that a request holds no reservation (within `within` seconds), no concurrency
    slot, and moved the month's spend by nothing."""
    held, inflight, _ = _keys(lane, request_id)
    deadline = time.monotonic() + within
    while await dispatch.redis.exists(held):
        assert time.monotonic() < deadline, "the reservation is still held"
        await asyncio.sleep(0.05)
    assert await dispatch.redis.zscore(inflight, request_id) is None
    assert await _spent(dispatch, lane) == spent_before


async def _chat(lane: Lane, idempotency_key: str | None = None) -> Any:
    """Post a short chat as the lane's tenant, with an Idempotency-Key if one is given."""
    headers = {"Authorization": f"Bearer {lane.key}"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return await AsyncClient().post(
        "/v1/chat/completions", _body(False), content_type="application/json", headers=headers
    )


def _body(stream: bool) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": TOKENS,
        "stream": stream,
    }


async def _over_http(lane: Lane, stream: bool, idempotent: bool) -> list[str]:
    """Send one request; return the terminal events the client got.

    What escapes a view entirely (a BaseException) is answered by the ASGI server, not the
    view: counted as the one terminal "raised"; so is a cancel, whose client is gone.
    """
    headers = {"Authorization": f"Bearer {lane.key}"}
    if idempotent:
        headers["Idempotency-Key"] = uuid.uuid4().hex
    chunks: list[bytes] = []
    try:
        response = await AsyncClient().post(
            "/v1/chat/completions", _body(stream), content_type="application/json", headers=headers
        )
        if not response.streaming:
            body = response.json()
            assert ("error" in body) != ("choices" in body), body
            return ["error" if "error" in body else "finished"]
        async for chunk in response.streaming_content:  # type: ignore[attr-defined]
            chunks.append(chunk)
    except (Boom, asyncio.CancelledError):
        if not chunks:
            return ["raised"]
    events = [
        line[6:] for line in b"".join(chunks).decode().split("\n") if line.startswith("data: ")
    ]
    assert events and events[-1] == "[DONE]", events
    ends = [e for e in events[:-1] if '"error"' in e or '"finish_reason":"' in e]
    assert len(ends) == 1, events  # one finish or one error, then [DONE]
    return ["error" if '"error"' in ends[0] else "finished"]


async def _over_websocket(lane: Lane) -> list[str]:
    scope = {
        "type": "websocket",
        "path": "/v1/ws",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {lane.key}".encode())],
        "subprotocols": [],
    }
    socket = ApplicationCommunicator(URLRouter(websocket_urlpatterns), scope)
    await socket.send_input({"type": "websocket.connect"})
    assert (await socket.receive_output(timeout=10))["type"] == "websocket.accept"
    request = {"type": "request", "id": "one", "endpoint": "chat.completions", "body": _body(True)}
    await socket.send_input({"type": "websocket.receive", "text": json.dumps(request)})
    terminals: list[str] = []
    while not terminals:
        message = json.loads((await socket.receive_output(timeout=10))["text"])
        if message["type"] in ("finished", "error"):
            terminals.append(message["type"])
    # Nothing more for this id: a second terminal frame would arrive now.
    while not await socket.receive_nothing(timeout=0.3):
        message = json.loads((await socket.receive_output(timeout=1))["text"])
        terminals.append(message["type"])
    await socket.send_input({"type": "websocket.disconnect", "code": 1000})
    with contextlib.suppress(BaseException):
        await socket.wait(timeout=5)
    return terminals


STAGES = ["before enqueue", "after enqueue", "idempotency queued", "relay", "engine", "worker end"]


async def _scenario(
    lane: Lane, monkeypatch: pytest.MonkeyPatch, stage: str, kind: type[BaseException], how: str
) -> None:
    engine = _Engine()
    made = _recording_ids(monkeypatch)
    async with _worker(lane, engine) as dispatch:
        spent_before = await _spent(dispatch, lane)
        with monkeypatch.context() as patch:
            _inject(patch, stage, _failure(kind), engine)
            if how == "websocket":
                terminals = await _over_websocket(lane)
            else:
                terminals = await _over_http(
                    lane, stream=how == "sse", idempotent=stage == "idempotency queued"
                )
        assert len(terminals) == 1, terminals
        await _ended_once(dispatch, lane, made, spent_before)


@pytest.mark.parametrize("stage", STAGES)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    kind=st.sampled_from(FAILURES),
    how=st.sampled_from(["json", "sse", "websocket"]),
)
def test_every_admitted_request_ends_exactly_once_whatever_raises(
    lane, monkeypatch, stage, kind, how
):
    # A cancel lands where the frontend awaits its client or the engine; the WebSocket takes
    # no Idempotency-Key.
    assume(kind is not asyncio.CancelledError or stage in ("relay", "engine"))
    if how == "websocket" and stage == "idempotency queued":
        how = "sse"
    asyncio.run(_bounded(_scenario(lane, monkeypatch, stage, kind, how)))


async def _bounded(scenario: Coroutine[Any, Any, None]) -> None:
    """Run a scenario, failing with every task's stack if it has not ended in time.

    pytest-timeout's alarm raises wherever the loop happens to be, and code that turns a
    failure into an error event may take it for the injected one: a scenario that hung then
    stalled the whole session instead of failing.
    """
    task = asyncio.ensure_future(scenario)
    done, _ = await asyncio.wait([task], timeout=SCENARIO_SECONDS)
    if not done:
        stacks = io.StringIO()
        for other in asyncio.all_tasks():
            if other is not asyncio.current_task():
                other.print_stack(file=stacks)
        task.cancel()
        pytest.fail(f"the scenario did not end in {SCENARIO_SECONDS} s:\n{stacks.getvalue()}")
    task.result()


def _raise_at_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finding's failure where it happened: the job envelope, encoded after admission."""

    async def enqueue(self: FrontDoor, *args: Any, **kwargs: Any) -> Any:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(FrontDoor, "enqueue", enqueue)


def test_a_job_that_cannot_be_queued_frees_its_slot_and_reservation(lane, monkeypatch):
    async def scenario() -> None:
        made = _recording_ids(monkeypatch)
        async with _worker(lane, _Engine()) as dispatch:
            spent_before = await _spent(dispatch, lane)
            with monkeypatch.context() as patch:
                _raise_at_enqueue(patch)
                response = await _chat(lane)
            assert response.status_code == 500
            assert response.json()["error"]["code"] == "internal_error"
            await _ended_once(dispatch, lane, made, spent_before)
            assert await _spent(dispatch, lane) == spent_before  # nothing billed

    asyncio.run(scenario())


def test_a_websocket_request_that_cannot_be_queued_gets_an_error_frame(lane, monkeypatch):
    async def scenario() -> None:
        made = _recording_ids(monkeypatch)
        async with _worker(lane, _Engine()) as dispatch:
            spent_before = await _spent(dispatch, lane)
            with monkeypatch.context() as patch:
                _raise_at_enqueue(patch)
                terminals = await _over_websocket(lane)
            assert terminals == ["error"]
            await _ended_once(dispatch, lane, made, spent_before)

    asyncio.run(scenario())


def test_text_the_queue_cannot_encode_is_a_400_that_reserves_nothing(lane, monkeypatch):
    def encode(message: Any) -> bytes:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    async def scenario() -> None:
        made = _recording_ids(monkeypatch)
        async with _worker(lane, _Engine()) as dispatch:
            spent_before = await _spent(dispatch, lane)
            with monkeypatch.context() as patch:
                patch.setattr(submission, "encode", encode)
                response = await _chat(lane)
            assert response.status_code == 400, response.content
            assert response.json()["error"]["code"] == "invalid_value"
            await _holds_nothing(dispatch, lane, made[0], spent_before)

    asyncio.run(scenario())


@pytest.mark.parametrize("lost", [redis.ConnectionError, asyncio.CancelledError])
def test_an_admission_whose_answer_is_lost_gives_back_what_it_took(lane, monkeypatch, lost):
    """The admission script ran, then Redis went away (or the client did) before its answer
    came: the frontend cannot know it was admitted, so it gives back whatever it may hold."""
    admit = Quotas.admit

    async def ran_then_lost(self: Quotas, **kwargs: Any) -> Any:
        decision = await admit(self, **kwargs)
        if decision is None:
            return None  # the month's spend is read from PostgreSQL first: no script ran yet
        assert decision.admitted
        raise lost("the answer was lost")

    async def scenario() -> None:
        made = _recording_ids(monkeypatch)
        async with _worker(lane, _Engine()) as dispatch:
            spent_before = await _spent(dispatch, lane)
            with monkeypatch.context() as patch:
                patch.setattr(Quotas, "admit", ran_then_lost)
                try:
                    response = await _chat(lane)
                except asyncio.CancelledError:
                    assert lost is asyncio.CancelledError
                else:
                    assert lost is redis.ConnectionError
                    assert response.status_code == 503, response.content
            # Given back in the background, as the refusal is answered.
            await _holds_nothing(dispatch, lane, made[0], spent_before, within=10)

    asyncio.run(scenario())


def test_a_key_claim_whose_answer_is_lost_leaves_the_key_free_for_the_retry(lane, monkeypatch):
    """The Idempotency-Key's claim ran, then Redis went away before its answer came: the
    client's retry with the same key runs, rather than being told the key is in use."""
    begin = Idempotency.begin

    async def ran_then_lost(self: Idempotency, **kwargs: Any) -> Any:
        assert await begin(self, **kwargs) is None  # claimed for this request
        raise redis.ConnectionError("the answer was lost")

    async def scenario() -> None:
        key = uuid.uuid4().hex
        async with _worker(lane, _Engine()):
            with monkeypatch.context() as patch:
                patch.setattr(Idempotency, "begin", ran_then_lost)
                lost = await _chat(lane, key)
            assert lost.status_code == 503, lost.content
            deadline = time.monotonic() + 10
            while True:
                retry = await _chat(lane, key)
                if retry.status_code != 409 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert retry.status_code == 200, retry.content

    asyncio.run(scenario())
