"""A real engine (vLLM on the demo model) whose engine-core process dies: the adapter says why
(a SIGKILL reads as the kernel's OOM killer) and starts a new engine in its place."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any, cast

import pytest

from dataplane.types import Sampling
from workers.engine import EngineSpec, VllmEngine


async def _answer(engine: VllmEngine, request_id: str) -> int:
    tokens = 0
    sampling = Sampling(max_tokens=4, ignore_eos=True, temperature=0.0)
    async for step in engine.generate(
        request_id=request_id, prompt_token_ids=[5, 6, 7, 8], sampling=sampling
    ):
        tokens += step.tokens
    return tokens


@pytest.fixture
async def engine(demo_model_dir: Path):
    spec = EngineSpec(
        model_dir=demo_model_dir,
        max_num_seqs=2,
        max_model_len=256,
        kv_cache_bytes=2 << 20,
        enforce_eager=True,
        dtype="float32",
        extra_args={},
    )
    started = VllmEngine(spec)
    await started.start()
    yield started
    started.shutdown()


async def test_an_engine_killed_by_sigkill_dies_of_oom_and_starts_again(engine):
    assert await _answer(engine, "before") == 4
    processes = engine._llm.engine_core.resources.engine_manager.processes
    assert processes
    for process in processes:
        os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        try:
            await engine.health()
        except Exception as exc:
            assert engine.death(exc) == "oom"
            break
        assert time.monotonic() < deadline, "the engine never reported its death"
        await asyncio.sleep(0.1)
    await engine.restart()
    await engine.health()
    assert await _answer(engine, "after") == 4


def test_a_health_error_that_is_not_a_death_names_none():
    unstarted = VllmEngine(cast(Any, None))
    assert unstarted.death(RuntimeError("the check timed out")) is None
