"""Properties of the dispatch order, checked against the real scripts in a real Valkey.

Hypothesis draws tenants, weights, job sizes, classes and expired deadlines; the order in which
`Roles.claim` hands the jobs out must respect the weights within start-time fair queuing's
bound, put every interactive job before any batch job (or, with a batch share, exactly every
n-th job to batch work while both classes wait), keep each tenant's jobs in arrival order,
serve everyone (no starvation) and never hand out a job whose deadline passed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dataplane.leases import batch_every as batch_every_for
from dataplane.redis_client import redis_client_new
from dataplane.types import Finished, Job, Sampling, Status, usage_for
from tests.dataplane.roles import Roles, roles


@dataclass(frozen=True)
class Spec:
    tenant: int
    priority: str
    prompt: int
    max_tokens: int
    expired: bool

    @property
    def cost(self) -> int:
        return self.prompt + self.max_tokens


def _job(deployment: str, spec: Spec, weight: float, now: float) -> Job:
    return Job(
        request_id=uuid.uuid4().hex,
        tenant_id=spec.tenant,
        api_key_id=1,
        deployment=deployment,
        model_version="v",
        endpoint="completions",
        prompt_token_ids=[1] * spec.prompt,
        sampling=Sampling(max_tokens=spec.max_tokens),
        priority=spec.priority,
        weight=weight,
        enqueued_at=now,
        deadline=now - 1 if spec.expired else now + 600,
    )


async def _finish(dispatch: Roles, job: Job, used: int | None = None) -> None:
    completion = job.sampling.max_tokens if used is None else used
    usage = usage_for(job, status=Status.OK, finished_at=time.time(), completion_tokens=completion)
    done = Finished(
        finish_reason="length",
        prompt_tokens=len(job.prompt_token_ids),
        completion_tokens=completion,
    )
    await dispatch.finisher.finalize(job=job, terminal=done, usage=usage)


async def _fresh_deployment(dispatch: Roles) -> str:
    deployment = f"fair-{uuid.uuid4().hex[:10]}"
    await dispatch.usage.ensure_groups(deployment)
    await dispatch.leases.heartbeat(deployment=deployment, worker="w", ttl=60)
    return deployment


async def _drain_in_order(
    specs: list[Spec], weights: dict[int, int], batch_every: int = 0
) -> tuple[list[Job], list[Job], list[Job]]:
    """Queue every job, then claim one at a time; return (queued, dispatched, expired)."""
    client = redis_client_new()
    try:
        dispatch = roles(client, reply_ttl=60)
        deployment = await _fresh_deployment(dispatch)
        now = time.time()
        jobs = [_job(deployment, s, weights[s.tenant], now) for s in specs]
        for job in jobs:
            assert await dispatch.front.enqueue(job) is None
        dispatched: list[Job] = []
        expired: list[Job] = []
        for _ in range(len(jobs) + 1):
            claimed = await dispatch.leases.claim(
                deployment=deployment, count=1, lease_seconds=30, batch_every=batch_every
            )
            expired.extend(claimed.expired)
            for job in claimed.run:
                dispatched.append(job)
                await _finish(dispatch, job)
            if not claimed.run and not claimed.expired:
                break
        return jobs, dispatched, expired
    finally:
        await client.aclose()


specs_strategy = st.lists(
    st.builds(
        Spec,
        tenant=st.integers(1, 3),
        priority=st.sampled_from(["interactive"] * 3 + ["batch"]),
        prompt=st.integers(1, 8),
        max_tokens=st.integers(1, 64),
        expired=st.sampled_from([False] * 5 + [True]),
    ),
    min_size=1,
    max_size=60,
)
weights_strategy = st.fixed_dictionaries({t: st.integers(1, 4) for t in range(1, 4)})
property_settings = hsettings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@property_settings
@given(specs=specs_strategy, weights=weights_strategy)
def test_every_job_is_handed_out_once_and_expired_ones_never_run(specs, weights):
    jobs, dispatched, expired = asyncio.run(_drain_in_order(specs, weights))
    by_id = {j.request_id: s for j, s in zip(jobs, specs, strict=True)}
    ran = [j.request_id for j in dispatched]
    assert len(ran) == len(set(ran))
    assert set(ran) | {j.request_id for j in expired} == set(by_id)
    assert all(not by_id[rid].expired for rid in ran)
    assert all(by_id[j.request_id].expired for j in expired)


@property_settings
@given(specs=specs_strategy, weights=weights_strategy)
def test_priority_is_strict_and_each_tenant_is_first_in_first_out(specs, weights):
    jobs, dispatched, _ = asyncio.run(_drain_in_order(specs, weights))
    classes = [j.priority for j in dispatched]
    # Everything was queued before the first claim: no batch job before an interactive one.
    assert classes == sorted(classes, key=lambda c: c != "interactive")
    arrival = {j.request_id: i for i, j in enumerate(jobs)}
    per_queue: dict[tuple[int, str], list[int]] = defaultdict(list)
    for job in dispatched:
        per_queue[(job.tenant_id, job.priority)].append(arrival[job.request_id])
    for order in per_queue.values():
        assert order == sorted(order)


def _classes_with_a_batch_share(interactive: int, batch: int, every: int) -> list[str]:
    """The classes in the order a claim takes them, everything queued at once."""
    order, streak = [], 0
    while interactive or batch:
        if batch and (streak >= every - 1 or not interactive):
            order.append("batch")
            batch, streak = batch - 1, 0
        else:
            order.append("interactive")
            interactive -= 1
            streak += 1 if batch else 0
    return order


@property_settings
@given(specs=specs_strategy, weights=weights_strategy, every=st.integers(2, 6))
def test_a_batch_share_hands_every_nth_job_to_batch_work_while_both_wait(specs, weights, every):
    jobs, dispatched, _ = asyncio.run(_drain_in_order(specs, weights, batch_every=every))
    live = [s for s in specs if not s.expired]
    expected = _classes_with_a_batch_share(
        sum(s.priority == "interactive" for s in live),
        sum(s.priority == "batch" for s in live),
        every,
    )
    assert [j.priority for j in dispatched] == expected
    arrival = {j.request_id: i for i, j in enumerate(jobs)}
    per_queue: dict[tuple[int, str], list[int]] = defaultdict(list)
    for job in dispatched:
        per_queue[(job.tenant_id, job.priority)].append(arrival[job.request_id])
    for order in per_queue.values():
        assert order == sorted(order)


def test_a_batch_share_is_how_often_a_claim_takes_batch_work():
    assert batch_every_for(0) == 0
    assert batch_every_for(-1) == 0
    assert batch_every_for(0.05) == 20
    assert batch_every_for(0.25) == 4
    # At most half: batch work never goes ahead of interactive work more often than it.
    assert batch_every_for(0.5) == 2
    assert batch_every_for(0.9) == 2


async def _under_interactive_load(dispatch: Roles, deployment: str, batch_every: int) -> list[Job]:
    """Claim three jobs at a time for 20 rounds while four interactive jobs arrive each round."""
    now = time.time()
    taken: list[Job] = []
    for _ in range(20):
        for tenant in (1, 2, 1, 2):
            spec = Spec(tenant, "interactive", 2, 8, False)
            await dispatch.front.enqueue(_job(deployment, spec, 1, now))
        claimed = await dispatch.leases.claim(
            deployment=deployment, count=3, lease_seconds=30, batch_every=batch_every
        )
        taken.extend(claimed.run)
        for job in claimed.run:
            await _finish(dispatch, job)
    return taken


async def test_sustained_interactive_load_does_not_starve_batch_work():
    """Interactive work keeps arriving faster than it is served; batch work still gets its share.

    The run of interactive jobs is counted across claims of several jobs, as workers make them.
    """
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    batch = [_job(deployment, Spec(3, "batch", 2, 8, False), 1, now) for _ in range(4)]
    for job in batch:
        await dispatch.front.enqueue(job)
    taken = await _under_interactive_load(dispatch, deployment, batch_every=10)
    positions = [i for i, j in enumerate(taken) if j.priority == "batch"]
    assert positions == [9, 19, 29, 39]
    assert [j.request_id for j in taken if j.priority == "batch"] == [j.request_id for j in batch]
    # Under strict priority the same load leaves batch work waiting for good.
    deployment = await _fresh_deployment(dispatch)
    await dispatch.front.enqueue(_job(deployment, Spec(3, "batch", 2, 8, False), 1, now))
    taken = await _under_interactive_load(dispatch, deployment, batch_every=0)
    assert taken and all(j.priority == "interactive" for j in taken)
    await client.aclose()


@property_settings
@given(specs=specs_strategy, weights=weights_strategy)
def test_weighted_shares_stay_within_the_fair_queuing_bound(specs, weights):
    _, dispatched, _ = asyncio.run(_drain_in_order(specs, weights))
    largest = max(s.cost for s in specs)
    for cls in ("interactive", "batch"):
        order = [j for j in dispatched if j.priority == cls]
        remaining: dict[int, int] = defaultdict(int)
        for job in order:
            remaining[job.tenant_id] += 1
        served: dict[int, float] = defaultdict(float)
        for job in order:
            served[job.tenant_id] += job.reserved_tokens / weights[job.tenant_id]
            remaining[job.tenant_id] -= 1
            # While two tenants both still wait, the weighted service they received differs
            # by at most one largest job of each (start-time fair queuing's bound).
            waiting = [t for t, n in remaining.items() if n > 0]
            for a in waiting:
                for b in waiting:
                    bound = largest / weights[a] + largest / weights[b]
                    assert abs(served[a] - served[b]) <= bound + 1e-6


async def test_long_run_shares_follow_the_weights():
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    weights = {1: 1, 2: 2, 3: 4}
    for _ in range(60):
        for tenant, weight in weights.items():
            spec = Spec(tenant, "interactive", 2, 30, False)
            await dispatch.front.enqueue(_job(deployment, spec, weight, now))
    served: dict[int, int] = defaultdict(int)
    for _ in range(70):  # everyone is still waiting after 70 dispatches
        claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=30)
        served[claimed.run[0].tenant_id] += 1
        await _finish(dispatch, claimed.run[0])
    assert served == {1: 10, 2: 20, 3: 40}
    await client.aclose()


async def test_a_tenant_arriving_late_goes_next_not_behind_the_backlog():
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    flood = [_job(deployment, Spec(1, "interactive", 4, 60, False), 1, now) for _ in range(30)]
    for job in flood:
        await dispatch.front.enqueue(job)
    for _ in range(10):
        claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=30)
        await _finish(dispatch, claimed.run[0])
    light = _job(deployment, Spec(2, "interactive", 4, 4, False), 1, now)
    await dispatch.front.enqueue(light)
    claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=30)
    assert [j.request_id for j in claimed.run] == [light.request_id]
    await client.aclose()


async def test_idle_time_earns_no_credit():
    """A tenant returning after idling shares from then on; it does not get a catch-up burst."""
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()

    async def enqueue(tenant: int, n: int) -> None:
        for _ in range(n):
            spec = Spec(tenant, "interactive", 2, 8, False)
            await dispatch.front.enqueue(_job(deployment, spec, 1, now))

    async def serve(n: int) -> list[int]:
        order = []
        for _ in range(n):
            claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=30)
            order.append(claimed.run[0].tenant_id)
            await _finish(dispatch, claimed.run[0])
        return order

    await enqueue(1, 50)
    await enqueue(2, 2)
    await serve(4)  # both served twice; tenant 2 goes idle
    await serve(30)  # tenant 1 alone
    await enqueue(2, 10)
    order = await serve(10)
    assert abs(order.count(1) - order.count(2)) <= 2
    await client.aclose()


async def test_counters_settle_to_tokens_used_not_tokens_reserved():
    """A tenant whose requests stop early is charged what they used, so it is not starved."""
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    # Tenant 1 reserves 100 tokens a request but uses 10; tenant 2 reserves and uses 10.
    for _ in range(20):
        await dispatch.front.enqueue(_job(deployment, Spec(1, "interactive", 1, 99, False), 1, now))
        await dispatch.front.enqueue(_job(deployment, Spec(2, "interactive", 1, 9, False), 1, now))
    served: dict[int, int] = defaultdict(int)
    for _ in range(20):
        claimed = await dispatch.leases.claim(deployment=deployment, count=1, lease_seconds=30)
        job = claimed.run[0]
        served[job.tenant_id] += 1
        await _finish(dispatch, job, used=9)
    assert abs(served[1] - served[2]) <= 2
    await client.aclose()


async def test_workers_claiming_at_once_share_one_order_and_never_double_dispatch():
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    jobs = [
        _job(deployment, Spec(1 + i % 3, "interactive", 2, 8, False), 1, now) for i in range(90)
    ]
    for job in jobs:
        await dispatch.front.enqueue(job)

    async def worker() -> list[str]:
        took: list[str] = []
        while True:
            claimed = await dispatch.leases.claim(deployment=deployment, count=3, lease_seconds=30)
            if not claimed.run:
                return took
            took.extend(j.request_id for j in claimed.run)

    results = await asyncio.gather(*(worker() for _ in range(4)))
    taken = [rid for took in results for rid in took]
    assert sorted(taken) == sorted(j.request_id for j in jobs)
    await client.aclose()


async def test_reserved_slots_go_only_to_tenants_with_nothing_running():
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    for _ in range(5):
        await dispatch.front.enqueue(_job(deployment, Spec(1, "interactive", 2, 8, False), 1, now))
    light = _job(deployment, Spec(2, "interactive", 2, 8, False), 1, now)
    await dispatch.front.enqueue(light)
    busy = frozenset({1})
    claimed = await dispatch.leases.claim(
        deployment=deployment, count=3, lease_seconds=30, skip_tenants=busy
    )
    assert [j.request_id for j in claimed.run] == [light.request_id]
    claimed = await dispatch.leases.claim(
        deployment=deployment, count=3, lease_seconds=30, skip_tenants=busy
    )
    assert claimed.run == []
    await client.aclose()


async def test_a_tenant_without_room_is_passed_over_and_takes_no_more_than_its_room():
    client = redis_client_new()
    dispatch = roles(client, reply_ttl=60)
    deployment = await _fresh_deployment(dispatch)
    now = time.time()
    flood = [_job(deployment, Spec(1, "interactive", 2, 8, False), 1, now) for _ in range(6)]
    light = [_job(deployment, Spec(2, "interactive", 2, 8, False), 1, now) for _ in range(2)]
    for job in [*flood, *light]:
        await dispatch.front.enqueue(job)
    # Tenant 1 is at its cap; any other tenant may take one more job.
    claimed = await dispatch.leases.claim(
        deployment=deployment, count=8, lease_seconds=30, room={1: 0}, room_default=1
    )
    assert [j.request_id for j in claimed.run] == [light[0].request_id]
    # Room for two of tenant 1's, none capped for the others: tenant 1 stops at two.
    claimed = await dispatch.leases.claim(
        deployment=deployment, count=8, lease_seconds=30, room={1: 2}
    )
    taken = [j.request_id for j in claimed.run]
    assert [rid for rid in taken if rid in {j.request_id for j in flood}] == [
        flood[0].request_id,
        flood[1].request_id,
    ]
    assert light[1].request_id in taken
    claimed = await dispatch.leases.claim(deployment=deployment, count=8, lease_seconds=30)
    assert [j.request_id for j in claimed.run] == [j.request_id for j in flood[2:]]
    await client.aclose()
