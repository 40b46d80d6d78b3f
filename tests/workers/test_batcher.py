"""The dynamic batcher's decisions, over a compute function that records what it was given."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import pytest

from workers.batcher import CostModel, DeadlineUnattainable, DynamicBatcher


class Recorder:
    """A compute function: returns each input's length as its vector and remembers batches."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.batches: list[list[int]] = []

    def __call__(self, batch: list[list[int]]) -> list[bytes]:
        self.batches.append([len(ids) for ids in batch])
        if self.seconds:
            time.sleep(self.seconds)
        return [struct.pack("<f", len(ids)) for ids in batch]


def _batcher(compute: Recorder, **kwargs: float) -> DynamicBatcher:
    settings = {"max_batch_size": 4, "max_queue_delay": 0.05, "quiet_seconds": 0.05, **kwargs}
    return DynamicBatcher(
        compute,
        max_batch_size=int(settings["max_batch_size"]),
        max_queue_delay=settings["max_queue_delay"],
        quiet_seconds=settings["quiet_seconds"],
        cost=CostModel(overhead=0.001, per_token=1e-6),
    )


async def _running(batcher: DynamicBatcher) -> asyncio.Task[None]:
    task = asyncio.create_task(batcher.run())
    await asyncio.sleep(0)
    return task


def _far() -> float:
    return time.monotonic() + 60


async def test_concurrent_requests_share_one_batch_and_get_their_own_vectors():
    compute = Recorder()
    batcher = _batcher(compute)
    runner = await _running(batcher)
    results = await asyncio.gather(
        batcher.embed([[1] * 3], deadline=_far()),
        batcher.embed([[1] * 5, [1] * 2], deadline=_far()),
        batcher.embed([[1] * 4], deadline=_far()),
    )
    runner.cancel()
    assert compute.batches == [[3, 5, 2, 4]]
    assert [[struct.unpack("<f", v)[0] for v in r] for r in results] == [[3], [5, 2], [4]]


async def test_a_full_batch_runs_without_waiting_and_the_rest_follows():
    compute = Recorder()
    batcher = _batcher(compute, max_queue_delay=5.0, quiet_seconds=5.0)
    runner = await _running(batcher)
    started = time.monotonic()
    await batcher.embed([[1] * 2] * 8, deadline=_far())
    runner.cancel()
    assert compute.batches == [[2, 2, 2, 2], [2, 2, 2, 2]]
    assert time.monotonic() - started < 5.0  # neither batch waited out the delay


async def test_a_lone_request_waits_at_most_the_queue_delay():
    compute = Recorder()
    batcher = _batcher(compute, max_queue_delay=0.2, quiet_seconds=10.0)
    runner = await _running(batcher)
    started = time.monotonic()
    await batcher.embed([[1] * 2], deadline=_far())
    waited = time.monotonic() - started
    runner.cancel()
    assert compute.batches == [[2]]
    assert 0.2 <= waited < 5.0


async def test_batches_group_inputs_of_similar_length():
    compute = Recorder()
    batcher = _batcher(compute, max_batch_size=3)
    runner = await _running(batcher)
    lengths = [4, 200, 5, 210, 6, 220]
    await batcher.embed([[1] * n for n in lengths], deadline=_far())
    runner.cancel()
    assert sorted(sorted(b) for b in compute.batches) == [[4, 5, 6], [200, 210, 220]]


async def test_a_request_that_cannot_meet_its_deadline_is_refused_at_once():
    compute = Recorder()
    batcher = DynamicBatcher(
        compute,
        max_batch_size=2,
        max_queue_delay=0.0,
        cost=CostModel(overhead=0.5, per_token=0.0),  # every batch takes half a second
    )
    # Six inputs queued ahead: three batches, about 1.5 s, before a new one could run.
    batcher._pending.extend(item for _ in range(3) for item in _queued(batcher, [[1], [1]]))
    with pytest.raises(DeadlineUnattainable) as refused:
        await batcher.embed([[1]], deadline=time.monotonic() + 1.0)
    assert refused.value.wait_seconds == pytest.approx(2.0)
    assert compute.batches == []


def _queued(batcher: DynamicBatcher, inputs: list[list[int]]) -> list[Any]:
    """Inputs of a request that is queued but whose caller is not awaiting (for the refusal)."""
    from workers.batcher import _Input, _Request

    loop = asyncio.get_running_loop()
    request = _Request(future=loop.create_future(), vectors=[None] * len(inputs), left=len(inputs))
    now = time.monotonic()
    request.inputs = [
        _Input(ids=ids, position=i, deadline=now + 60, arrived=now, owner=request)
        for i, ids in enumerate(inputs)
    ]
    return list(request.inputs)


async def test_an_input_whose_deadline_passes_while_queued_fails_without_computing():
    compute = Recorder(seconds=0.3)
    batcher = _batcher(compute, max_batch_size=1, max_queue_delay=0.0, quiet_seconds=0.0)
    runner = await _running(batcher)
    first = asyncio.create_task(batcher.embed([[1] * 2], deadline=_far()))
    await asyncio.sleep(0.05)  # the first batch is computing now
    batcher.cost = CostModel(overhead=0.0, per_token=0.0)  # admission thinks it fits
    with pytest.raises(TimeoutError):
        await batcher.embed([[1] * 3], deadline=time.monotonic() + 0.1)
    await first
    runner.cancel()
    assert compute.batches == [[2]]


async def test_a_cancelled_request_withdraws_its_queued_inputs():
    compute = Recorder()
    batcher = _batcher(compute, max_queue_delay=0.3, quiet_seconds=0.3)
    runner = await _running(batcher)
    doomed = asyncio.create_task(batcher.embed([[1] * 7], deadline=_far()))
    await asyncio.sleep(0.01)
    doomed.cancel()
    kept = await batcher.embed([[1] * 3], deadline=_far())
    runner.cancel()
    assert len(kept) == 1
    assert compute.batches == [[3]]


def test_the_cost_model_is_measured_from_two_shapes_and_follows_what_it_sees():
    compute = Recorder()
    cost = CostModel.measure(compute, max_batch_size=8, length=16)
    assert [len(b) for b in compute.batches] == [1, 1, 8, 8]
    assert cost.seconds(inputs=8, longest=16) >= cost.seconds(inputs=1, longest=16)
    before = cost.per_token
    cost.observe(inputs=10, longest=100, seconds=cost.overhead + 10 * 100 * before * 3)
    assert cost.per_token > before


def test_the_queue_delay_is_what_the_slo_leaves_after_a_full_batch():
    cost = CostModel(overhead=0.01, per_token=0.0001)
    full = cost.seconds(inputs=16, longest=64)
    batcher = DynamicBatcher.for_slo(Recorder(), max_batch_size=16, slo_seconds=0.25, cost=cost)
    assert batcher.max_queue_delay == pytest.approx(0.25 - full)
    tight = DynamicBatcher.for_slo(Recorder(), max_batch_size=16, slo_seconds=0.05, cost=cost)
    assert tight.max_queue_delay == 0.0
