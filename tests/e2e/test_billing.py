"""Usage end to end: every request the data plane finished has exactly one usage record."""

from __future__ import annotations

import time

import httpx

from billing.reconcile import usage_reconcile
from tests.conftest import ALIAS, DEPLOYMENT


def test_finished_requests_and_usage_records_reconcile(stack, world, usage_of, django_db_blocker):
    ids = []
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        for i in range(4):
            response = client.post(
                "/v1/completions",
                json={"model": ALIAS, "prompt": f"count {i}", "max_tokens": 5, "user": f"r{i}"},
                headers={"Authorization": f"Bearer {world.acme_key}"},
            )
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
    records = usage_of(*ids)
    assert {r.user for r in records} == {"r0", "r1", "r2", "r3"}
    assert all(r.priority == "interactive" for r in records)
    # Other tests' requests may still be ending: the counts must converge, not match at once.
    deadline = time.monotonic() + 30
    while True:
        with django_db_blocker.unblock():
            rows = [r for r in usage_reconcile(hours=2) if r.deployment == DEPLOYMENT]
        if (rows and all(not r.problems for r in rows)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows, "the ledger recorded nothing for the deployment"
    assert [r.problems for r in rows] == [[] for _ in rows]
    assert sum(r.recorded for r in rows) >= 4
