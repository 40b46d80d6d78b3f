"""Faults on the real stack: the platform keeps answering and loses no usage."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from embedded.servers import services_status
from tests import services_plugin
from tests.conftest import ALIAS


@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    """Stop a process and its children (a stalled server), and always let them go on."""
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in tree:
        proc.send_signal(signal.SIGSTOP)
    try:
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
        answered = []
        with _frozen(_postgres_pid()):
            started = time.monotonic()
            # The API serves from what it cached; usage waits in Redis for the database.
            for n in range(1, 7):
                response = _ask(client, world.acme_key, n)
                assert response.status_code == 200, response.text
                answered.append(response.headers["x-request-id"])
            stalled_for = time.monotonic() - started
            time.sleep(max(0.0, 3.0 - stalled_for))
        print(f"6 requests answered during a {max(stalled_for, 3.0):.1f} s database stall")
    # The ingester retried and caught up: one record per request, none twice, none lost.
    records = usage_of(*answered, timeout=60)
    assert sorted(r.request_id for r in records) == sorted(answered)
    assert all(r.status == "ok" and r.completion_tokens == 4 for r in records)
