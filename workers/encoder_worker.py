"""The encoder worker: each claimed request's inputs go through a dynamic batcher to an encoder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from dataplane.background import supervise
from dataplane.types import Embeddings, Event, Finished, Job, Started, Status, UsageEvent, usage_for
from workers.batcher import DynamicBatcher
from workers.engine import Monitored
from workers.failures import Failure
from workers.runner import Worker


class EncoderWorker(Worker):
    """A worker whose requests' inputs go through a dynamic batcher to an encoder model."""

    def __init__(
        self, *, engine: Monitored, batcher: DynamicBatcher, normalize: bool, **kwargs: Any
    ) -> None:
        super().__init__(engine=engine, **kwargs)
        self.batcher = batcher
        # Whether the model's files end its pipeline with a normalisation to unit length.
        self.normalize = normalize

    async def run(
        self,
        on_ready: Callable[[], Awaitable[None]] | None = None,
        on_draining: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        batching = asyncio.create_task(
            supervise("batcher", self.batcher.run, on_failure=self.batcher.fail_waiting),
            name="batcher",
        )
        try:
            await super().run(on_ready=on_ready, on_draining=on_draining)
        finally:
            batching.cancel()
            await asyncio.gather(batching, return_exceptions=True)

    async def _serve(self, job: Job) -> None:
        started_at = time.time()
        self._outbox.put(job, Started(at=started_at))
        failure = None
        try:
            await self._embed(job, started_at)
        except BaseException as exc:
            failure = self._failure(exc, job=job, engine="encoder")
        self._ended(job, *_end(job, started_at, failure), failure)

    async def _embed(self, job: Job, started_at: float) -> None:
        """Embed the request's inputs within its deadline and put the vectors out."""
        # The batcher keeps time on the monotonic clock; the job's deadline is wall time.
        deadline = time.monotonic() + (job.deadline - started_at)
        vectors = await self.batcher.embed(job.inputs(), deadline=deadline)
        data = b"".join(vectors)
        if self.normalize and job.use_activation:
            data = unit_length(data, dimensions=len(vectors[0]) // 4)
        self._outbox.put(job, Embeddings(data=data, dimensions=len(vectors[0]) // 4))


def unit_length(data: bytes, *, dimensions: int) -> bytes:
    """Float32 vectors end to end, each divided by its length (at least 1e-12, as torch's
    `normalize` does)."""
    rows = np.frombuffer(data, dtype="<f4").reshape(-1, dimensions)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.maximum(norms, np.float32(1e-12))).astype("<f4").tobytes()


def _end(job: Job, started_at: float, failure: Failure | None) -> tuple[Event, UsageEvent]:
    """The request's terminal event and usage: inputs that never went through the model are
    not billed."""
    tokens = len(job.prompt_token_ids)
    finished_at = time.time()
    if failure is None:
        terminal: Event = Finished(finish_reason="stop", prompt_tokens=tokens, completion_tokens=0)
    else:
        terminal = failure.failed(prompt_tokens=tokens, completion_tokens=0)
    usage = usage_for(
        job,
        status=Status.OK if failure is None else failure.status,
        finished_at=finished_at,
        started_at=started_at,
        first_token_at=finished_at if failure is None else None,
        finish_reason="stop" if failure is None else "",
        error_code="" if failure is None else failure.code,
        prompt_tokens=tokens if failure is None else 0,
    )
    return terminal, usage
