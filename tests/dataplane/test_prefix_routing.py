"""Prefix-aware routing against the real scripts in a real Valkey.

Two workers, `a` and `b`, serve a deployment. Jobs whose prompts share their first
PREFIX_TOKENS tokens meet on the worker that owns the prefix (rendezvous hashing), whoever
claims them, unless that worker is dead, draining, full or over the load bound. Handing a job
over changes who runs it, never the order in which jobs leave the queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dataplane.frontdoor import PREFIX_TOKENS, prefix_key
from dataplane.redis_client import ShardedSubscriber, redis_client_new
from dataplane.types import Failed, Finished, Job, Sampling, Status, usage_for
from tests.dataplane.roles import Roles, roles

WORKERS = ("a", "b")


@pytest.fixture
async def dispatch():
    client = redis_client_new()
    yield roles(client, reply_ttl=60)
    await client.aclose()


def _prompt(prefix: int, tail: int = 0) -> list[int]:
    """A prompt of PREFIX_TOKENS tokens of one prefix, then a few tokens of its own."""
    return [1000 + prefix] * PREFIX_TOKENS + [7, tail, tail + 1]


def _job(
    deployment: str,
    prompt: list[int],
    *,
    tenant: int = 1,
    timeout: float = 60.0,
    priority: str = "interactive",
    weight: float = 1.0,
    request_id: str | None = None,
) -> Job:
    now = time.time()
    return Job(
        request_id=request_id or uuid.uuid4().hex,
        tenant_id=tenant,
        api_key_id=1,
        deployment=deployment,
        model_version="v",
        endpoint="completions",
        prompt_token_ids=prompt,
        sampling=Sampling(max_tokens=8),
        priority=priority,
        weight=weight,
        enqueued_at=now,
        deadline=now + timeout,
    )


def _owner(prompt: list[int], workers: tuple[str, ...] = WORKERS) -> str:
    """The worker a prefix belongs to, computed as the claim script does."""
    key = prefix_key(_job("x", prompt))
    return max(workers, key=lambda w: int(hashlib.sha1(f"{key} {w}".encode()).hexdigest()[:12], 16))


def _prefix_owned_by(worker: str) -> int:
    return next(p for p in range(100) if _owner(_prompt(p)) == worker)


async def _deployment(dispatch: Roles, slots: dict[str, int] | None = None) -> str:
    """Return a fresh deployment served by workers a and b (8 shared slots each by default)."""
    deployment = f"px-{uuid.uuid4().hex[:8]}"
    await dispatch.usage.ensure_groups(deployment)
    for worker in WORKERS:
        shared = (slots or {}).get(worker, 8)
        await dispatch.leases.heartbeat(
            deployment=deployment, worker=worker, ttl=60, slots=(shared, 0)
        )
    return deployment


async def _claim(dispatch: Roles, deployment: str, worker: str, count: int = 1, **kw: Any):
    return await dispatch.leases.claim(
        deployment=deployment, count=count, lease_seconds=30, worker=worker, affinity=True, **kw
    )


async def _finish(dispatch: Roles, job: Job) -> None:
    usage = usage_for(job, status=Status.OK, finished_at=time.time(), completion_tokens=8)
    tokens = len(job.prompt_token_ids)
    done = Finished(finish_reason="length", prompt_tokens=tokens, completion_tokens=8)
    assert await dispatch.finisher.finalize(job=job, terminal=done, usage=usage)


async def _serve_one(dispatch: Roles, deployment: str, job: Job, claimer: str) -> str:
    """Queue a job, let `claimer` claim, then the other worker; return who runs it."""
    assert await dispatch.front.enqueue(job) is None
    for worker in (claimer, *(w for w in WORKERS if w != claimer)):
        claimed = await _claim(dispatch, deployment, worker)
        if claimed.run:
            assert [j.request_id for j in claimed.run] == [job.request_id]
            await _finish(dispatch, claimed.run[0])
            return worker
    raise AssertionError("nobody ran the job")


async def _held(dispatch: Roles, deployment: str) -> dict[str, int]:
    found: Any = await dispatch.redis.hgetall(f"sy:{{{deployment}}}:held")
    return {k.decode(): int(v) for k, v in found.items()}


def test_a_prefix_key_covers_the_first_block_only():
    long_a = _job("d", _prompt(1, tail=1))
    long_b = _job("d", _prompt(1, tail=50))
    assert prefix_key(long_a) == prefix_key(long_b) != ""
    assert prefix_key(long_a) != prefix_key(_job("d", _prompt(2)))
    assert prefix_key(_job("d", [5] * PREFIX_TOKENS)) == ""  # no full block before the last token
    adapted = Job(**{**_fields(long_a), "adapter": "f" * 64})
    assert prefix_key(adapted) not in ("", prefix_key(long_a))  # another adapter, another cache
    embeddings = Job(**{**_fields(long_a), "input_lengths": [len(long_a.prompt_token_ids)]})
    assert prefix_key(embeddings) == ""
    # The engine's cache is salted with the tenant (and the client's cache_salt): another
    # tenant's same prompt finds no blocks to share, so it has no reason to meet there.
    other_tenant = Job(**{**_fields(long_a), "tenant_id": 2})
    salted = Job(**{**_fields(long_a), "cache_salt": "u1"})
    keys = {prefix_key(long_a), prefix_key(other_tenant), prefix_key(salted)}
    assert len(keys) == 3 and "" not in keys
    assert (long_a.prefix_salt, other_tenant.prefix_salt, salted.prefix_salt) == ("1", "2", "1:u1")


def _fields(job: Job) -> dict[str, Any]:
    return {f: getattr(job, f) for f in job.__struct_fields__}


async def test_same_prefix_jobs_claimed_by_either_worker_all_run_on_its_owner(dispatch):
    deployment = await _deployment(dispatch)
    prefix = 3
    served = [
        await _serve_one(dispatch, deployment, _job(deployment, _prompt(prefix, i)), claimer)
        for i, claimer in enumerate(WORKERS * 6)
    ]
    assert served == [_owner(_prompt(prefix))] * 12
    assert await _held(dispatch, deployment) == {"a": 0, "b": 0}


async def test_different_prefixes_spread_over_both_workers(dispatch):
    deployment = await _deployment(dispatch)
    served = {
        p: await _serve_one(dispatch, deployment, _job(deployment, _prompt(p)), WORKERS[p % 2])
        for p in range(16)
    }
    assert served == {p: _owner(_prompt(p)) for p in range(16)}
    assert set(served.values()) == set(WORKERS)


async def test_short_prompts_run_on_the_worker_that_claims_them(dispatch):
    deployment = await _deployment(dispatch)
    for claimer in WORKERS * 3:
        job = _job(deployment, [1, 2, 3])
        assert await _serve_one(dispatch, deployment, job, claimer) == claimer


async def test_a_handed_job_wakes_its_owner_on_its_channel(dispatch):
    deployment = await _deployment(dispatch)
    prompt = _prompt(_prefix_owned_by("b"))
    pubsub = ShardedSubscriber(dispatch.redis)
    await pubsub.subscribe(f"sy:{{{deployment}}}:handoff:b")
    job = _job(deployment, prompt)
    await dispatch.front.enqueue(job)
    assert (await _claim(dispatch, deployment, "a")).run == []
    message = None
    for _ in range(20):  # the subscription's confirmation comes first, read as None
        message = message or await pubsub.message(timeout=0.1)
    assert message == (f"sy:{{{deployment}}}:handoff:b", job.request_id.encode())
    await pubsub.aclose()


async def test_a_full_owner_leaves_the_job_to_the_claimer(dispatch):
    deployment = await _deployment(dispatch, slots={"b": 1})
    prompt = _prompt(_prefix_owned_by("b"))
    busy = _job(deployment, prompt, tenant=2)
    assert await _serve_one(dispatch, deployment, _job(deployment, prompt), "a") == "b"
    await dispatch.front.enqueue(busy)
    assert [j.request_id for j in (await _claim(dispatch, deployment, "b")).run] == [
        busy.request_id
    ]
    # b's one slot is taken: a runs the next job of b's prefix itself.
    assert await _serve_one(dispatch, deployment, _job(deployment, prompt), "a") == "a"


async def test_an_owner_over_the_load_bound_leaves_the_job_to_the_claimer(dispatch):
    deployment = await _deployment(dispatch)
    queued = [_job(deployment, _prompt(_prefix_owned_by("b"), i)) for i in range(3)]
    for job in queued:
        await dispatch.front.enqueue(job)
    # Nothing else runs: b takes two, then a third would put it over ceil(1.25 * 3 / 2) = 2.
    ran_on_a = [j.request_id for j in (await _claim(dispatch, deployment, "a")).run]
    taken_by_b = [j.request_id for j in (await _claim(dispatch, deployment, "b", count=8)).run]
    assert taken_by_b == [queued[0].request_id, queued[1].request_id]
    assert ran_on_a == [queued[2].request_id]
    assert await _held(dispatch, deployment) == {"a": 1, "b": 2}


async def test_a_dead_or_draining_owner_leaves_the_job_to_the_claimer(dispatch):
    deployment = await _deployment(dispatch)
    prompt = _prompt(_prefix_owned_by("b"))
    await dispatch.leases.heartbeat(
        deployment=deployment, worker="b", ttl=60, slots=(0, 0)
    )  # draining
    assert await _serve_one(dispatch, deployment, _job(deployment, prompt), "a") == "a"
    await dispatch.leases.heartbeat(deployment=deployment, worker="b", ttl=0.05, slots=(8, 0))
    await asyncio.sleep(0.1)  # b's heartbeat lapsed
    assert await _serve_one(dispatch, deployment, _job(deployment, prompt), "a") == "a"
    await dispatch.leases.heartbeat(deployment=deployment, worker="b", ttl=60, slots=(8, 0))
    assert await _serve_one(dispatch, deployment, _job(deployment, prompt), "a") == "b"


async def test_a_handed_job_that_is_never_taken_is_reaped_and_runs_elsewhere(dispatch):
    deployment = await _deployment(dispatch)
    job = _job(deployment, _prompt(_prefix_owned_by("b")))
    await dispatch.front.enqueue(job)
    claimed = await dispatch.leases.claim(
        deployment=deployment, count=1, lease_seconds=0.1, worker="a", affinity=True
    )
    assert claimed.run == []
    assert await _held(dispatch, deployment) == {"a": 0, "b": 1}
    await asyncio.sleep(0.2)  # b never took it: its lease lapsed
    assert await dispatch.reaper.reclaim_expired(deployment=deployment) == 1
    assert await _held(dispatch, deployment) == {"a": 0, "b": 0}
    # Back at the head of the queue; b, asking now, runs it once.
    assert [j.request_id for j in (await _claim(dispatch, deployment, "b")).run] == [job.request_id]
    assert (await _claim(dispatch, deployment, "b")).run == []


async def test_a_handed_job_can_be_cancelled_before_and_after_its_owner_takes_it(dispatch):
    deployment = await _deployment(dispatch)
    job = _job(deployment, _prompt(_prefix_owned_by("b")))
    await dispatch.front.enqueue(job)
    assert (await _claim(dispatch, deployment, "a")).run == []
    where = await dispatch.front.whereabouts(job.request_id)
    assert where is not None and where.deployment == deployment
    # Leased to b: the cancel is flagged for b, which aborts it when it takes it.
    assert await dispatch.front.cancel_by_id(where=where, request_id=job.request_id)
    claimed = await _claim(dispatch, deployment, "b")
    assert [j.request_id for j in claimed.run] == [job.request_id]
    assert claimed.cancelled == {job.request_id}
    usage = usage_for(job, status=Status.CANCELLED, finished_at=time.time())
    ended = Failed(code="cancelled", message="cancelled", prompt_tokens=3, completion_tokens=0)
    assert await dispatch.finisher.finalize(job=job, terminal=ended, usage=usage)
    assert await _held(dispatch, deployment) == {"a": 0, "b": 0}
    for key in ("holders", "handoffs", "prefixes", "leases", "jobs"):
        assert not await dispatch.redis.exists(f"sy:{{{deployment}}}:{key}"), key


async def test_a_worker_that_stops_claiming_returns_the_jobs_handed_to_it(dispatch):
    deployment = await _deployment(dispatch)
    job = _job(deployment, _prompt(_prefix_owned_by("b")))
    await dispatch.front.enqueue(job)
    assert (await _claim(dispatch, deployment, "a")).run == []
    await dispatch.leases.heartbeat(deployment=deployment, worker="b", ttl=60, slots=(0, 0))
    assert await dispatch.leases.handoffs_return(deployment=deployment, worker="b") == 1
    assert [j.request_id for j in (await _claim(dispatch, deployment, "a")).run] == [job.request_id]
    assert (await _claim(dispatch, deployment, "b")).run == []


async def test_a_handed_job_whose_deadline_passes_before_it_is_taken_never_runs(dispatch):
    deployment = await _deployment(dispatch)
    job = _job(deployment, _prompt(_prefix_owned_by("b")), timeout=0.2)
    await dispatch.front.enqueue(job)
    assert (await _claim(dispatch, deployment, "a")).run == []
    await asyncio.sleep(0.3)
    claimed = await _claim(dispatch, deployment, "b")
    assert claimed.run == [] and [j.request_id for j in claimed.expired] == [job.request_id]


async def test_workers_claiming_at_once_with_affinity_run_each_job_once(dispatch):
    deployment = await _deployment(dispatch, slots={"a": 64, "b": 64})
    jobs = [_job(deployment, _prompt(i % 3, i), tenant=1 + i % 2) for i in range(60)]
    for job in jobs:
        await dispatch.front.enqueue(job)

    async def worker(name: str) -> list[str]:
        took: list[str] = []
        while True:
            claimed = await _claim(dispatch, deployment, name, count=3)
            took.extend(j.request_id for j in claimed.run)
            for job in claimed.run:
                await _finish(dispatch, job)
            # Queue first: once it is empty, nothing more can be handed to anyone.
            if (
                not claimed.run
                and not (await dispatch.depth(deployment)).requests
                and not await dispatch.redis.exists(f"sy:{{{deployment}}}:handoffs")
            ):
                return took

    results = await asyncio.gather(*(worker(w) for w in WORKERS * 2))
    taken = [rid for took in results for rid in took]
    assert sorted(taken) == sorted(j.request_id for j in jobs)


# --- the fair order does not change ------------------------------------------------------


async def _dequeue_order(specs: list[tuple[int, str, int, bool]], affinity: bool) -> list[str]:
    """Queue the jobs, drain them one claim at a time; return the order they left the queue.

    With affinity, `a` claims and `b` takes what `a` handed it before `a` claims again: one of
    a's claims dequeues the jobs it handed over (in that order), then the one it keeps.
    """
    client = redis_client_new()
    try:
        dispatch = roles(client, reply_ttl=60)
        deployment = await _deployment(dispatch)
        now = time.time()
        jobs = []
        for i, (tenant, priority, prefix, expired) in enumerate(specs):
            job = _job(
                deployment,
                _prompt(prefix, i),
                tenant=tenant,
                priority=priority,
                weight=tenant,
                request_id=f"job-{i:03d}",
            )
            if expired:
                job = Job(**{**_fields(job), "deadline": now - 1})
            jobs.append(job)
            assert await dispatch.front.enqueue(job) is None
        order: list[str] = []
        for _ in range(len(jobs) + 1):
            claimed = await dispatch.leases.claim(
                deployment=deployment, count=1, lease_seconds=30, worker="a", affinity=affinity
            )
            handed: Any = await client.hgetall(f"sy:{{{deployment}}}:handoffs")
            if handed:
                taken = await _claim(dispatch, deployment, "b", count=len(handed))
                order.extend(j.request_id for j in taken.run)
                for job in taken.run:
                    await _finish(dispatch, job)
            order.extend(j.request_id for j in claimed.run)
            for job in claimed.run:
                await _finish(dispatch, job)
            for job in claimed.expired:
                usage = usage_for(job, status=Status.TIMEOUT, finished_at=time.time())
                ended = Failed(code="expired", message="", prompt_tokens=0, completion_tokens=0)
                await dispatch.finisher.finalize(
                    job=job, terminal=ended, usage=usage, charged=False
                )
            if not claimed.run and not claimed.expired and not handed:
                break
        return order
    finally:
        await client.aclose()


@hsettings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(
        st.tuples(
            st.integers(1, 3),
            st.sampled_from(["interactive"] * 3 + ["batch"]),
            st.integers(0, 4),
            st.sampled_from([False] * 7 + [True]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_handing_jobs_over_never_changes_the_order_they_leave_the_queue(specs):
    plain = asyncio.run(_dequeue_order(specs, affinity=False))
    routed = asyncio.run(_dequeue_order(specs, affinity=True))
    assert routed == plain
    assert len(set(routed)) == len(routed)
