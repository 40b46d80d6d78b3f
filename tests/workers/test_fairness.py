"""Fairness inside a worker: the engine priority each request gets, the prefill chunk, and the
per-tenant caps on what a tenant holds, through a real worker loop and a real Valkey.

The engine here is a stand-in that holds each request until the test lets it go (the boundary
with vLLM); tests/workers/test_engine_fairness.py runs the real engine.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aredis
from prometheus_client import REGISTRY

from dataplane.redis_client import redis_client_new
from dataplane.types import Job, Sampling
from tests.dataplane.roles import Roles, roles
from tests.jobs import job_new
from workers.engine import AdapterRef, EngineSpec, Step, _scheduling_args
from workers.fairness import (
    BATCH_PRIORITY,
    PRIORITY_SHARES,
    TenantCaps,
    engine_priority,
    kv_blocks,
    prefill_chunk_tokens,
    tenant_caps,
)
from workers.generative import GenerativeWorker
from workers.metrics import WorkerMetrics

# --- the priority ---------------------------------------------------------------------


def test_a_tenant_with_nothing_running_goes_before_a_flooding_tenants_next_request():
    # 28 of the flood's sequences run beside one of the light tenant's.
    flood_next = engine_priority(priority_class="interactive", tenant_seqs=29, all_seqs=30)
    newcomer = engine_priority(priority_class="interactive", tenant_seqs=1, all_seqs=30)
    assert newcomer < flood_next
    assert flood_next == 966
    assert newcomer == 33


def test_the_priority_is_the_tenants_share_in_thousandths_over_its_weight():
    assert engine_priority(priority_class="interactive", tenant_seqs=1, all_seqs=4) == 250
    assert engine_priority(priority_class="interactive", tenant_seqs=1, all_seqs=4, weight=2) == 125
    assert engine_priority(priority_class="interactive", tenant_seqs=4, all_seqs=4) == 1000
    # A weight below one cannot push a share past the whole.
    half = engine_priority(priority_class="interactive", tenant_seqs=4, all_seqs=4, weight=0.5)
    assert half == PRIORITY_SHARES


def test_batch_work_comes_after_every_interactive_request_whatever_the_shares():
    batch_alone = engine_priority(priority_class="batch", tenant_seqs=1, all_seqs=64)
    flood = engine_priority(priority_class="interactive", tenant_seqs=64, all_seqs=64)
    assert batch_alone > flood
    assert batch_alone == BATCH_PRIORITY + 15


# --- the prefill chunk and the engine's scheduling arguments ----------------------------


def _spec(**kw: Any) -> EngineSpec:
    base: dict[str, Any] = dict(
        model_dir=Path("/nowhere"),
        max_num_seqs=32,
        max_model_len=2048,
        kv_cache_bytes=1 << 20,
        enforce_eager=True,
        dtype="float32",
        extra_args={},
        max_num_batched_tokens=2048,
    )
    return EngineSpec(**{**base, **kw})


def test_a_step_holds_a_chunk_of_every_sequence_the_engine_may_run():
    chunk = prefill_chunk_tokens(budget=2048, max_num_seqs=32)
    assert chunk * 32 <= 2048
    assert chunk == 64
    assert prefill_chunk_tokens(budget=8, max_num_seqs=32) == 1


def test_the_engine_schedules_by_priority_with_its_step_budget_and_prefill_chunk():
    args = _scheduling_args(_spec())
    # The release the platform pins raises the chunk to the step's fair share.
    assert args == {
        "scheduling_policy": "priority",
        "max_num_batched_tokens": 2048,
        "long_prefill_token_threshold": 64,
        "long_prefill_token_threshold_adaptive": True,
    }
    assert _scheduling_args(_spec(prefill_chunk_tokens=0)) == {
        "scheduling_policy": "priority",
        "max_num_batched_tokens": 2048,
    }
    # A chunk longer than the context is cut to it (vLLM refuses more).
    chunked = _scheduling_args(_spec(prefill_chunk_tokens=4096, max_model_len=512))
    assert chunked["long_prefill_token_threshold"] == 512


def test_an_older_vllm_gets_no_chunk_unless_one_is_configured(monkeypatch):
    from workers import engine

    monkeypatch.setattr(engine, "adaptive_prefill_chunks", lambda: False)
    assert "long_prefill_token_threshold" not in _scheduling_args(_spec())
    configured = _scheduling_args(_spec(prefill_chunk_tokens=256))
    assert configured["long_prefill_token_threshold"] == 256
    assert "long_prefill_token_threshold_adaptive" not in configured


def test_the_worker_plan_enables_priority_scheduling_and_a_version_may_say_otherwise(
    world, settings
):
    from workers.services import _scheduling

    settings.ROUNDHOUSE_ENGINE_MAX_BATCHED_TOKENS = 1024
    extra: dict[str, Any] = {"enforce_eager": True}
    assert _scheduling(extra, max_num_seqs=32) == {
        "scheduling_policy": "priority",
        "max_num_batched_tokens": 1024,
        "prefill_chunk_tokens": None,
    }
    # The version's registered arguments win, and leave the ones vLLM takes as they are.
    extra = {"scheduling_policy": "fcfs", "long_prefill_token_threshold": 128, "x": 1}
    assert _scheduling(extra, max_num_seqs=32) == {
        "scheduling_policy": "fcfs",
        "max_num_batched_tokens": 1024,
        "prefill_chunk_tokens": 128,
    }
    assert extra == {"x": 1}
    # vLLM needs a budget of at least max_num_seqs tokens.
    settings.ROUNDHOUSE_ENGINE_MAX_BATCHED_TOKENS = 8
    assert _scheduling({}, max_num_seqs=32)["max_num_batched_tokens"] == 32


# --- caps -----------------------------------------------------------------------------


def test_kv_blocks_count_each_sequences_partial_block():
    assert kv_blocks([16, 17, 1, 0], block_size=16) == 1 + 2 + 1


def test_a_tenant_at_a_cap_has_no_room_and_below_it_as_many_jobs_as_sequences_left():
    caps = TenantCaps(seqs=4, kv_blocks=10)
    assert caps.room(seqs=1, kv_blocks=3) == 3
    assert caps.room(seqs=4, kv_blocks=3) == 0
    assert caps.room(seqs=6, kv_blocks=3) == 0  # past it by one job's choices
    assert caps.room(seqs=1, kv_blocks=10) == 0
    assert TenantCaps().room(seqs=100, kv_blocks=100) is None
    assert TenantCaps(kv_blocks=10).room(seqs=100, kv_blocks=9) is None


def test_caps_are_shares_of_the_engine_and_a_whole_share_is_none():
    assert tenant_caps(
        max_num_seqs=32, kv_blocks_total=1000, seqs_share=0.75, kv_share=0.5
    ) == TenantCaps(seqs=24, kv_blocks=500)
    assert (
        tenant_caps(max_num_seqs=32, kv_blocks_total=1000, seqs_share=1, kv_share=1.5)
        == TenantCaps()
    )
    # Never below one sequence and one block; no KV cap before the engine knows its blocks.
    assert tenant_caps(
        max_num_seqs=2, kv_blocks_total=0, seqs_share=0.1, kv_share=0.1
    ) == TenantCaps(seqs=1)


# --- through a worker loop, against a real Valkey ---------------------------------------


class _HeldEngine:
    """Holds each request after its first step until the test lets it go; records each
    request's priority and the order requests reached it."""

    prefix_caching = False

    def __init__(self) -> None:
        self.started: list[str] = []
        self.priority: dict[str, int] = {}
        self.running: set[str] = set()
        self.release: dict[str, asyncio.Event] = {}

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        adapter: AdapterRef | None = None,
        cache_salt: str = "",
        prompt_ranked: bool = True,
        priority: int = 0,
    ) -> AsyncIterator[Step]:
        self.started.append(request_id)
        self.priority[request_id] = priority
        self.running.add(request_id)
        gate = self.release.setdefault(request_id, asyncio.Event())
        try:
            yield Step(text=" a", tokens=1, finish_reason=None, prompt_tokens=len(prompt_token_ids))
            await gate.wait()
            yield Step(text=" b", tokens=1, finish_reason="length", prompt_tokens=0)
        finally:
            self.running.discard(request_id)

    def let_go(self, request_id: str) -> None:
        self.release.setdefault(request_id, asyncio.Event()).set()

    def tokenizer(self) -> Any:
        return None

    def model_config(self) -> Any:
        return None

    async def health(self) -> None:
        return None

    def kv_cache_usage(self) -> float | None:
        return 0.0


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def dispatch():
    client = redis_client_new()
    yield roles(client, reply_ttl=60)
    await client.aclose()


def _worker(dispatch: Roles, engine: _HeldEngine, deployment: str, **kw: Any) -> GenerativeWorker:
    return GenerativeWorker(
        deployment=deployment,
        engine=engine,  # type: ignore[arg-type]
        client=dispatch.redis,
        reply_ttl=dispatch.reply_ttl,
        worker_id=uuid.uuid4().hex[:8],
        lease_seconds=1.0,
        **{"capacity": 8, **kw},
    )


def _job(deployment: str, tenant: int, **kw: Any) -> Job:
    return job_new(deployment, tenant=tenant, max_tokens=2, **kw)


async def _queued(dispatch: Roles, deployment: str, jobs: list[Job]) -> None:
    """Queue jobs for a deployment whose worker may not have started yet (another worker's
    heartbeat keeps it alive for admission)."""
    await dispatch.usage.ensure_groups(deployment)
    await dispatch.leases.heartbeat(deployment=deployment, worker="elsewhere", ttl=60)
    for job in jobs:
        assert await dispatch.front.enqueue(job) is None


async def test_a_newcomer_tenant_gets_a_lower_priority_than_the_flood_beside_it(dispatch):
    deployment = f"fair-{uuid.uuid4().hex[:8]}"
    engine = _HeldEngine()
    worker = _worker(dispatch, engine, deployment)
    flood = [_job(deployment, 1) for _ in range(4)]
    await _queued(dispatch, deployment, flood)
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: len(engine.started) == 4)
        light = _job(deployment, 2)
        batch = _job(deployment, 3, priority="batch")
        await _queued(dispatch, deployment, [light, batch])
        await _until(lambda: len(engine.started) == 6)
        flood_priorities = [engine.priority[job.request_id] for job in flood]
        # The flood's share of the worker: all of it, however its jobs were claimed.
        assert min(flood_priorities) == PRIORITY_SHARES
        # The light tenant, one sequence of five or six: ahead of the flood's every request.
        assert engine.priority[light.request_id] < min(flood_priorities)
        assert engine.priority[batch.request_id] > max(flood_priorities)
    finally:
        for rid in engine.started:
            engine.let_go(rid)
        worker.drain()
        await asyncio.wait_for(running, 20)


async def test_a_tenant_at_its_sequence_cap_waits_while_other_tenants_start(dispatch):
    deployment = f"fair-{uuid.uuid4().hex[:8]}"
    engine = _HeldEngine()
    worker = _worker(dispatch, engine, deployment, caps=TenantCaps(seqs=2))
    flood = [_job(deployment, 1) for _ in range(5)]
    await _queued(dispatch, deployment, flood)
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: len(engine.started) == 2)
        light = _job(deployment, 2)
        await _queued(dispatch, deployment, [light])
        await _until(lambda: light.request_id in engine.started)
        # Eight slots, and the flood still runs two: the rest of its jobs wait in the queue.
        assert engine.started == [flood[0].request_id, flood[1].request_id, light.request_id]
        assert (await dispatch.depth(deployment)).requests == 3
        # One of the flood's ends: the next one starts, and never a third at once.
        engine.let_go(flood[0].request_id)
        await _until(lambda: flood[2].request_id in engine.started)
        assert len(engine.running & {job.request_id for job in flood}) == 2
        for job in flood:
            engine.let_go(job.request_id)
        await _until(lambda: len(engine.started) == 6)
    finally:
        for rid in engine.started:
            engine.let_go(rid)
        worker.drain()
        await asyncio.wait_for(running, 20)


async def test_a_tenant_at_its_kv_cap_waits_and_its_blocks_are_exported(dispatch):
    deployment = f"fair-{uuid.uuid4().hex[:8]}"
    engine = _HeldEngine()
    metrics = WorkerMetrics(deployment=deployment, slugs_of=lambda ids: {i: f"t{i}" for i in ids})
    # 48-token prompts: three blocks of 16 each, four once a token is out.
    worker = _worker(
        dispatch,
        engine,
        deployment,
        caps=TenantCaps(kv_blocks=8),
        kv_block_size=16,
        metrics=metrics,
    )

    def exported(tenant: str) -> float | None:
        return REGISTRY.get_sample_value(
            "roundhouse_worker_tenant_kv_blocks", {"deployment": deployment, "tenant": tenant}
        )

    flood = [_job(deployment, 1, prompt=[5] * 48) for _ in range(4)]
    await _queued(dispatch, deployment, flood)
    running = asyncio.create_task(worker.run())
    try:
        # Taken in one claim while tenant 1 held nothing; 16 blocks once each has a token.
        await _until(lambda: len(engine.started) == 4)
        light = _job(deployment, 2, prompt=[5] * 20)
        await _queued(dispatch, deployment, [light])
        await _until(lambda: exported("t1") == 16 and exported("t2") == 2)
        # Tenant 1 is past its 8 blocks: a claim passes its next job over, and takes the job
        # another tenant queued after it.
        more = _job(deployment, 1, prompt=[5] * 48)
        after = _job(deployment, 2)
        await _queued(dispatch, deployment, [more, after])
        await _until(lambda: after.request_id in engine.started)
        assert more.request_id not in engine.started
        for job in flood[:3]:
            engine.let_go(job.request_id)
        # Four blocks left (one run of 49 tokens): under the cap, so its next job starts.
        await _until(lambda: more.request_id in engine.started)
        await _until(lambda: exported("t1") == 8)
    finally:
        for rid in engine.started:
            engine.let_go(rid)
        worker.drain()
        await asyncio.wait_for(running, 20)
    # A tenant that holds nothing leaves the series.
    metrics.tenants_held({})
    assert exported("t1") is None


def test_a_job_with_several_choices_counts_each_sequence():
    job = msgspec.structs.replace(
        job_new("d", tenant=1, prompt=[1] * 20), sampling=Sampling(max_tokens=4, n=3)
    )
    worker = GenerativeWorker(
        deployment="d",
        engine=_HeldEngine(),  # type: ignore[arg-type]
        client=aredis.Redis(),  # never reached: nothing is claimed
        worker_id="w",
        capacity=4,
        lease_seconds=1.0,
        kv_block_size=16,
    )
    worker.active[job.request_id] = (job, None)  # type: ignore[assignment]
    # Three sequences of a 20-token prompt, not yet started: two blocks each.
    assert worker.tenant_loads() == {1: (3, 6)}
