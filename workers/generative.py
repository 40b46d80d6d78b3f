"""The generative worker: runs each claimed request on an engine that streams tokens (vLLM).

A request's choices are multiplexed on one reply stream by `Delta.index`: n completions per
prompt, and a completions request with several prompts runs each prompt as an engine request
of its own (choice = prompt * n + completion).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dataplane.types import (
    Delta,
    Event,
    Finished,
    Job,
    Resumed,
    Sampling,
    Started,
    Status,
    UsageEvent,
    usage_for,
)
from workers.adapters import AdapterError, Adapters
from workers.engine import AdapterRef, Engine, Step
from workers.failures import Failure
from workers.fairness import engine_priority, kv_blocks
from workers.outbox import Outbox
from workers.runner import Worker
from workers.tooling import ChoiceParsing, OutputParsing

# While a non-streaming request runs, its text goes out at most this often: nobody reads it
# before the end, and a worker lost mid-way still bills about what it had produced.
_HOLD_SECONDS = 1.0


@dataclass
class _Holdback:
    """A non-streaming request's deltas, written as one event per choice a second instead of
    per flush."""

    kept: dict[int, Delta] = field(default_factory=dict)
    since: float = field(default_factory=time.monotonic)

    def add(self, delta: Delta) -> list[Delta]:
        """Keep `delta`; return what is to be written now (what was kept, when it is time)."""
        out = []
        kept = self.kept.get(delta.index)
        if kept is None:
            self.kept[delta.index] = delta
        elif kept.joins(delta):
            self.kept[delta.index] = kept.then(delta)
        else:
            out.append(kept)
            self.kept[delta.index] = delta
        if time.monotonic() - self.since >= _HOLD_SECONDS:
            out += self.take()
        return out

    def take(self) -> list[Delta]:
        """Everything kept, in choice order."""
        kept = [self.kept[index] for index in sorted(self.kept)]
        self.kept, self.since = {}, time.monotonic()
        return kept


@dataclass
class _Choice:
    """One choice's run so far: its tokens, how it ended, and its tool parsing."""

    produced: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    thought: int = 0  # thinking tokens counted so far (a running usage's)
    parsing: ChoiceParsing | None = None
    opened: bool = False  # a delta of it went out

    def reason(self) -> str:
        if self.parsing is not None:
            return self.parsing.finish_reason(self.finish_reason)
        return self.finish_reason or "stop"


@dataclass
class _Generation:
    """One request's run so far: what each choice produced and when, and where deltas go."""

    job: Job
    outbox: Outbox
    started_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    parsing: OutputParsing | None = None
    choices: list[_Choice] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # per prompt
    cached: list[int] = field(default_factory=list)  # per prompt
    created: list[int] = field(default_factory=list)  # per prompt: written to the prefix cache
    held: _Holdback | None = None
    shown: bool = False  # some output the client can see went out
    # The tokens produced so far, kept only for a run that can be handed on (handable).
    token_ids: list[int] = field(default_factory=list)
    keeps_ids: bool = False

    def __post_init__(self) -> None:
        self.prompt_tokens = [len(ids) for ids in self.job.inputs()]
        self.cached = [0] * len(self.prompt_tokens)
        self.created = [0] * len(self.prompt_tokens)
        self.choices = [_Choice() for _ in range(self.job.choices)]
        self.held = None if self.job.stream else _Holdback()
        self.keeps_ids = self.handable
        resumed = self.job.resumed
        if resumed is not None:
            # Carried on from another worker: what it produced counts, and went out already.
            self.choices[0].produced = len(resumed.token_ids)
            self.token_ids = list(resumed.token_ids)
            self.started_at = resumed.started_at
            self.first_token_at = resumed.first_token_at
            self.shown = True

    @property
    def handable(self) -> bool:
        """Whether another worker can carry this run on from its tokens alone.

        One plain completion: no tools to parse, no grammar, no logprobs or echo, no stop
        strings (one could straddle the cut), one prompt, one choice.
        """
        job, sampling = self.job, self.job.sampling
        return (
            job.tools is None
            and job.choices == 1
            and sampling.structured is None
            and sampling.logprobs is None
            and sampling.prompt_logprobs is None
            and not sampling.stop
            and not job.adapter
        )

    def resumed(self) -> Resumed:
        """What this run produced, for the worker that carries it on."""
        return Resumed(
            token_ids=list(self.token_ids),
            started_at=self.started_at,
            first_token_at=self.first_token_at,
        )

    def use_parsing(self, parsing: OutputParsing) -> None:
        """Parse each choice's output into tool calls and thinking (one parser per choice)."""
        self.parsing = parsing
        for choice in self.choices:
            choice.parsing = parsing.choice()

    @property
    def sampling(self) -> Sampling:
        """The job's sampling, as its parser adjusted it; for a run carried on, what is left
        of it."""
        sampling = self.job.sampling
        done = self.job.resumed_tokens
        if done:
            sampling = msgspec.structs.replace(
                sampling,
                max_tokens=max(sampling.max_tokens - done, 1),
                min_tokens=max(sampling.min_tokens - done, 0),
            )
        return sampling if self.parsing is None else self.parsing.sampling(sampling)

    def prompt_of(self, ids: list[int]) -> list[int]:
        """The engine's prompt: a run carried on continues after the tokens already produced."""
        return ids + self.token_ids if self.job.resumed is not None else ids

    @property
    def produced(self) -> int:
        return sum(choice.produced for choice in self.choices)

    def kv_tokens(self) -> list[int]:
        """The tokens each of the run's sequences holds in the engine's KV cache so far (a run
        carried on: its earlier tokens too, which the engine took as prompt)."""
        lengths = [len(ids) for ids in self.job.inputs()]
        n = self.job.sampling.n
        return [lengths[i // n] + choice.produced for i, choice in enumerate(self.choices)]

    def step(self, step: Step, *, prompt: int = 0) -> None:
        """Take one engine step of one prompt's completion: its output goes out (the
        request's first token at once), its counts add up."""
        index = prompt * self.job.sampling.n + step.index
        choice = self.choices[index]
        first = step.tokens > 0 and self.first_token_at is None
        if step.tokens:
            choice.produced += step.tokens
            self.first_token_at = self.first_token_at or step.first_token_at or time.time()
            if self.keeps_ids:
                self.token_ids.extend(step.token_ids)
        if step.finish_reason:
            choice.finish_reason = step.finish_reason
            choice.stop_reason = step.stop_reason
        # A run carried on fed its earlier tokens back as prompt: they are billed as output.
        resumed = self.job.resumed_tokens
        self.prompt_tokens[prompt] = step.prompt_tokens - resumed
        self.cached[prompt] = min(
            max(self.cached[prompt], step.cached_tokens), self.prompt_tokens[prompt]
        )
        self.created[prompt] = max(self.created[prompt], step.cache_created_tokens)
        delta = self._delta(index, choice, step)
        if delta is not None:
            # The first output a client can see goes at once too: a tool parser holds back
            # the first tokens, so the first visible piece may come steps after them.
            shown = bool(delta.text or delta.tool_calls or delta.reasoning)
            self._emit(delta, urgent=first or (shown and not self.shown))
            self.shown = self.shown or shown

    def _delta(self, index: int, choice: _Choice, step: Step) -> Delta | None:
        """The step as the client's delta; None when it carries nothing."""
        text, calls, reasoning = step.text, None, ""
        if choice.parsing is not None:
            parsed = choice.parsing.step(
                step.text,
                step.token_ids,
                prompt_token_ids=self.job.prompt_token_ids,
                finished=step.finish_reason is not None,
            )
            # A step the parser holds back still bills its tokens and shows its logprobs.
            if parsed is not None:
                text, calls, reasoning = parsed.text, parsed.tool_calls, parsed.reasoning
            else:
                text = ""
        # vLLM's prompt_logprobs field is in whole answers only, not in a stream's chunks;
        # a prompt's first choice carries them for all its choices (n copies of a long prompt's
        # would cross Redis and the frontend for nothing).
        ranked = None if self.job.stream or step.index else step.prompt_ranked
        if not (step.tokens or text or calls or reasoning or step.prompt_logprobs or ranked):
            return None
        thinking = 0
        reasoning_job = self.job.reasoning
        if reasoning_job is not None and reasoning_job.running and choice.parsing is not None:
            counted = choice.parsing.reasoning_tokens()
            thinking, choice.thought = counted - choice.thought, counted
        prompt_ids = None
        if not choice.opened and self.job.sampling.prompt_ids_in_reply:
            prompt_ids = self.job.inputs()[index // self.job.sampling.n]
        choice.opened = True
        # Thinking left out of the answer stays out of its logprobs and token ids too.
        hidden = self.job.reasoning is not None and not self.job.reasoning.include
        return Delta(
            text=text,
            tokens=step.tokens,
            index=index,
            logprobs=None if hidden else step.logprobs,
            tool_calls=calls,
            prompt_logprobs=step.prompt_logprobs,
            token_ids=list(step.token_ids)
            if self.job.sampling.output_token_ids and not hidden
            else None,
            prompt_ranked=ranked,
            prompt_token_ids=prompt_ids,
            reasoning=reasoning,
            thinking_tokens=thinking,
        )

    def _emit(self, delta: Delta, *, urgent: bool = False) -> None:
        if self.held is None:
            self.outbox.put(self.job, delta, urgent=urgent)
            return
        for kept in self.held.add(delta):
            self.outbox.put(self.job, kept)

    def release(self) -> None:
        """Write what a non-streaming request still holds back."""
        if self.held is not None:
            for kept in self.held.take():
                self.outbox.put(self.job, kept)

    def _reasoning_tokens(self) -> int | None:
        """Every choice's thinking tokens (None: the request is not a reasoning model's)."""
        if self.job.reasoning is None:
            return None
        return sum(
            c.parsing.reasoning_tokens(whole=True) for c in self.choices if c.parsing is not None
        )

    def end(self, failure: Failure | None) -> tuple[Event, UsageEvent]:
        """The request's terminal event and usage; a failure bills what it produced."""
        reasons = [choice.reason() for choice in self.choices]
        stops = [choice.stop_reason for choice in self.choices]
        prompt_tokens, cached = sum(self.prompt_tokens), sum(self.cached)
        created = min(sum(self.created), prompt_tokens - cached)
        thought = self._reasoning_tokens()
        terminal: Event
        if failure is None:
            terminal = Finished(
                finish_reason=reasons[0],
                prompt_tokens=prompt_tokens,
                completion_tokens=self.produced,
                cached_tokens=cached,
                finish_reasons=reasons if len(reasons) > 1 else [],
                reasoning_tokens=thought,
                stop_reasons=stops if any(stop is not None for stop in stops) else [],
                stop_string=stops[0] if isinstance(stops[0], str) else None,
                cache_created_tokens=created,
            )
        else:
            terminal = failure.failed(prompt_tokens=prompt_tokens, completion_tokens=self.produced)
        self.release()
        status = Status.OK if failure is None else failure.status
        usage = usage_for(
            self.job,
            status=status,
            finished_at=time.time(),
            started_at=self.started_at,
            first_token_at=self.first_token_at,
            completion_tokens=self.produced,
            finish_reason=reasons[0] if failure is None else "",
            error_code="" if failure is None else failure.code,
            cached_tokens=cached,
            prompt_tokens=prompt_tokens,
            cache_created_tokens=created,
            reasoning_tokens=thought or 0,
        )
        return terminal, usage


async def _together(runs: list[Coroutine[Any, Any, None]]) -> None:
    """Run several engine requests at once; the first failure ends them all (each aborts
    inside the engine as it is cancelled) and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            for run in runs:
                group.create_task(run)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


class GenerativeWorker(Worker):
    """A worker whose engine streams tokens (vLLM), optionally applying LoRA adapters."""

    def __init__(
        self,
        *,
        engine: Engine,
        adapters: Adapters | None = None,
        kv_block_size: int = 16,
        **kwargs: Any,
    ) -> None:
        # Routing by prefix pays only where the engine keeps the prefixes it has seen.
        kwargs.setdefault("prefix_routing", engine.prefix_caching)
        super().__init__(engine=engine, **kwargs)
        self.generator = engine
        self.adapters = adapters
        self.kv_block_size = kv_block_size
        self._runs: dict[str, _Generation] = {}

    async def _engine_restarted(self) -> None:
        if self.adapters is not None:
            self.adapters.forget()

    async def _serve(self, job: Job) -> None:
        run = _Generation(job, self._outbox)
        if job.resumed is None:
            self._outbox.put(job, Started(at=run.started_at))
        failure = None
        self._runs[job.request_id] = run
        try:
            if job.tools is not None or job.reasoning is not None:
                run.use_parsing(self._parsing(job))
            await self._generate(run, priority=self._engine_priority(job))
        except BaseException as exc:
            if self._handing_on(job, exc) and run.keeps_ids:
                # The drain ran out: another worker carries it on from what it produced.
                run.release()
                self._hand_on(job, run.resumed())
                return
            # A cancel aborted the request inside vLLM; any failure bills what it produced.
            failure = self._failure(exc, job=job, engine="engine")
        finally:
            self._runs.pop(job.request_id, None)
        self._ended(job, *run.end(failure), failure)

    def _engine_priority(self, job: Job) -> int:
        """The engine priority of a job starting now: its class, then its tenant's share of
        the sequences running here with it (workers/fairness.py)."""
        tenant_seqs = all_seqs = 0
        for other, _ in self.active.values():
            all_seqs += other.choices
            if other.tenant_id == job.tenant_id:
                tenant_seqs += other.choices
        return engine_priority(
            priority_class=job.priority,
            tenant_seqs=max(tenant_seqs, job.choices),
            all_seqs=max(all_seqs, job.choices),
            weight=job.weight,
        )

    def _kv_blocks(self, job: Job) -> int:
        run = self._runs.get(job.request_id)
        if run is not None:
            tokens = run.kv_tokens()
        else:  # claimed, not started yet: its prompts
            tokens = [len(ids) for ids in job.inputs() for _ in range(job.sampling.n)]
        return kv_blocks(tokens, block_size=self.kv_block_size)

    def _parsing(self, job: Job) -> OutputParsing:
        return OutputParsing(
            job.tools,
            tokenizer=self.generator.tokenizer(),
            model_config=self.generator.model_config(),
            stream=job.stream,
            reasoning=job.reasoning,
        )

    async def _generate(self, run: _Generation, *, priority: int = 0) -> None:
        """Run the request on the engine, within its deadline (the engine aborts it then).

        Several prompts run as one engine request each, at once, all at `priority`.
        """
        job = run.job
        deadline = asyncio.get_running_loop().time() + (job.deadline - run.started_at)
        async with asyncio.timeout_at(deadline), self._adapter(job) as adapter:
            prompts = job.inputs()
            if len(prompts) == 1:
                ids = run.prompt_of(prompts[0])
                await self._prompt(run, 0, job.request_id, ids, adapter, priority)
                return
            await _together(
                [
                    self._prompt(run, i, f"{job.request_id}-{i}", ids, adapter, priority)
                    for i, ids in enumerate(prompts)
                ]
            )

    async def _prompt(
        self,
        run: _Generation,
        prompt: int,
        request_id: str,
        prompt_token_ids: list[int],
        adapter: AdapterRef | None,
        priority: int,
    ) -> None:
        """Run one prompt's engine request; its steps go into the run."""
        thinking = None if run.parsing is None else run.parsing.thinking(prompt_token_ids)
        async for step in self.generator.generate(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=run.sampling,
            adapter=adapter,
            cache_salt=run.job.prefix_salt,
            prompt_ranked=not run.job.stream,
            priority=priority,
            **({"thinking": thinking} if thinking is not None else {}),
        ):
            run.step(step, prompt=prompt)

    @contextlib.asynccontextmanager
    async def _adapter(self, job: Job) -> AsyncIterator[AdapterRef | None]:
        if not job.adapter:
            yield None
            return
        if self.adapters is None:
            raise AdapterError(f"deployment {self.deployment} serves no LoRA adapters")
        async with self.adapters.using(job.adapter) as ref:
            yield ref
