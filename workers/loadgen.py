"""Closed-loop load straight onto a deployment's queue, the way bench/embeddings.py drives it.

Jobs are built as inference.pipeline.submission builds a completion request's job, enqueued with
`FrontDoor.enqueue` and followed on their reply streams: no HTTP, no frontend, no quota. Nobody
should pay for a measurement, so jobs are marked `shadow`: their usage records are kept at
cost 0 and never invoiced, under the `user` tag the caller gives (`capacity:<run>`).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dataplane.frontdoor import FrontDoor
from dataplane.types import Delta, Failed, Finished, Job, Sampling
from workers.capacity import Level, Sample, level_summarise

# Ordinary text: prompts are drawn from the token ids a version's tokenizer gives it, so they
# hold no special tokens, and every prompt differs (no prefix-cache hits flatter prefill).
VOCABULARY_TEXT = (
    "The roundhouse sorts freight cars onto tracks by destination. Each morning the yard "
    "master reads the manifests, checks the weight of every wagon, and plans which engine "
    "pulls which train. Signals change, points move, and a shunting locomotive pushes cars "
    "over the hump so that gravity rolls them into the right siding. Coal, timber, grain, "
    "containers of machine parts and refrigerated fruit all pass through before noon; by "
    "evening the departure tracks are full and the crews compare schedules over coffee. "
    "def route(car, tracks): return min(tracks, key=lambda t: t.length - car.length) # 0123456789"
)
# How long past its deadline a request may stay silent before it counts as lost.
_GRACE_SECONDS = 30.0
PROGRESS_SECONDS = 5.0


@dataclass(frozen=True)
class Load:
    """What every request of a measurement run looks like."""

    deployment: str
    version_digest: str
    tenant_id: int
    weight: float
    vocabulary: tuple[int, ...]  # token ids prompts are drawn from
    prompt_tokens: int
    max_tokens: int  # every request produces exactly this many (ignore_eos)
    timeout: float
    user: str


async def curve_measure(
    *,
    front: FrontDoor,
    load: Load,
    levels: Sequence[int],
    requests: int,
    seed: int,
    live_workers: Callable[[], int],
    say: Callable[[str], None],
) -> list[Level]:
    """Measure one level per concurrency, saying how each goes; return them in order.

    `live_workers` counts the deployment's workers before each level (rates are per that
    many); it may raise to stop the run.
    """
    live_workers()
    # One unmeasured wave first: the first requests of a run pay for cold paths (script
    # loading, the engine's first shapes of this prompt length) that steady traffic never sees.
    say(f"warm-up: {levels[0]} requests (not measured)")
    await level_run(front=front, load=load, concurrency=levels[0], requests=levels[0], seed=seed)
    measured = []
    for number, concurrency in enumerate(levels, start=1):
        workers = live_workers()
        tag = f"[{number}/{len(levels)}] concurrency {concurrency}"
        say(f"{tag}: {requests} requests on {workers} worker(s)…")
        samples, seconds = await level_run(
            front=front,
            load=load,
            concurrency=concurrency,
            requests=requests,
            seed=seed + number,
            on_done=_Progress(say, tag, requests),
        )
        level = level_summarise(
            concurrency=concurrency, workers=workers, samples=samples, seconds=seconds
        )
        errors = sorted({s.error for s in samples if not s.ok})
        say(
            f"{tag}: done in {seconds:.1f}s: {level.requests_per_second:.2f} req/s, "
            f"{level.output_tokens_per_second:,.0f} output tok/s, "
            f"TTFT p95 {_seconds(level.ttft_p95)}, ITL p95 {_seconds(level.itl_p95)}, "
            f"{level.errors} errors" + (f" ({', '.join(errors)})" if errors else "")
        )
        measured.append(level)
    return measured


class _Progress:
    """Say how far a level got, at most every PROGRESS_SECONDS."""

    def __init__(self, say: Callable[[str], None], tag: str, total: int) -> None:
        self.say, self.tag, self.total = say, tag, total
        self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        if time.monotonic() - self.last >= PROGRESS_SECONDS and done < self.total:
            self.last = time.monotonic()
            self.say(f"{self.tag}: {done}/{self.total}")


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}s"


async def level_run(
    *,
    front: FrontDoor,
    load: Load,
    concurrency: int,
    requests: int,
    seed: int,
    on_done: Callable[[int], None] | None = None,
) -> tuple[list[Sample], float]:
    """Keep `concurrency` requests in flight until `requests` have ended.

    Returns every request's sample and the wall time from the first enqueue to the last end.
    Cancelling the call cancels the requests in flight (the worker aborts them).
    """
    # Load shapes, not secrets.
    rng = random.Random(seed)  # nosec B311
    samples: list[Sample] = []
    sent = 0

    async def client() -> None:
        nonlocal sent
        while sent < requests:
            sent += 1
            prompt = rng.choices(load.vocabulary, k=load.prompt_tokens)
            samples.append(await request_run(front=front, load=load, prompt=prompt))
            if on_done is not None:
                on_done(len(samples))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples, time.perf_counter() - started


async def request_run(*, front: FrontDoor, load: Load, prompt: Sequence[int]) -> Sample:
    """Enqueue one completion request and follow its reply stream to its end."""
    now = time.time()
    job = Job(
        request_id=uuid.uuid4().hex,
        tenant_id=load.tenant_id,
        api_key_id=0,  # no key: the usage record's key is empty
        deployment=load.deployment,
        model_version=load.version_digest,
        endpoint="completions",
        prompt_token_ids=list(prompt),
        sampling=Sampling(max_tokens=load.max_tokens, ignore_eos=True),
        weight=load.weight,
        enqueued_at=now,
        deadline=now + load.timeout,
        shadow=True,
        user=load.user[:64],
    )
    started = time.perf_counter()
    first: float | None = None
    after = "0-0"
    try:
        refused = await front.enqueue(job)
        if refused is not None:
            return Sample(ok=False, error=refused.reason.value)
        while time.time() < job.deadline + _GRACE_SECONDS:
            events = await front.read_events(
                deployment=job.deployment, request_id=job.request_id, after=after, block_ms=1000
            )
            arrived = time.perf_counter()
            for event_id, event in events:
                after = event_id
                if isinstance(event, Delta) and event.tokens and first is None:
                    first = arrived
                elif isinstance(event, Failed):
                    return Sample(ok=False, error=event.code)
                elif isinstance(event, Finished):
                    return _finished(event, started=started, first=first, ended=arrived)
    except asyncio.CancelledError:
        await front.cancel(job=job)
        raise
    return Sample(ok=False, error="no_reply")


def _finished(event: Finished, *, started: float, first: float | None, ended: float) -> Sample:
    itl = None
    if first is not None and event.completion_tokens > 1:
        itl = (ended - first) / (event.completion_tokens - 1)
    return Sample(
        ok=True,
        prompt_tokens=event.prompt_tokens,
        output_tokens=event.completion_tokens,
        ttft=None if first is None else first - started,
        itl=itl,
    )
