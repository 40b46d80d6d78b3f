"""Fairness inside the real engine: a worker (real Valkey, real vLLM on the demo model) under
one tenant's flood, asserted by the order the engine answers in, never by the clock.

The engine's step budget is made tiny (16 tokens), so a flood's prompts take hundreds of steps
to prefill and the order is the scheduler's, not a race. It is the same policy, budget split
and priorities a deployment's worker runs with (workers/services.py, workers/fairness.py).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from dataplane.redis_client import redis_client_new
from dataplane.types import Job, Sampling
from tests.dataplane.roles import Roles, roles
from workers.engine import EngineSpec, Step, VllmEngine
from workers.generative import GenerativeWorker

BUDGET = 16  # tokens a step: a 1,000-token prompt takes tens of steps beside others


class _Observed(VllmEngine):
    """The real engine, noting the order its requests reached it and gave their first token,
    and how often each was preempted."""

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self.submitted: list[str] = []
        self.first_tokens: list[str] = []
        self.preemptions: dict[str, int] = {}
        self.report_to(self)

    async def generate(self, **kwargs: Any) -> AsyncIterator[Step]:
        request_id = kwargs["request_id"]
        self.submitted.append(request_id)
        async for step in super().generate(**kwargs):
            if step.tokens and request_id not in self.first_tokens:
                self.first_tokens.append(request_id)
            yield step

    def finished(
        self, *, queued: float, prefill: float, decode: float, request_id: str, preemptions: int
    ) -> None:
        self.preemptions[request_id] = preemptions


@pytest.fixture(scope="module")
async def engine(demo_model_dir: Path) -> AsyncIterator[_Observed]:
    spec = EngineSpec(
        model_dir=demo_model_dir,
        max_num_seqs=8,
        max_model_len=2048,
        kv_cache_bytes=6 << 20,
        enforce_eager=True,
        dtype="float32",
        extra_args={},
        prefix_caching=False,  # every prompt computed: the steps are the scheduler's alone
        max_num_batched_tokens=BUDGET,
    )
    observed = _Observed(spec)
    await observed.start()
    yield observed
    observed.shutdown()


@pytest.fixture
async def dispatch() -> AsyncIterator[Roles]:
    client = redis_client_new()
    yield roles(client, reply_ttl=60)
    await client.aclose()


def _job(deployment: str, tenant: int, prompt: int, max_tokens: int) -> Job:
    now = time.time()
    rng = random.Random(f"{deployment}-{tenant}-{now}")
    return Job(
        request_id=uuid.uuid4().hex,
        tenant_id=tenant,
        api_key_id=1,
        deployment=deployment,
        model_version="v",
        endpoint="completions",
        prompt_token_ids=[rng.randrange(5, 4000) for _ in range(prompt)],
        sampling=Sampling(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
        enqueued_at=now,
        deadline=now + 300,
    )


async def _queued(dispatch: Roles, deployment: str, jobs: list[Job]) -> None:
    await dispatch.usage.ensure_groups(deployment)
    await dispatch.leases.heartbeat(deployment=deployment, worker="elsewhere", ttl=300)
    for job in jobs:
        assert await dispatch.front.enqueue(job) is None


async def _until(condition: Callable[[], bool], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _worker(dispatch: Roles, engine: _Observed, deployment: str) -> GenerativeWorker:
    block_size, _ = engine.kv_cache_blocks()
    return GenerativeWorker(
        deployment=deployment,
        engine=engine,
        client=dispatch.redis,
        reply_ttl=dispatch.reply_ttl,
        worker_id=uuid.uuid4().hex[:8],
        capacity=8,  # every claimed job goes to the engine at once: the order is its own
        lease_seconds=5.0,
        kv_block_size=block_size,
    )


def _tokens(engine: _Observed) -> int:
    block_size, blocks = engine.kv_cache_blocks()
    return block_size * blocks


async def test_a_newcomers_prompt_starts_before_a_floods_queued_prompts(engine, dispatch):
    deployment = f"fair-{uuid.uuid4().hex[:8]}"
    # Four long prompts of one tenant, fitting the KV cache together with the newcomer's.
    length = min(_tokens(engine) // 5, 1500)
    flood = [_job(deployment, 1, length, 2) for _ in range(4)]
    await _queued(dispatch, deployment, flood)
    worker = _worker(dispatch, engine, deployment)
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: {j.request_id for j in flood} <= set(engine.submitted))
        newcomer = _job(deployment, 2, 20, 2)
        await _queued(dispatch, deployment, [newcomer])
        everyone = [*flood, newcomer]
        await _until(lambda: {j.request_id for j in everyone} <= set(engine.first_tokens))
        # Hundreds of steps of the flood's prefill were still to come when the newcomer
        # arrived: its short prompt went ahead of all of them, and took its part of each step.
        assert engine.first_tokens.index(newcomer.request_id) == 0
    finally:
        worker.drain()
        await asyncio.wait_for(running, 120)


async def test_under_kv_pressure_the_floods_sequences_are_the_ones_preempted(engine, dispatch):
    deployment = f"fair-{uuid.uuid4().hex[:8]}"
    tokens = _tokens(engine)
    # Four sequences whose prompts fit the cache together and whose answers do not.
    prompt = tokens // 5
    answer = min(2048 - prompt, tokens // 2) - 1
    assert 4 * (prompt + answer) > tokens
    flood = [_job(deployment, 1, prompt, answer) for _ in range(3)]
    await _queued(dispatch, deployment, flood)
    worker = _worker(dispatch, engine, deployment)
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: {j.request_id for j in flood} <= set(engine.submitted))
        newcomer = _job(deployment, 2, prompt, answer)
        await _queued(dispatch, deployment, [newcomer])
        everyone = [*flood, newcomer]
        await _until(lambda: {j.request_id for j in everyone} <= engine.preemptions.keys())
        flood_preempted = sum(engine.preemptions[j.request_id] for j in flood)
        # The cache ran out: vLLM preempted, and only the flood's sequences.
        assert flood_preempted > 0
        assert engine.preemptions[newcomer.request_id] == 0
    finally:
        worker.drain()
        await asyncio.wait_for(running, 120)


def test_the_engine_runs_the_priority_policy_it_was_given(engine):
    config = engine._llm.vllm_config.scheduler_config
    assert config.policy == "priority"
    assert config.max_num_batched_tokens == BUDGET
    assert config.long_prefill_token_threshold == BUDGET // 8
    assert config.long_prefill_token_threshold_adaptive
