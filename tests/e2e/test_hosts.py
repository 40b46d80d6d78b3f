"""Many hosts on one machine: each process on a loopback address of its own.

A second frontend "host" listens on 127.0.0.2, worker hosts on 127.0.0.3 and 127.0.0.4, every
address and port from configuration (ROUNDHOUSE_BIND_ADDRESS, ROUNDHOUSE_HOST_NAME, the
command lines): no process assumes it shares a machine with another. Under streaming load
through both frontends a new worker host joins and takes work without any other process being
restarted, a whole worker host (its process group: the worker and its engine core) is killed,
another joins, and a worker host is preempted with a 5 s grace; every accepted request ends
once and is billed once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import signal
import threading
import time
from decimal import Decimal

import httpx
import pytest

from dataplane.keys import heartbeats_key
from dataplane.redis_client import redis_sync_client
from models_registry.models import ModelVersion
from tests.conftest import (
    Process,
    _free_port,
    _http_ok,
    _spawn,
    _wait_for,
    own_deployment,
    roomy_key,
)

DEPLOYMENT = "spread"
# Tokens of the stream a preempted host is running: far more than its 5 s grace lets it make.
LONG = 1800


@pytest.fixture(scope="module")
def spread(world, django_db_blocker, demo_model_dir) -> ModelVersion:
    with django_db_blocker.unblock():
        return own_deployment(DEPLOYMENT, "spread-llama", Decimal(3), demo_model_dir)


@pytest.fixture(scope="module")
def hosts_key(world, django_db_blocker) -> str:
    """A tenant of its own, with room for the load and for one long stream."""
    with django_db_blocker.unblock():
        return roomy_key("hosts", max_tokens_per_request=2048)


def _host_env(address: str, name: str) -> dict[str, str]:
    return {"ROUNDHOUSE_BIND_ADDRESS": address, "ROUNDHOUSE_HOST_NAME": name}


def _worker_host(logs, address: str, name: str, *extra: str) -> tuple[Process, str]:
    port = _free_port()
    worker = _spawn(
        name,
        ["manage.py", "run_worker", "--deployment", DEPLOYMENT, "--metrics-port", str(port),
         *extra],
        logs,
        _host_env(address, name),
    )  # fmt: skip
    return worker, f"http://{address}:{port}/metrics"


def _joined(host: Process, metrics: str, name: str) -> None:
    """Wait until a new worker host serves, and has taken work without anyone's restart."""
    _wait_for(host, lambda: "ready: serving" in host.tail(400), timeout=600)
    assert any(w.startswith(f"{name}-") for w in _live_workers())
    deadline = time.monotonic() + 120
    while _served(metrics) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _served(metrics) >= 2, f"{name} took no work"


def _served(metrics_url: str) -> float:
    """Requests a worker host ended, from its own metrics."""
    text = httpx.get(metrics_url, timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("roundhouse_worker_requests_total{")
    )


def _live_workers() -> list[str]:
    live = redis_sync_client().zrangebyscore(heartbeats_key(DEPLOYMENT), time.time(), "+inf")
    return sorted(w.decode() for w in live)  # type: ignore[union-attr]


def _stream(
    client: httpx.Client,
    key: str,
    version: ModelVersion,
    max_tokens: int,
    running: threading.Event | None = None,
) -> tuple[int, str | None, str]:
    body = {
        "model": version.public_name,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            rid = r.headers.get("x-request-id")
            if r.status_code != 200:
                r.read()
                return r.status_code, rid, r.json()["error"]["code"]
            data = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data.append(line[6:])
                    if running is not None:
                        running.set()
    except httpx.HTTPError:
        return 200, None, "broken"
    last = json.loads(data[-2])
    end = last["error"]["code"] if "error" in last else last["choices"][0]["finish_reason"]
    return 200, rid, end


def test_hosts_join_die_and_are_preempted_under_load(stack, hosts_key, spread, tmp_path, usage_of):
    """host-4 joins; host-3 dies whole; host-5 joins; host-4 is preempted with a 5 s grace.

    The preemption is a spot node's notice: SIGTERM, then the kill when the grace is over. The
    worker stops claiming at once, lets its streams run for the grace, hands the ones still
    running on to another worker (which carries each on from its last token), and exits before
    the kill.
    """
    frontend_b = _spawn(
        "frontend-b",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.2",
         "--port", str(port_b := _free_port()), "--no-access-log"],
        tmp_path,
        {**_host_env("127.0.0.2", "host-2"),
         "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "multiproc-b")},
    )  # fmt: skip
    (tmp_path / "multiproc-b").mkdir()
    host_3, metrics_3 = _worker_host(tmp_path, "127.0.0.3", "host-3")
    host_4: Process | None = None
    host_5: Process | None = None
    outcomes: list[tuple[int, str | None, str]] = []
    stop = threading.Event()
    try:
        base_b = f"http://127.0.0.2:{port_b}"
        _wait_for(frontend_b, lambda: _http_ok(f"{base_b}/healthz"), timeout=120)
        _wait_for(host_3, lambda: "ready: serving" in host_3.tail(400), timeout=600)
        # Each listens on its own address only.
        assert _http_ok(metrics_3)
        assert not _http_ok(metrics_3.replace("127.0.0.3", "127.0.0.1"))
        assert not _http_ok(f"http://127.0.0.1:{port_b}/healthz")

        def load(base_url: str) -> None:
            with httpx.Client(base_url=base_url, timeout=120) as client:
                while not stop.is_set():
                    outcomes.append(outcome := _stream(client, hosts_key, spread, 48))
                    if outcome[0] == 503:
                        time.sleep(1.0)  # as its Retry-After asks

        running = threading.Event()

        def long_stream() -> tuple[int, str | None, str]:
            """A stream far longer than the grace, running on host-4 when it is preempted."""
            with httpx.Client(base_url=base_b, timeout=300) as client:
                return _stream(client, hosts_key, spread, LONG, running)

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            clients = [pool.submit(load, url) for url in [stack.base_url, base_b] * 2]
            try:
                # A new host joins while the load runs; nothing else restarts.
                host_4, metrics_4 = _worker_host(
                    tmp_path, "127.0.0.4", "host-4", "--drain-seconds", "5"
                )
                _joined(host_4, metrics_4, "host-4")
                # A whole host dies: the worker and its engine core, at once.
                os.killpg(host_3.popen.pid, signal.SIGKILL)
                host_3.popen.wait(timeout=30)
                died = len(outcomes)
                # host-4, the one worker left, is preempted while it runs the long stream: its
                # notice, then the kill when the grace is over. host-5 starts in its place.
                probe = pool.submit(long_stream)
                assert running.wait(timeout=120), "the long stream never started"
                preempted = time.monotonic()
                host_4.popen.send_signal(signal.SIGTERM)
                host_5, metrics_5 = _worker_host(tmp_path, "127.0.0.5", "host-5")
                try:
                    host_4.popen.wait(timeout=5 + 25)  # the grace, and its exit
                    drained = time.monotonic() - preempted
                finally:
                    if host_4.popen.poll() is None:
                        os.killpg(host_4.popen.pid, signal.SIGKILL)
                assert host_4.popen.returncode == 0, host_4.tail()
                _joined(host_5, metrics_5, "host-5")
                carried = probe.result(timeout=300)
                after = len(outcomes)
                deadline = time.monotonic() + 120
                while len(outcomes) < after + 8 and time.monotonic() < deadline:
                    time.sleep(0.2)
            finally:
                stop.set()
                for future in clients:
                    future.result()
    finally:
        for process in (frontend_b, host_3, host_4, host_5):
            if process is not None and process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
                process.popen.wait(timeout=60)

    assert len(outcomes) >= after + 8 > died, "the platform stopped serving after a host left"
    # Between host-4's exit and host-5's start the deployment had no live worker: new requests
    # were refused with 503 then, and only then.
    refused = [o for o in outcomes if o[0] != 200]
    assert all(o[:1] + o[2:] == (503, "model_unavailable") for o in refused), refused
    accepted = [o for o in outcomes if o[0] == 200] + [carried]
    # A stream the dead host was running ends with worker_lost; every other one completes.
    ends = collections.Counter(end for _, _, end in accepted)
    assert set(ends) <= {"length", "worker_lost"}, ends
    ids = [rid for _, rid, _ in accepted if rid is not None]
    assert len(ids) == len(accepted)
    records = usage_of(*ids, timeout=60)
    billed = collections.Counter(r.request_id for r in records)
    assert sorted(billed) == sorted(ids) and set(billed.values()) == {1}
    lost = {r.request_id for r in records if r.status == "worker_lost"}
    assert lost == {rid for _, rid, end in accepted if end == "worker_lost"}
    # The long stream the preempted host was running when its grace ran out was handed on:
    # host-5 carried it on to its full length, its client saw it end well, billed once in full.
    assert host_4 is not None
    handed = re.findall(r"handed ([0-9a-f]{32}) on after \d+ tokens", host_4.tail(2000))
    assert carried[1] in handed, host_4.tail()
    assert carried[2] == "length"
    (record,) = [r for r in records if r.request_id == carried[1]]
    assert (record.status, record.completion_tokens) == ("ok", LONG)
    print(
        f"{len(accepted)} streams through two frontend hosts; ends: {dict(ends)}; the "
        f"preempted host exited {drained:.1f} s after its notice"
    )
