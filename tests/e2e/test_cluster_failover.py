"""A Valkey Cluster primary dies under streaming load; its replica takes over.

Runs only when the whole session runs on the embedded cluster (ROUNDHOUSE_TEST_CLUSTER=1, as
`make test`'s cluster pass does). What a failover may lose is the writes the dead primary
acknowledged and had not yet sent to its replica (replication is asynchronous): the test counts
what happened to every request and holds the platform to billing none twice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import signal
import threading
import time

import httpx
import pytest

from dataplane.keys import tag
from embedded.valkey_cluster import (
    node_kill,
    node_start,
    primary_of,
    wait_healthy,
    wait_promoted,
)
from tests import services_plugin
from tests.conftest import DEPLOYMENT, roomy_key
from tests.e2e.test_faults import _Outcome, _stream_once

pytestmark = pytest.mark.skipif(
    services_plugin.cluster is None, reason="the session does not run on a Valkey Cluster"
)


@pytest.fixture(scope="module")
def failover_key(world, django_db_blocker) -> str:
    with django_db_blocker.unblock():
        return roomy_key("piedpiper-failover")


def test_a_primary_failover_under_load_bills_nothing_twice(stack, failover_key, usage_of):
    cluster = services_plugin.cluster
    assert cluster is not None
    queue_key = f"{tag(DEPLOYMENT)}:jobs"
    victim = primary_of(cluster, queue_key)
    outcomes: list[_Outcome] = []
    stop = threading.Event()

    def load(n: int) -> None:
        with httpx.Client(base_url=stack.base_url, timeout=60) as client:
            i = 0
            while not stop.is_set():
                outcomes.append(_stream_once(client, failover_key, f"{n}-{i}"))
                i += 1

    def served() -> int:
        return sum(o.status == 200 and o.end in ("stop", "length") for o in outcomes)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        clients = [pool.submit(load, n) for n in range(6)]
        try:
            deadline = time.monotonic() + 120
            while served() < 12 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert served() >= 12, outcomes
            killed = time.monotonic()
            node_kill(cluster, victim.name, signal.SIGKILL)
            assert wait_promoted(cluster, queue_key, victim.name, timeout=60), "no takeover"
            promoted = time.monotonic() - killed
            at_promotion = served()
            while served() < at_promotion + 12 and time.monotonic() - killed < 90:
                time.sleep(0.1)
            assert served() >= at_promotion + 12, "the platform did not serve again"
        finally:
            stop.set()
            for future in clients:
                future.result()
            # The dead primary comes back as a replica of the one that took its place.
            node_start(cluster, victim, fast=True)
            wait_healthy(cluster, timeout=60)

    accepted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status != 200]
    assert all(o.status == 503 for o in refused), refused
    ids = [o.request_id for o in accepted if o.request_id is not None]
    assert len(ids) == len(accepted)
    records = usage_of(*ids, timeout=60)
    billed = collections.Counter(r.request_id for r in records)
    twice = [rid for rid, n in billed.items() if n > 1]
    errored = [o for o in accepted if o.end not in ("stop", "length")]
    unbilled = [o for o in accepted if o.request_id not in billed]
    across = [o for o in accepted if o.started < killed < o.started + o.seconds]
    print(
        f"primary {victim.name} killed; replica promoted after {promoted:.1f} s; "
        f"{len(accepted)} streams accepted ({len(across)} running when it died), "
        f"{len(refused)} refused with 503, "
        f"{len(errored)} ended with an error ({collections.Counter(o.end for o in errored)}), "
        f"{len(unbilled)} without a usage record, {len(twice)} billed twice"
    )
    assert across, "no stream ran across the failover"
    assert not twice
    # A record lost with the dead primary's last writes belongs to a request that was running
    # when it died: one admitted after the replica took over is written there in full.
    assert all(o.started < killed + promoted for o in unbilled), unbilled
