"""How a request's run that raised ends: each exception to its status and code."""

from __future__ import annotations

import asyncio

from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from dataplane.types import Job, Status
from tests.jobs import job_new
from workers.failures import failure_of


def _job() -> Job:
    return job_new("d")


def test_a_dead_engine_ends_its_requests_as_a_lost_worker_would():
    failure = failure_of(EngineDeadError(), job=_job(), engine="engine")
    assert (failure.status, failure.code) == (Status.WORKER_LOST, "worker_lost")
    assert "died" in failure.message and failure.fatal is None


def test_one_requests_failure_in_a_live_engine_stays_an_engine_error():
    failure = failure_of(EngineGenerateError(), job=_job(), engine="engine")
    assert (failure.status, failure.code) == (Status.ERROR, "engine_error")
    assert failure.message == "the engine failed: EngineGenerateError"


def test_a_cancellation_and_a_deadline_keep_their_own_codes():
    assert failure_of(asyncio.CancelledError(), job=_job(), engine="engine").code == "cancelled"
    assert failure_of(TimeoutError(), job=_job(), engine="engine").code == "deadline_exceeded"
