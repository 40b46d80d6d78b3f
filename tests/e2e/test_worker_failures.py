"""Workers that stop: a drained worker finishes its streams, a killed one never strands a client.

These start their own worker for their own deployment so the shared one keeps serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import time
from decimal import Decimal

import httpx
import pytest

from dataplane.redis_client import redis_client_new, redis_sync_client
from models_registry.models import ModelVersion
from tests.conftest import _spawn, _wait_for, own_deployment
from tests.dataplane.roles import roles

DEPLOYMENT = "fragile"


@pytest.fixture(scope="module")
def fragile(world, django_db_blocker, demo_model_dir) -> ModelVersion:
    with django_db_blocker.unblock():
        return own_deployment(DEPLOYMENT, "fragile-llama", Decimal(2), demo_model_dir)


def _start_worker(tmp_path, name: str):
    worker = _spawn(name, ["manage.py", "run_worker", "--deployment", DEPLOYMENT], tmp_path)
    _wait_for(worker, lambda: "ready: serving" in worker.tail(400), timeout=600)
    return worker


def _stream(client: httpx.Client, world, version: ModelVersion, max_tokens: int):
    return client.stream(
        "POST",
        "/v1/completions",
        json={
            "model": version.public_name,
            "prompt": "Once upon a time",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        },
        # globex keeps the default per-request cap (1024); acme's is lowered for other tests.
        headers={"Authorization": f"Bearer {world.globex_key}"},
    )


def _payloads(lines) -> list:
    return [
        line[6:] if line == "data: [DONE]" else json.loads(line[6:])
        for line in lines
        if line.startswith("data: ")
    ]


def test_a_draining_worker_finishes_the_streams_it_started(stack, world, fragile, tmp_path):
    worker = _start_worker(tmp_path, "draining-worker")
    with (
        httpx.Client(base_url=stack.base_url, timeout=120) as client,
        _stream(client, world, fragile, max_tokens=400) as response,
    ):
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        worker.popen.send_signal(signal.SIGTERM)
        events = _payloads([first, *lines])
    assert events[-1] == "[DONE]"
    assert "error" not in events[-2], f"{events[-2]}\n{worker.tail(60)}"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert worker.popen.wait(timeout=60) == 0


def test_a_killed_worker_ends_its_streams_with_an_error_and_bills_them(
    stack, world, fragile, tmp_path, usage_of
):
    worker = _start_worker(tmp_path, "doomed-worker")
    with (
        httpx.Client(base_url=stack.base_url, timeout=120) as client,
        _stream(client, world, fragile, max_tokens=1000) as response,
    ):
        request_id = response.headers["x-request-id"]
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        os.killpg(worker.popen.pid, signal.SIGKILL)
        killed = time.monotonic()
        events = _payloads([first, *lines])
        told = time.monotonic() - killed
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "worker_lost"
    # The lease (3 s here) lapses and the reaper, which looks every second, ends the request.
    print(f"the client was told its worker was lost {told:.1f} s after the kill")
    assert told < 5.0
    [record] = usage_of(request_id)
    assert record.status == "worker_lost"
    assert record.completion_tokens > 0
    # Billed once for what it produced, and its reservation settled.
    store = redis_sync_client()
    deadline = time.monotonic() + 30
    while store.exists(f"sy:{{t{world.globex.pk}}}:held:{request_id}"):
        assert time.monotonic() < deadline, "the killed request's reservation stayed open"
        time.sleep(0.2)
    assert not store.zscore(f"sy:{{t{world.globex.pk}}}:inflight", request_id)

    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        response = client.post(
            "/v1/completions",
            json={"model": fragile.public_name, "prompt": "x", "max_tokens": 2},
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_a_job_a_dead_worker_claimed_but_never_started_runs_on_another_worker(
    stack, world, fragile, tmp_path, usage_of
):
    """A worker that dies between claiming and starting a job strands nothing.

    The dead worker is this test speaking the worker's side of the protocol (a heartbeat, then
    one claim), then falling silent as a SIGKILLed process does, at the one moment a real
    worker cannot be stopped at on purpose. The reaper (in the ingester) takes the job back
    once its lease lapses, and a real worker started afterwards runs it.
    """
    ghost = "ghost-worker"

    async def beat() -> None:
        dispatch = roles(redis_client_new())
        try:
            await dispatch.leases.heartbeat(
                deployment=DEPLOYMENT, worker=ghost, ttl=5.0, slots=(1, 0)
            )
        finally:
            await dispatch.redis.aclose()

    async def claim_then_die() -> list[str]:
        dispatch = roles(redis_client_new())
        try:
            await dispatch.leases.heartbeat(
                deployment=DEPLOYMENT, worker=ghost, ttl=2.0, slots=(1, 0)
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                claimed = await dispatch.leases.claim(
                    deployment=DEPLOYMENT, count=1, lease_seconds=2.0, worker=ghost
                )
                if claimed.run:
                    return [job.request_id for job in claimed.run]
                await dispatch.leases.heartbeat(deployment=DEPLOYMENT, worker=ghost, ttl=2.0)
                await asyncio.sleep(0.05)
            return []
        finally:
            await dispatch.redis.aclose()

    body = {"model": fragile.public_name, "prompt": "Once", "max_tokens": 16, "ignore_eos": True}
    with (
        httpx.Client(base_url=stack.base_url, timeout=180) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        # Alive before the request arrives, so the request is queued for it (with no live
        # worker it would be refused with 503 model_unavailable).
        asyncio.run(beat())
        asked = pool.submit(
            client.post,
            "/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {world.globex_key}"},
        )
        # The ghost is the deployment's only live worker, so the request waits for it.
        taken = asyncio.run(claim_then_die())
        assert len(taken) == 1, "the ghost never got the job"
        worker = _start_worker(tmp_path, "heir-worker")
        try:
            response = asked.result(timeout=180)
        finally:
            worker.popen.send_signal(signal.SIGTERM)
            worker.popen.wait(timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == taken[0]
    assert response.json()["usage"]["completion_tokens"] == 16
    [record] = usage_of(taken[0])
    assert (record.status, record.completion_tokens) == ("ok", 16)
