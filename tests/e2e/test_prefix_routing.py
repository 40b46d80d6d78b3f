"""Prefix caching and prefix-aware routing with two real workers of one deployment.

Two more workers run next to the session's, both serving `tiny-prefix`, a version of the demo
model with prefix caching on (the default). Requests sharing a long system prompt should all
be served by one of them, whichever claims them, and its engine should reuse the prompt's KV
cache; requests with prompts of their own spread over both.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dataplane.frontdoor import PREFIX_TOKENS
from tests.conftest import CONTEXT, Process, _free_port, _spawn, _wait_for

DEPLOYMENT = "tiny-prefix"
MODEL = "tiny-llama@prefix"
# About 300 tokens of the demo model's tokenizer: two of vLLM's 128-token blocks on CPU.
SYSTEM_PROMPT = "You are the roundhouse's dispatcher. " + " ".join(
    f"Track {i} holds the {['red', 'blue', 'green'][i % 3]} freight cars." for i in range(17)
)


@dataclass(frozen=True)
class Replicas:
    workers: tuple[Process, Process]


@pytest.fixture(scope="module")
def replicas(
    stack: Any,
    demo_model_dir: Path,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replicas]:
    from models_registry.services import deployment_create, model_version_register

    with django_db_blocker.unblock():
        version, _ = model_version_register(
            model_name="tiny-llama",
            source_dir=demo_model_dir,
            label="prefix",
            sampling_defaults={"top_p": 0.9971},  # content of its own: a version of its own
        )
        deployment_create(
            name=DEPLOYMENT,
            version=version,
            max_num_seqs=8,
            max_model_len=CONTEXT,
            kv_cache_bytes=32 << 20,
            enforce_eager=True,
        )
    logs = tmp_path_factory.mktemp("prefix-logs")
    workers = []
    for name in ("worker-prefix-1", "worker-prefix-2"):
        port = _free_port()
        worker = _spawn(
            name,
            ["manage.py", "run_worker", "--deployment", DEPLOYMENT, "--metrics-port", str(port)],
            logs,
        )
        worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
        workers.append(worker)
    try:
        for worker in workers:
            _wait_for(worker, lambda w=worker: "ready: serving" in w.tail(400), timeout=600)
        yield Replicas(workers=(workers[0], workers[1]))
    finally:
        for worker in workers:
            if worker.popen.poll() is None:
                worker.popen.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.popen.kill()


def _counter(process: Process, name: str, **labels: str) -> float:
    """The sum of a worker's samples of a series whose labels include these."""
    text = httpx.get(process.metrics_url, timeout=10).text
    wanted = {"deployment": DEPLOYMENT, **labels}.items()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= sample.labels.items()
    )


def _served(replicas: Replicas, since: list[float] | None = None) -> list[float]:
    """Requests each replica served (since an earlier reading)."""
    now = [_counter(w, "roundhouse_worker_requests_total", status="ok") for w in replicas.workers]
    return [n - b for n, b in zip(now, since or [0.0] * len(now), strict=True)]


def _ask(base_url: str, key: str, system: str, question: str) -> str:
    """Send one chat completion; return its request id."""
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
    }
    with httpx.Client(base_url=base_url, timeout=120) as client:
        response = client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


def test_requests_sharing_a_system_prompt_meet_on_one_replica_and_hit_its_cache(
    replicas, stack, world, usage_of
):
    served_before = _served(replicas)
    hits_before = [_counter(w, "vllm:prefix_cache_hits_total") for w in replicas.workers]
    queries_before = [_counter(w, "vllm:prefix_cache_queries_total") for w in replicas.workers]
    ids = [
        _ask(stack.base_url, world.acme_key, SYSTEM_PROMPT, f"Which track is {i} on?")
        for i in range(12)
    ]
    records = usage_of(*ids)
    assert len(records) == 12 and all(r.status == "ok" for r in records)
    assert all(r.prompt_tokens > 2 * PREFIX_TOKENS for r in records), "prompt too short"
    served = _served(replicas, since=served_before)
    assert sorted(served) == [0, 12], served
    one = served.index(12)
    # Its engine computed the system prompt once and reused its blocks for the other eleven.
    hits = _counter(replicas.workers[one], "vllm:prefix_cache_hits_total") - hits_before[one]
    queries = (
        _counter(replicas.workers[one], "vllm:prefix_cache_queries_total") - queries_before[one]
    )
    assert hits >= 11 * 2 * PREFIX_TOKENS, (hits, queries)
    assert sum(r.cached_tokens > 0 for r in records) >= 11


def test_requests_with_prompts_of_their_own_spread_over_both_replicas(
    replicas, stack, world, usage_of
):
    served_before = _served(replicas)
    ids = [
        _ask(stack.base_url, world.acme_key, f"Yard {i}. " + SYSTEM_PROMPT, "Which track?")
        for i in range(16)
    ]
    assert len(usage_of(*ids)) == 16
    served = _served(replicas, since=served_before)
    assert sum(served) == 16 and min(served) >= 1, served
