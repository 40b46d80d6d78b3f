"""The generative worker: runs each claimed request on an engine that streams tokens (vLLM)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from dataplane.types import Delta, Event, Finished, Job, Started, Status, UsageEvent, usage_for
from workers.adapters import AdapterError, Adapters
from workers.engine import AdapterRef, Engine, Step
from workers.failures import Failure, failure_of
from workers.outbox import Outbox
from workers.runner import Worker

# While a non-streaming request runs, its text goes out at most this often: nobody reads it
# before the end, and a worker lost mid-way still bills about what it had produced.
_HOLD_SECONDS = 1.0


@dataclass
class _Holdback:
    """A non-streaming request's deltas, written as one event a second instead of per flush."""

    kept: Delta | None = None
    since: float = field(default_factory=time.monotonic)

    def add(self, delta: Delta) -> Delta | None:
        """Keep `delta`; return what was kept when it is time to write it."""
        self.kept = delta if self.kept is None else self.kept.then(delta)
        return self.take() if time.monotonic() - self.since >= _HOLD_SECONDS else None

    def take(self) -> Delta | None:
        kept, self.kept, self.since = self.kept, None, time.monotonic()
        return kept


@dataclass
class _Generation:
    """One request's run so far: what it produced and when, and where its deltas go."""

    job: Job
    outbox: Outbox
    started_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    produced: int = 0
    cached: int = 0
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    held: _Holdback | None = None

    def __post_init__(self) -> None:
        self.prompt_tokens = len(self.job.prompt_token_ids)
        self.held = None if self.job.stream else _Holdback()

    def step(self, step: Step) -> None:
        """Take one engine step: its text goes out (the first token at once), its counts add up."""
        if step.tokens:
            first = self.produced == 0
            self.produced += step.tokens
            self.first_token_at = self.first_token_at or time.time()
            self._emit(Delta(text=step.text, tokens=step.tokens), urgent=first)
        elif step.text:
            self._emit(Delta(text=step.text, tokens=0))
        if step.finish_reason:
            self.finish_reason = step.finish_reason
        self.prompt_tokens = step.prompt_tokens
        self.cached = max(self.cached, step.cached_tokens)

    def _emit(self, delta: Delta, *, urgent: bool = False) -> None:
        if self.held is None:
            self.outbox.put(self.job, delta, urgent=urgent)
        elif (kept := self.held.add(delta)) is not None:
            self.outbox.put(self.job, kept)

    def release(self) -> None:
        """Write what a non-streaming request still holds back."""
        if self.held is not None and (kept := self.held.take()) is not None:
            self.outbox.put(self.job, kept)

    def end(self, failure: Failure | None) -> tuple[Event, UsageEvent]:
        """The request's terminal event and usage; a failure bills what it produced."""
        terminal: Event
        if failure is None:
            terminal = Finished(
                finish_reason=self.finish_reason,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.produced,
            )
        else:
            terminal = failure.failed(
                prompt_tokens=self.prompt_tokens, completion_tokens=self.produced
            )
        self.release()
        status = Status.OK if failure is None else failure.status
        usage = usage_for(
            self.job,
            status=status,
            finished_at=time.time(),
            started_at=self.started_at,
            first_token_at=self.first_token_at,
            completion_tokens=self.produced,
            finish_reason=self.finish_reason if failure is None else "",
            error_code="" if failure is None else failure.code,
            cached_tokens=self.cached,
        )
        return terminal, usage


class GenerativeWorker(Worker):
    """A worker whose engine streams tokens (vLLM), optionally applying LoRA adapters."""

    def __init__(self, *, engine: Engine, adapters: Adapters | None = None, **kwargs: Any) -> None:
        # Routing by prefix pays only where the engine keeps the prefixes it has seen.
        kwargs.setdefault("prefix_routing", engine.prefix_caching)
        super().__init__(engine=engine, **kwargs)
        self.generator = engine
        self.adapters = adapters

    async def _serve(self, job: Job) -> None:
        run = _Generation(job, self._outbox)
        self._outbox.put(job, Started(at=run.started_at))
        failure = None
        try:
            await self._generate(run)
        except BaseException as exc:
            # A cancel aborted the request inside vLLM; any failure bills what it produced.
            failure = failure_of(exc, job=job, engine="engine")
        self._ended(job, *run.end(failure), failure)

    async def _generate(self, run: _Generation) -> None:
        """Run the request on the engine, within its deadline (the engine aborts it then)."""
        job = run.job
        deadline = asyncio.get_running_loop().time() + (job.deadline - run.started_at)
        async with asyncio.timeout_at(deadline), self._adapter(job) as adapter:
            async for step in self.generator.generate(
                request_id=job.request_id,
                prompt_token_ids=job.prompt_token_ids,
                sampling=job.sampling,
                adapter=adapter,
            ):
                run.step(step)

    @contextlib.asynccontextmanager
    async def _adapter(self, job: Job) -> AsyncIterator[AdapterRef | None]:
        if not job.adapter:
            yield None
            return
        if self.adapters is None:
            raise AdapterError(f"deployment {self.deployment} serves no LoRA adapters")
        async with self.adapters.using(job.adapter) as ref:
            yield ref
