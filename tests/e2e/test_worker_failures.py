"""Workers that stop: a drained worker finishes its streams, a killed one never strands a client.

These start their own worker for their own deployment so the shared one keeps serving.
"""

from __future__ import annotations

import json
import os
import signal
from decimal import Decimal

import httpx
import pytest

from models_registry.models import ModelVersion
from models_registry.services import deployment_create, model_version_register
from tests.conftest import _spawn, _wait_for

DEPLOYMENT = "fragile"


@pytest.fixture(scope="module")
def fragile(world, django_db_blocker, demo_model_dir) -> ModelVersion:
    with django_db_blocker.unblock():
        # Another price makes another version, so this model routes only to its own workers.
        version, _ = model_version_register(
            model_name="fragile-llama", source_dir=demo_model_dir, price_input_per_1k=Decimal(2)
        )
        deployment_create(
            name=DEPLOYMENT,
            version=version,
            max_num_seqs=8,
            max_model_len=2048,
            kv_cache_bytes=32 << 20,
            enforce_eager=True,
        )
    return version


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
        events = _payloads([first, *lines])
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "worker_lost"
    [record] = usage_of(request_id)
    assert record.status == "worker_lost"
    assert record.completion_tokens > 0

    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        response = client.post(
            "/v1/completions",
            json={"model": fragile.public_name, "prompt": "x", "max_tokens": 2},
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unavailable"
    assert int(response.headers["Retry-After"]) > 0
