"""Drills with real workers: an engine that dies under two tenants, every worker restarting.

A deployment of its own (`drill-d`) serves the alias `drill-chat`, whose fallback is the
session's chat alias. A frontend of this module's own trips its breakers sooner than the
defaults (3 failed requests of a tenant, where the defaults want 10), and holds them open for
20 s, longer than the engine takes to start again here, so the test sees them hold:

- the engine core inside a live worker is killed under streams of two tenants: each stream
  ends `worker_lost` and is billed once; both tenants' breakers count those ends and open, so
  every tenant's requests for the alias go to the fallback; the worker starts its engine
  again, a probe closes the breakers, and the alias serves again;
- every worker of a deployment is stopped at once and new ones started, under load: each
  request ends once (answered, or refused or failed by its deadline), each admitted one has
  exactly one usage record, none is billed twice.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import httpx
import psutil
import pytest

from bench.common import engine_core
from tests.conftest import (
    ALIAS,
    Process,
    _free_port,
    _http_ok,
    _spawn,
    _wait_for,
    own_deployment,
    roomy_key,
)

NAMED = "drill-chat"
DEPLOYMENT = "drill-d"
RESTARTED = "drill-restart-d"
BREAKER_ENV = {
    "ROUNDHOUSE_BREAKER_MIN_REQUESTS": "3",
    "ROUNDHOUSE_BREAKER_OPEN_SECONDS": "20",
    "ROUNDHOUSE_BREAKER_MIN_TENANTS": "2",
}


@pytest.fixture(scope="module")
def drill(
    stack: Any, world: Any, demo_model_dir: Any, django_db_blocker: Any, tmp_path_factory: Any
) -> Iterator[dict[str, Any]]:
    from models_registry.models import Alias
    from models_registry.services import alias_fallback_set, alias_set

    with django_db_blocker.unblock():
        version = own_deployment(DEPLOYMENT, "drill-llama", Decimal("0.93"), demo_model_dir)
        named = alias_set(name=NAMED, version=version)
        alias_fallback_set(alias=named, fallback=Alias.objects.get(name=ALIAS))
        keys = {
            slug: roomy_key(slug, max_tokens_per_request=4096)
            for slug in ("drill-a", "drill-b", "drill-c")
        }
    logs = tmp_path_factory.mktemp("drill-logs")
    worker = _spawn("drill-worker", ["manage.py", "run_worker", "--deployment", DEPLOYMENT], logs)
    port = _free_port()
    frontend = _spawn(
        "drill-frontend",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        logs,
        BREAKER_ENV,
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_for(frontend, lambda: _http_ok(f"{base_url}/healthz"), timeout=120)
        _wait_for(worker, lambda: "ready: serving" in worker.tail(400), timeout=600)
        yield {
            "version": version,
            "keys": keys,
            "worker": worker,
            "frontend": frontend,
            "base_url": base_url,
        }
    finally:
        for process in (worker, frontend):
            if process.popen.poll() is None:
                os.killpg(process.popen.pid, signal.SIGTERM)
        for process in (worker, frontend):
            try:
                process.popen.wait(timeout=30)
            except Exception:
                os.killpg(process.popen.pid, signal.SIGKILL)


def _stream(base_url: str, key: str, out: dict[str, Any], started: threading.Event) -> None:
    """A long stream on the alias: its request id, whether it began, and its last event."""
    body = {
        "model": NAMED,
        "messages": [{"role": "user", "content": "Tell me about the rail yard."}],
        # Long enough that streams overlap at the kill; short enough that one sent just as the
        # engine died (answered by the fallback) ends within the join below on a busy machine.
        "max_tokens": 600,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=base_url, timeout=180) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        out["status"] = response.status_code
        out["request_id"] = response.headers.get("x-request-id")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out["error"] = event["error"]
                continue
            if event["choices"] and event["choices"][0].get("finish_reason"):
                out["finish_reason"] = event["choices"][0]["finish_reason"]
            if not out.get("began"):
                out["began"] = True
                started.set()


def _chat(base_url: str, key: str, **fields: Any) -> httpx.Response:
    body = {
        "model": NAMED,
        "messages": [{"role": "user", "content": "Say something"}],
        "max_tokens": 4,
        **fields,
    }
    with httpx.Client(base_url=base_url, timeout=180) as client:
        return client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )


def test_an_engine_that_dies_under_two_tenants_sends_them_to_the_fallback_and_back(
    drill, world, usage_of
):
    base_url, keys, worker = drill["base_url"], drill["keys"], drill["worker"]
    assert _chat(base_url, keys["drill-a"]).headers["x-roundhouse-model-version"] == (
        drill["version"].version
    )
    # Four clients of each tenant stream one answer after another, and the engine is killed
    # while it holds at least three streams of each (the tiny model answers in seconds, so a
    # fixed set of streams could all have ended before the kill).
    streams: list[dict[str, Any]] = []
    lock = threading.Lock()
    killed = threading.Event()

    def client(slug: str) -> None:
        while not killed.is_set():
            out: dict[str, Any] = {"tenant": slug}
            with lock:
                streams.append(out)
            _stream(base_url, keys[slug], out, threading.Event())

    threads = [
        threading.Thread(target=client, args=(slug,))
        for slug in ("drill-a", "drill-b")
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120

    def running(slug: str) -> int:
        return sum(s["tenant"] == slug and bool(s.get("began")) and "finish_reason" not in s
                   for s in list(streams))  # fmt: skip

    while min(running("drill-a"), running("drill-b")) < 3:
        assert time.monotonic() < deadline, (streams, worker.tail())
        time.sleep(0.02)
    core = engine_core(worker.popen.pid, worker.log)
    assert core is not None, f"the worker has no engine process:\n{worker.tail()}"
    killed.set()
    core.kill()
    # The breakers counted those ends: both tenants' opened, so the deployment is failing for
    # more than one tenant and every tenant's requests, a third's too, go to the fallback:
    # held by the breakers, or refused by admission while the worker, out of the live set,
    # starts its engine again.
    frontend = drill["frontend"]
    deadline = time.monotonic() + 60
    while f"breakers of {NAMED} hold for 2 tenants" not in frontend.log.read_text():
        assert time.monotonic() < deadline, frontend.tail(60)
        time.sleep(0.1)
    assert frontend.log.read_text().count(f"breaker of {NAMED} for tenant") >= 2
    for slug in ("drill-a", "drill-b", "drill-c"):
        response = _chat(base_url, keys[slug])
        assert response.status_code == 200, response.text
        assert response.headers.get("x-roundhouse-fallback-from") == NAMED, (
            slug,
            dict(response.headers),
        )
        assert response.headers["x-roundhouse-fallback-reason"] in (
            "circuit_open",
            "model_unavailable",
        )
        assert response.headers["x-roundhouse-model-version"] == world.version.version
    for thread in threads:
        thread.join(180)
        assert not thread.is_alive(), "a stream was left hanging by the engine's death"
    # Every stream the engine held ends with the platform's failure, once, and is billed
    # once for what it made; those that ended before end as usual.
    ends = [(s["tenant"], s.get("error", {}).get("code") or s.get("finish_reason"))
            for s in streams]  # fmt: skip
    assert {end for _, end in ends} <= {"worker_lost", "length"}, streams
    for slug in ("drill-a", "drill-b"):
        assert sum(end == (slug, "worker_lost") for end in ends) >= 3, ends
    records = {r.request_id: r for r in usage_of(*(s["request_id"] for s in streams))}
    assert len(records) == len(streams)
    for stream in streams:
        record = records[stream["request_id"]]
        assert record.status == ("worker_lost" if "error" in stream else "ok")
        assert record.prompt_tokens > 0  # what it made, if anything, is billed too
    # The worker lived through it: it starts its engine again, and each tenant's breaker, once
    # open long enough, sends a probe that the alias answers and closes; the alias then serves
    # every tenant itself (the third's requests go on with fewer than two breakers holding).
    assert worker.popen.poll() is None, worker.tail()
    for slug in ("drill-a", "drill-b", "drill-c"):
        deadline = time.monotonic() + 300
        in_a_row = 0
        while in_a_row < 3:  # a closing breaker's news reaches the frontend's listener too
            response = _chat(base_url, keys[slug])
            assert response.status_code == 200, response.text
            if "x-roundhouse-fallback-from" in response.headers:
                in_a_row = 0
                assert time.monotonic() < deadline, f"{slug} never came back:\n{worker.tail()}"
                time.sleep(0.5)
                continue
            assert response.headers["x-roundhouse-model-version"] == drill["version"].version
            in_a_row += 1
    log = worker.log.read_text(errors="replace")
    assert "the engine died (oom); starting it again" in log  # SIGKILL reads as the OOM killer
    assert "the engine is up again" in log
    assert worker.popen.poll() is None and core.pid not in {
        c.pid for c in psutil.Process(worker.popen.pid).children(recursive=True)
    }


def test_every_worker_of_a_deployment_restarting_at_once_loses_and_bills_twice_nothing(
    stack, world, demo_model_dir, django_db_blocker, tmp_path, usage_of
):
    """Both workers of a deployment stopped at once (SIGTERM: they finish what they run) and
    two new ones started, under load: requests queue for the new workers or fail fast by their
    deadline; none is lost, none billed twice."""
    with django_db_blocker.unblock():
        version = own_deployment(RESTARTED, "restart-llama", Decimal("0.94"), demo_model_dir)
        key = roomy_key("drill-restart")

    def start(name: str) -> Process:
        return _spawn(name, ["manage.py", "run_worker", "--deployment", RESTARTED], tmp_path)

    old = [start("old-1"), start("old-2")]
    for worker in old:
        _wait_for(worker, lambda w=worker: "ready: serving" in w.tail(400), timeout=600)
    stopping = threading.Event()
    outcomes: list[tuple[str | None, int, str]] = []  # (request id, status, code or finish)
    lock = threading.Lock()

    def client(n: int) -> None:
        with httpx.Client(base_url=stack.base_url, timeout=300) as http:
            i = 0
            while not stopping.is_set():
                i += 1
                response = http.post(
                    "/v1/completions",
                    json={"model": version.public_name, "prompt": f"Train {n}-{i}",
                          "max_tokens": 24, "ignore_eos": True},
                    headers={"Authorization": f"Bearer {key}", "x-request-timeout": "60"},
                )  # fmt: skip
                body = response.json()
                if response.status_code == 200:
                    code = body["choices"][0]["finish_reason"]
                else:
                    code = body["error"]["code"]
                with lock:
                    outcomes.append((response.headers.get("x-request-id"), response.status_code,
                                     code))  # fmt: skip
                if response.status_code != 200:
                    time.sleep(0.5)

    with ThreadPoolExecutor(6) as pool:
        for n in range(6):
            pool.submit(client, n)
        time.sleep(5)
        for worker in old:
            worker.popen.send_signal(signal.SIGTERM)
        new = [start("new-1"), start("new-2")]
        try:
            for worker in old:
                assert worker.popen.wait(timeout=120) == 0, worker.tail()
            for worker in new:
                _wait_for(worker, lambda w=worker: "ready: serving" in w.tail(400), timeout=600)
            served_before = sum(status == 200 for _, status, _ in outcomes)
            deadline = time.monotonic() + 120
            while sum(status == 200 for _, status, _ in outcomes) < served_before + 12:
                assert time.monotonic() < deadline, "the new workers never served"
                time.sleep(0.5)
        finally:
            stopping.set()
    try:
        # Every answer is a completion or a clear refusal or failure, never a 500.
        codes = {code for _, status, code in outcomes if status != 200}
        assert {status for _, status, _ in outcomes} <= {200, 503}, outcomes
        assert codes <= {
            "model_unavailable", "deadline_unattainable", "deadline_exceeded", "worker_lost",
        }, codes  # fmt: skip
        assert {code for _, status, code in outcomes if status == 200} == {"length"}
        # Each request that ran has exactly one usage record; refused ones none.
        ran = [
            rid or "" for rid, status, code in outcomes if status == 200 or code == "worker_lost"
        ]
        assert len(set(ran)) == len(ran)
        records = {r.request_id: r for r in usage_of(*ran)}
        assert sorted(records) == sorted(ran)
        for rid, status, _ in outcomes:
            if status == 200:  # billed once, for the one run that answered
                assert (records[rid].status, records[rid].completion_tokens) == ("ok", 24)
        refused = [rid for rid, status, code in outcomes
                   if code in ("model_unavailable", "deadline_unattainable")]  # fmt: skip
        with django_db_blocker.unblock():
            from billing.models import UsageRecord

            assert not UsageRecord.objects.filter(request_id__in=refused).exists()
    finally:
        for worker in new:
            if worker.popen.poll() is None:
                worker.popen.send_signal(signal.SIGTERM)
        for worker in new:
            worker.popen.wait(timeout=60)
