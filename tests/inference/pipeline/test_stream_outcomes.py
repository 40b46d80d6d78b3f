"""How streamed requests end, as their relay to the client counts them (the stream completion
SLI), against a real Valkey: a worker's side writes the reply stream, the relay reads it."""

from __future__ import annotations

import time
import uuid
from typing import Any, cast

import msgspec
import pytest
from prometheus_client import REGISTRY

from dataplane.finish import Finisher
from dataplane.frontdoor import FrontDoor
from dataplane.redis_client import redis_client_new
from dataplane.types import Delta, Failed, Finished, Job, Status, usage_for
from inference.base.metrics import STREAM_OUTCOMES, stream_outcome
from inference.pipeline import relay
from inference.pipeline.admission import Submitted
from tests.jobs import job_new


def _ended(deployment: str, outcome: str) -> float:
    labels = {"deployment": deployment, "outcome": outcome}
    return REGISTRY.get_sample_value("roundhouse_streams_ended_total", labels) or 0.0


def _submitted(job: Job) -> Submitted:
    # Routing, the principal and admission's decision play no part in relaying.
    none = cast(Any, None)
    return Submitted(job=job, route=none, principal=none, decision=none)


@pytest.fixture
async def redis():
    client = redis_client_new()
    yield client
    await client.aclose()


async def _write(redis: Any, job: Job, terminal: Finished | Failed | None) -> None:
    """Be the worker: one delta, then the terminal event (if any) and its usage."""
    finisher = Finisher(redis, reply_ttl=60)
    await finisher.publish(job=job, events=[Delta(text="hi", tokens=1)])
    if terminal is None:
        return
    status = Status.OK if isinstance(terminal, Finished) else Status.WORKER_LOST
    usage = usage_for(job, status=status, finished_at=time.time())
    assert await finisher.finalize(job=job, terminal=terminal, usage=usage)


def _deployment() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


async def test_a_stream_that_finishes_counts_as_completed(redis):
    deployment = _deployment()
    job = job_new(deployment)
    await _write(redis, job, Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=1))
    seen = [e async for e in relay.events(FrontDoor(redis, reply_ttl=60), _submitted(job))]
    assert isinstance(seen[-1], Finished)
    assert _ended(deployment, "completed") == 1
    assert sum(_ended(deployment, o) for o in STREAM_OUTCOMES) == 1


async def test_a_stream_cut_by_a_lost_worker_counts_as_worker_lost(redis):
    deployment = _deployment()
    job = job_new(deployment)
    lost = Failed(code="worker_lost", message="gone", prompt_tokens=3, completion_tokens=1)
    await _write(redis, job, lost)
    seen = [e async for e in relay.events(FrontDoor(redis, reply_ttl=60), _submitted(job))]
    assert isinstance(seen[-1], Failed)
    assert _ended(deployment, "worker_lost") == 1
    assert _ended(deployment, "completed") == 0


async def test_a_client_that_leaves_mid_stream_counts_as_gone(redis):
    deployment = _deployment()
    job = job_new(deployment)
    await _write(redis, job, None)
    events = relay.events(FrontDoor(redis, reply_ttl=60), _submitted(job))
    assert isinstance(await anext(events), Delta)
    await cast(Any, events).aclose()  # the client disconnected
    assert _ended(deployment, "client_gone") == 1


async def test_a_request_nobody_streams_is_not_counted(redis):
    deployment = _deployment()
    job = msgspec.structs.replace(job_new(deployment), stream=False)
    await _write(redis, job, Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=1))
    [e async for e in relay.events(FrontDoor(redis, reply_ttl=60), _submitted(job))]
    assert sum(_ended(deployment, o) for o in STREAM_OUTCOMES) == 0


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (None, "completed"),
        ("engine_error", "error"),
        ("worker_lost", "worker_lost"),
        ("deadline_exceeded", "timeout"),
        ("timeout", "timeout"),
        ("relay_failed", "relay_failed"),
        ("cancelled", "cancelled"),
        ("invalid_request", "rejected"),
        ("a_code_added_later", "rejected"),
    ],
)
def test_every_end_maps_to_one_of_the_bounded_outcomes(code, outcome):
    assert stream_outcome(code) == outcome
    assert outcome in STREAM_OUTCOMES
