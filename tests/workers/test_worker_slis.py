"""What a worker counts for the SLIs: its engine's idle seconds, its engine time and tokens per
version, and each dead engine it starts again (why it died), against a real Valkey."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import msgspec
import pytest
from prometheus_client import REGISTRY

from dataplane.keys import heartbeats_key
from dataplane.redis_client import redis_client_new
from dataplane.types import Job, Status, usage_for
from tests.jobs import job_new
from workers.engine import engine_death_reason
from workers.metrics import WorkerMetrics
from workers.runner import Worker, _IdleClock


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _until_async(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "never came true"
        await asyncio.sleep(0.02)


# --- idle seconds ----------------------------------------------------------------------------


def test_the_idle_clock_counts_only_the_time_nothing_ran(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    counted: list[float] = []
    clock = _IdleClock(counted.append)
    now[0] = 103.0
    clock.running(1)  # idle since it was made: 3 s
    now[0] = 110.0
    clock.running(2)  # busy throughout
    now[0] = 111.0
    clock.running(0)  # the last request ended: idle from here
    now[0] = 115.0
    clock.running(0)  # a heartbeat counts the idle time so far
    assert counted == [3.0, 4.0]


class _Engine:
    """An engine that can die: its health check then raises until it is started again."""

    def __init__(
        self,
        *,
        exit_code: int | None = None,
        starts: bool = True,
        hold: asyncio.Event | None = None,
    ) -> None:
        self.dead = False
        self.exit_code = exit_code
        self.starts = starts
        self.restarts = 0
        self.hold = hold  # a restart waits for it: the engine takes its time to start

    async def health(self) -> None:
        if self.dead:
            raise RuntimeError("EngineCore encountered an issue")

    def kv_cache_usage(self) -> float | None:
        return 0.0

    def death(self, error: BaseException) -> str | None:
        if self.exit_code is None:
            return None  # the check failed, but the engine lives
        return engine_death_reason([self.exit_code], error)

    async def restart(self) -> None:
        self.restarts += 1
        if self.hold is not None:
            await self.hold.wait()
        if not self.starts:
            raise RuntimeError("no memory left to load the model")
        self.dead = False


class _IdleWorker(Worker):
    async def _serve(self, job: Job) -> None:
        raise AssertionError("nothing is queued")


@pytest.fixture
async def redis():
    client = redis_client_new()
    yield client
    await client.aclose()


def _worker(redis, engine: _Engine, deployment: str) -> _IdleWorker:
    return _IdleWorker(
        deployment=deployment,
        engine=engine,
        client=redis,
        worker_id=uuid.uuid4().hex[:8],
        capacity=1,
        lease_seconds=1.0,
        metrics=WorkerMetrics(deployment=deployment),
    )


async def test_a_worker_with_nothing_to_run_counts_idle_seconds(redis, settings):
    settings.ROUNDHOUSE_ZONE = "zone-a"
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    worker = _worker(redis, _Engine(), deployment)
    running = asyncio.create_task(worker.run())
    try:
        labels = {"deployment": deployment, "zone": "zone-a"}
        await _until(lambda: _value("roundhouse_worker_idle_seconds_total", **labels) > 0)
    finally:
        worker.drain()
        await asyncio.wait_for(running, 20)


# --- engine restarts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_codes", "error", "reason"),
    [
        ([-9], RuntimeError("EngineCore encountered an issue"), "oom"),
        ([137], None, "oom"),
        ([1], RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        ([None], RuntimeError("engine died"), "crash"),
        ([1], RuntimeError("illegal memory access"), "crash"),
        ([-11], None, "crash"),
    ],
)
def test_an_engines_death_is_classified_oom_or_crash(exit_codes, error, reason):
    assert engine_death_reason(exit_codes, error) == reason


def test_an_out_of_memory_error_is_found_among_the_causes():
    try:
        try:
            raise MemoryError("torch.OutOfMemoryError: out of memory")
        except MemoryError as cause:
            raise RuntimeError("EngineCore encountered an issue") from cause
    except RuntimeError as error:
        assert engine_death_reason([1], error) == "oom"


async def test_a_dead_engine_is_started_again_and_counted_with_its_reason(redis, settings):
    settings.ROUNDHOUSE_ZONE = "zone-b"
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    engine = _Engine(exit_code=-9)
    worker = _worker(redis, engine, deployment)
    labels = {"deployment": deployment, "zone": "zone-b"}
    running = asyncio.create_task(worker.run())
    try:
        engine.dead = True
        await _until(lambda: engine.restarts == 1)
        assert _value("roundhouse_engine_restarts_total", **labels, reason="oom") == 1
        assert _value("roundhouse_engine_restarts_total", **labels, reason="crash") == 0
        assert worker._slots() == (1, 0)  # claiming again
    finally:
        worker.drain()
        await asyncio.wait_for(running, 20)


async def test_a_worker_is_out_of_the_live_set_while_its_engine_starts_again(redis):
    """So that a deployment with no other worker refuses at once (and an alias falls back)
    instead of queueing requests behind the restart."""
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    started = asyncio.Event()
    engine = _Engine(exit_code=-9, hold=started)
    worker = _worker(redis, engine, deployment)
    running = asyncio.create_task(worker.run())

    async def live() -> bool:
        return await redis.zscore(heartbeats_key(deployment), worker.worker_id) is not None

    try:
        await _until_async(live)
        engine.dead = True
        await _until(lambda: engine.restarts == 1)
        assert not await live() and worker._slots() == (0, 0)
        await asyncio.sleep(1.0)  # a lease's worth of heartbeats would have come meanwhile
        assert not await live()
        started.set()
        await _until_async(live)
        assert worker._slots() == (1, 0)
    finally:
        started.set()
        worker.drain()
        await asyncio.wait_for(running, 20)


async def test_an_engine_that_does_not_start_again_drains_its_worker(redis):
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    engine = _Engine(exit_code=1, starts=False)
    worker = _worker(redis, engine, deployment)
    running = asyncio.create_task(worker.run())
    engine.dead = True
    await asyncio.wait_for(running, 20)  # it left by itself
    assert engine.restarts == 1
    labels = {"deployment": deployment, "zone": "", "reason": "crash"}
    assert _value("roundhouse_engine_restarts_total", **labels) == 1


async def test_a_failed_health_check_of_a_live_engine_restarts_nothing(redis):
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    engine = _Engine(exit_code=None)
    worker = _worker(redis, engine, deployment)
    before = _value("roundhouse_loop_failures_total", loop="heartbeat")
    running = asyncio.create_task(worker.run())
    try:
        engine.dead = True
        await _until(lambda: _value("roundhouse_loop_failures_total", loop="heartbeat") > before)
        assert engine.restarts == 0
        assert (
            _value(
                "roundhouse_engine_restarts_total", deployment=deployment, zone="", reason="crash"
            )
            == 0
        )
    finally:
        engine.dead = False
        worker.drain()
        await asyncio.wait_for(running, 20)


# --- engine seconds and tokens per version ---------------------------------------------------


def test_a_request_counts_its_engine_seconds_and_tokens_against_its_version(settings):
    settings.ROUNDHOUSE_ZONE = "zone-c"
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    metrics = WorkerMetrics(deployment=deployment)
    job = msgspec.structs.replace(job_new(deployment, prompt=[1] * 10), model_version="v2")
    usage = usage_for(
        job,
        status=Status.OK,
        started_at=job.enqueued_at + 1.0,
        finished_at=job.enqueued_at + 3.5,
        completion_tokens=30,
    )
    metrics.request_ended(job, usage)
    labels = {"deployment": deployment, "version": "v2", "zone": "zone-c"}
    assert _value("roundhouse_engine_seconds_total", **labels) == pytest.approx(2.5)
    assert _value("roundhouse_served_tokens_total", **labels) == 40


def test_a_request_that_never_started_costs_no_engine_time(settings):
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    metrics = WorkerMetrics(deployment=deployment)
    job = job_new(deployment)
    usage = usage_for(job, status=Status.TIMEOUT, finished_at=job.enqueued_at + 9.0)
    metrics.request_ended(job, usage)
    labels = {"deployment": deployment, "version": job.model_version, "zone": ""}
    assert _value("roundhouse_engine_seconds_total", **labels) == 0
    assert _value("roundhouse_served_tokens_total", **labels) == 0


def test_a_workers_restart_series_start_at_zero_so_the_first_restart_is_an_increase():
    deployment = f"w-{uuid.uuid4().hex[:8]}"
    WorkerMetrics(deployment=deployment)
    for reason in ("crash", "oom"):
        labels = {"deployment": deployment, "zone": "", "reason": reason}
        assert REGISTRY.get_sample_value("roundhouse_engine_restarts_total", labels) == 0
