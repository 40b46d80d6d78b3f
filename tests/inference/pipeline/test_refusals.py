"""The 503s a deployment's queue answers with: status, code and Retry-After."""

from __future__ import annotations

import time

from dataplane.frontdoor import Refusal, Refused
from dataplane.types import Job, Sampling
from inference.pipeline.admission import refusal_error


def _job(seconds: float) -> Job:
    now = time.time()
    return Job(
        request_id="r",
        tenant_id=1,
        api_key_id=1,
        deployment="d",
        model_version="v",
        endpoint="completions",
        prompt_token_ids=[1],
        sampling=Sampling(max_tokens=1),
        enqueued_at=now,
        deadline=now + seconds,
    )


def test_each_refusal_has_its_own_code_and_a_retry_after():
    cases = {
        Refusal.NO_WORKER: "model_unavailable",
        Refusal.QUEUE_FULL: "queue_full",
        Refusal.DEADLINE_UNATTAINABLE: "deadline_unattainable",
    }
    for reason, code in cases.items():
        error = refusal_error(Refused(reason, 12_000), model="m", job=_job(2.0))
        response = error.response()
        assert (response.status_code, error.code) == (503, code)
        assert int(response["Retry-After"]) >= 1
        assert int(response["retry-after-ms"]) >= 1000


def test_an_unattainable_deadline_says_how_long_the_wait_is():
    error = refusal_error(
        Refused(Refusal.DEADLINE_UNATTAINABLE, estimated_wait_ms=12_000), model="m", job=_job(2)
    )
    assert "12.0 s" in error.message and "2.0 s" in error.message
    assert error.retry_after == 10
