"""Faults on the real stack: the platform keeps answering and loses no usage."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest

from billing.ingester import STALE_PENDING_MS
from dataplane.keys import INGEST_GROUP, usage_key
from dataplane.redis_client import redis_sync_client
from embedded.servers import service_restarted, services_status
from tenants.services import api_key_issue, tenant_create
from tests import services_plugin
from tests.conftest import ALIAS, DEPLOYMENT, _spawn, _wait_for


@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    """Stop a process and its children (a stalled server), and always let them go on."""
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    try:
        for proc in tree:
            # A connection's backend can exit between the listing and its signal: the rest
            # are stopped all the same, and every one already stopped is let go below.
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGSTOP)
        yield
    finally:
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)


def _postgres_pid() -> int:
    if services_plugin._config is None:
        pytest.skip("the tests run against external servers")
    status: Any = services_status(services_plugin._config)["postgres"]
    return int(status["pid"])


def _ask(client: httpx.Client, key: str, n: int) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={"model": ALIAS, "messages": [{"role": "user", "content": f"fault {n}"}],
              "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}"},
    )  # fmt: skip


def test_a_stalled_database_delays_usage_but_loses_and_duplicates_none(stack, world, usage_of):
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        assert _ask(client, world.acme_key, 0).status_code == 200  # keys and routes cached
        answered: dict[str, int] = {}
        with _frozen(_postgres_pid()):
            started = time.monotonic()
            # The API serves from what it cached; usage waits in Redis for the database.
            for n in range(1, 7):
                response = _ask(client, world.acme_key, n)
                assert response.status_code == 200, response.text
                answered[response.headers["x-request-id"]] = response.json()["usage"][
                    "completion_tokens"
                ]
            stalled_for = time.monotonic() - started
            time.sleep(max(0.0, 3.0 - stalled_for))
        print(f"6 requests answered during a {max(stalled_for, 3.0):.1f} s database stall")
    # The ingester retried and caught up: one record per request, none twice, none lost.
    records = usage_of(*answered, timeout=60)
    assert sorted(r.request_id for r in records) == sorted(answered)
    # Each record bills what its answer said (sampling may end one before max_tokens).
    assert {r.request_id: (r.status, r.completion_tokens) for r in records} == {
        request_id: ("ok", tokens) for request_id, tokens in answered.items()
    }


@dataclass(frozen=True)
class _Outcome:
    status: int
    request_id: str | None
    end: str  # finish reason, error code of the stream or of the refusal, or "broken"
    started: float  # time.monotonic()
    seconds: float


def _stream_once(client: httpx.Client, key: str, tag: str) -> _Outcome:
    """Stream one chat completion to its end and say how it ended."""
    started = time.monotonic()
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": f"restart {tag}"}],
        "max_tokens": 24,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    request_id = None
    try:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            request_id = r.headers.get("x-request-id")
            if r.status_code != 200:
                r.read()
                code = r.json()["error"]["code"]
                assert "Retry-After" in r.headers, r.headers
                return _Outcome(
                    r.status_code, request_id, code, started, time.monotonic() - started
                )
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    except httpx.HTTPError:
        return _Outcome(200, request_id, "broken", started, time.monotonic() - started)
    assert data[-1] == "[DONE]", data
    last = json.loads(data[-2])
    end = last["error"]["code"] if "error" in last else last["choices"][0]["finish_reason"]
    return _Outcome(200, request_id, end, started, time.monotonic() - started)


# Longer than a lease (3 s in the tests): running requests must not be reaped as lost when
# Redis comes back before their workers have renewed them.
OUTAGE_SECONDS = 4.0


@pytest.fixture(scope="module")
def restart_key(world, django_db_blocker) -> tuple[int, str]:
    """A tenant of its own with room for the load, so its reservations can be counted."""
    with django_db_blocker.unblock():
        tenant = tenant_create(slug="initrode")
        tenant.quota.requests_per_minute = 100_000
        tenant.quota.tokens_per_minute = 10_000_000
        tenant.quota.max_concurrency = 100
        tenant.quota.save()
        return tenant.pk, api_key_issue(tenant=tenant, name="tests").token


def test_a_valkey_restart_under_load_fails_fast_recovers_and_loses_no_usage(
    stack, restart_key, usage_of
):
    """Valkey stops cleanly under streaming load, stays down longer than a lease, comes back.

    Requests that arrive while it is down get a 503 at once; the streams that were running
    finish (their workers keep their events until they can write them); the platform serves
    again without a restart; every accepted request has its usage record and no reservation
    stays open.
    """
    if services_plugin._config is None:
        pytest.skip("the tests run against external servers")
    tenant_id, key = restart_key
    outcomes: list[_Outcome] = []
    stop = threading.Event()

    def load(n: int) -> None:
        with httpx.Client(base_url=stack.base_url, timeout=60) as client:
            i = 0
            while not stop.is_set():
                outcomes.append(_stream_once(client, key, f"{n}-{i}"))
                i += 1

    def served() -> int:
        return sum(o.status == 200 for o in outcomes)

    probes: list[_Outcome] = []
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        clients = [pool.submit(load, n) for n in range(6)]
        try:
            deadline = time.monotonic() + 120
            while served() < 12 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert served() >= 12, outcomes
            with (
                service_restarted(services_plugin._config, "valkey"),
                httpx.Client(base_url=stack.base_url, timeout=30) as client,
            ):
                down = time.monotonic()
                while time.monotonic() - down < OUTAGE_SECONDS:
                    probes.append(_stream_once(client, key, "probe"))
                    time.sleep(0.2)
            # Back: the frontend, worker and ingester find it again by themselves.
            back = time.monotonic()
            with httpx.Client(base_url=stack.base_url, timeout=30) as client:
                while (first := _stream_once(client, key, "after")).status != 200:
                    assert time.monotonic() - back < 10, first
                    time.sleep(0.1)
            recovered = time.monotonic() - back
            at_recovery = served()
            while served() < at_recovery + 12 and time.monotonic() - back < 60:
                time.sleep(0.1)
        finally:
            stop.set()
            for future in clients:
                future.result()

    assert probes and all(p.status == 503 and p.end == "service_unavailable" for p in probes)
    # Refused while it was down, or in the moment after, before the worker's first heartbeat
    # put it back among the live ones: a 503 with Retry-After either way.
    refused = [o for o in outcomes if o.status != 200]
    assert all(
        o.status == 503 and o.end in ("service_unavailable", "model_unavailable") for o in refused
    ), refused
    accepted = [o for o in outcomes if o.status == 200] + [first]
    # The streams that ran across the restart finished; none broke or lost its end.
    assert all(o.end in ("stop", "length") for o in accepted), [
        o for o in accepted if o.end not in ("stop", "length")
    ]
    # Valkey was down from `down` for OUTAGE_SECONDS at least. (Not "ended after `back`": a
    # stream can end while Valkey's start is still being waited for, before `back` is read;
    # a clean-clone run found all six streams across the restart ended by then.)
    across = [
        o for o in accepted if o.started < down and o.started + o.seconds > down + OUTAGE_SECONDS
    ]
    print(
        f"{len(probes)} probes during the outage, each refused in at most "
        f"{max(p.seconds for p in probes) * 1000:.0f} ms; served again {recovered:.2f} s after "
        f"Valkey came back; {served()} streams accepted ({len(across)} across the restart), "
        f"{sum(o.status == 503 for o in outcomes)} refused"
    )
    assert across, "no stream ran across the restart"
    ids = [o.request_id for o in accepted if o.request_id is not None]
    assert len(ids) == len(accepted)
    records = usage_of(*ids, timeout=60)
    assert sorted(r.request_id for r in records) == sorted(ids)
    # Every reservation the accepted requests held has been settled. A batch the ingester
    # recorded in PostgreSQL but could not settle in Valkey (it went away between the two)
    # is claimed again once pending for STALE_PENDING_MS (30 s), so allow that and more: two
    # clean-clone runs found one or two reservations still held at 30 s.
    store = redis_sync_client()
    deadline = time.monotonic() + STALE_PENDING_MS / 1000 + 45
    while True:
        open_held = store.keys(f"sy:{{t{tenant_id}}}:held:*")
        inflight = store.zcard(f"sy:{{t{tenant_id}}}:inflight")
        if (not open_held and not inflight) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not open_held and not inflight


def test_an_ingester_stopped_gracefully_leaves_nothing_unacknowledged(
    stack, world, usage_of, tmp_path
):
    """A second ingester takes the usage stream over, then gets SIGTERM while usage flows.

    It finishes the batch it holds (recorded, settled, acknowledged) and exits cleanly:
    nothing it read waits for another ingester to take over, and no record is lost or doubled.
    """
    spare = _spawn("ingester-spare", ["manage.py", "run_ingester"], tmp_path)
    _wait_for(spare, lambda: "ingester running as consumer" in spare.tail(), timeout=60)
    consumer = spare.tail().split("ingester running as consumer ")[1].split()[0]
    with (
        httpx.Client(base_url=stack.base_url, timeout=60) as client,
        concurrent.futures.ThreadPoolExecutor(6) as pool,
    ):
        # The platform's own ingester is held still, so the spare reads what flows meanwhile.
        with _frozen(stack.ingester.popen.pid):
            answers = [pool.submit(_ask, client, world.acme_key, n) for n in range(36)]
            while sum(a.done() for a in answers) < 12:
                time.sleep(0.05)
            spare.popen.send_signal(signal.SIGTERM)
            assert spare.popen.wait(timeout=30) == 0, spare.tail()
        ids = [a.result().headers["x-request-id"] for a in answers]
    stopped = spare.tail().split("ingester stopped after ")[1].split()[0]
    print(f"the spare ingester recorded {stopped} requests before its clean exit")
    assert int(stopped) > 0
    records = usage_of(*ids, timeout=60)
    assert sorted(r.request_id for r in records) == sorted(ids)
    store = redis_sync_client()
    consumers = store.xinfo_consumers(usage_key(DEPLOYMENT), INGEST_GROUP)
    [mine] = [c for c in consumers if c["name"].decode() == consumer]
    assert mine["pending"] == 0


def test_a_postgres_restart_under_load_loses_and_duplicates_no_usage(
    stack, world, usage_of, django_db_blocker
):
    """PostgreSQL goes down for 3 s and comes back: serving goes on, usage catches up.

    While it is down the API answers from cached keys and routes; afterwards the ingester,
    the frontend and the console use new connections by themselves.
    """
    if services_plugin._config is None:
        pytest.skip("the tests run against external servers")
    answered: list[str] = []
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        answered.append(_ask(client, world.acme_key, 100).headers["x-request-id"])
        with service_restarted(services_plugin._config, "postgres"):
            down = time.monotonic()
            n = 101
            while time.monotonic() - down < 3.0:
                response = _ask(client, world.acme_key, n)
                assert response.status_code == 200, response.text
                answered.append(response.headers["x-request-id"])
                n += 1
        # A key no frontend has cached needs the database: it works again shortly.
        from django.db import connection

        with django_db_blocker.unblock():
            connection.close()  # this process's own connection died with the server
            fresh = api_key_issue(tenant=world.acme, name="after-restart").token
        back = time.monotonic()
        while (response := _ask(client, fresh, 200)).status_code != 200:
            assert time.monotonic() - back < 10, response.text
            time.sleep(0.2)
        answered.append(response.headers["x-request-id"])
        assert client.get("/console/login").status_code == 200
    records = usage_of(*answered, timeout=60)
    assert sorted(r.request_id for r in records) == sorted(answered)
    print(f"{len(answered) - 2} requests answered while PostgreSQL was down")


def _seeded(client: httpx.Client, key: str, words: str, salt: str) -> dict[str, Any]:
    answer = client.post(
        "/v1/completions",
        json={
            "model": ALIAS,
            "prompt": words,
            "max_tokens": 6,
            "temperature": 1.0,
            "seed": 11,
            "cache_salt": salt,  # no prefix of an earlier run: every prompt is computed
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_seeded_requests_chunked_at_once_leave_the_engine_up_and_sample_as_alone(stack, world):
    """Four seeded requests with long prompts at once exceed the engine's token budget per
    step, so some prompts are computed in chunks. vLLM's CPU engine then moved each one's
    random generator back by an offset CPU generators do not have, and died with every
    request in it (workers/cpu_fixes.py): each is served, and samples what it samples alone."""
    prompts = [f"{i} " + f"word{i} " * 700 for i in range(4)]
    with httpx.Client(base_url=stack.base_url, timeout=300) as client:
        alone = [_seeded(client, world.globex_key, p, f"alone-{uuid.uuid4().hex}") for p in prompts]
        assert all(a["usage"]["prompt_tokens"] > 1024 for a in alone)  # two need > 2048 at once
        salt = f"together-{uuid.uuid4().hex}"
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda p: _seeded(client, world.globex_key, p, salt), prompts))
        after = client.post(
            "/v1/completions",
            json={"model": ALIAS, "prompt": "hello", "max_tokens": 2},
            headers={"Authorization": f"Bearer {world.globex_key}"},
        )
    assert after.status_code == 200, after.text
    texts = [[c["text"] for c in a["choices"]] for a in alone]
    assert [[c["text"] for c in t["choices"]] for t in together] == texts
