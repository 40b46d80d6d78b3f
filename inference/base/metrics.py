"""The frontend's Prometheus series (docs/metrics.md) and the clock that times a request's stages.

With PROMETHEUS_MULTIPROC_DIR set, prometheus_client writes these to files there and one
scrape of any process sums every process's (the `/metrics` view).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

# The frontend's long-lived loops count their failures in the data plane's series, and a
# request's stages are one series that the frontend and the workers both observe.
from dataplane.metrics import LATENCY_BUCKETS as LATENCY_BUCKETS
from dataplane.metrics import STAGES as STAGES
from dataplane.metrics import TTFT_BUCKETS as TTFT_BUCKETS
from dataplane.metrics import loop_failures as loop_failures
from dataplane.metrics import stage_seconds as stage_seconds

ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip

request_seconds = Histogram(
    "roundhouse_request_seconds",
    "End to end as the frontend sees it: request in to last byte out.",
    ["endpoint", "deployment"],
    buckets=LATENCY_BUCKETS,
)
requests_total = Counter(
    "roundhouse_requests", "/v1 responses by HTTP status.", ["endpoint", "code"]
)
admission_decisions = Counter(
    "roundhouse_admission_decisions",
    "Admission decisions: admitted, or the refusal's code.",
    ["deployment", "reason"],
)
fallbacks = Counter(
    "roundhouse_fallbacks",
    "Interactive requests an alias could not take that went to its fallback, and why.",
    ["model", "fallback", "reason"],
)
max_tokens_caps = Counter(
    "roundhouse_max_tokens_capped",
    "Admitted requests whose max_tokens was capped to finish before their deadline (their "
    "tenant opted in to output capping).",
    ["deployment"],
)
write_timeouts = Counter(
    "roundhouse_write_timeouts",
    "Responses cut because their client read none of a message within the write timeout.",
)
stream_keepalives = Counter(
    "roundhouse_stream_keepalives",
    "Keep-alives sent on streams that had nothing else to send (queued, or in a long prefill).",
)

# How a streamed request's relay ended: `completed` (its terminal event said why it finished),
# or how it was cut. Bounded: every failure code maps to one of these (`stream_outcome`).
STREAM_OUTCOMES = (
    "completed", "error", "worker_lost", "timeout", "relay_failed", "rejected", "cancelled",
    "client_gone",
)  # fmt: skip
streams_ended = Counter(
    "roundhouse_streams_ended",
    "Streamed requests (SSE and WebSocket) whose relay to their client ended, by how.",
    ["deployment", "outcome"],
)
_STREAM_FAILURES = {
    "engine_error": "error",
    "worker_lost": "worker_lost",
    "timeout": "timeout",
    "deadline_exceeded": "timeout",
    "deadline_unattainable": "timeout",
    "relay_failed": "relay_failed",
    "cancelled": "cancelled",
}


def stream_outcome(failure_code: str | None) -> str:
    """The outcome of a stream that ended with a terminal event: `completed` (None), or its
    failure code's outcome (a code of the request's own, such as invalid_request: `rejected`)."""
    if failure_code is None:
        return "completed"
    return _STREAM_FAILURES.get(failure_code, "rejected")


def stream_ended(*, deployment: str, outcome: str) -> None:
    streams_ended.labels(deployment=deployment, outcome=outcome).inc()


# Pauses of a process: short ones matter (a stream's next token waits behind them).
PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
gc_pause_seconds = Histogram(
    "roundhouse_gc_pause_seconds",
    "Time the garbage collector held the process, by generation.",
    ["generation"],
    buckets=PAUSE_BUCKETS,
)
loop_lag_seconds = Histogram(
    "roundhouse_event_loop_lag_seconds",
    "How late the event loop ran a timer that was due: the time other work held the loop.",
    buckets=PAUSE_BUCKETS,
)
_gc_started: list[float] = []
# Pauses the collector made, waiting to be observed: (generation, seconds).
_gc_pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=4096)
_lag_watchers: set[asyncio.AbstractEventLoop] = set()


def _gc_observe(phase: str, info: dict[str, int]) -> None:
    """Record a collection's pause; never touch a metric here.

    The callback runs wherever a collection starts, inside prometheus_client's own code too:
    its multiprocess values hold a lock that is not reentrant while they create a series. A
    callback that observed the histogram there waited for that lock in the thread that held
    it, and the event loop's next observation waited behind it: the frontend froze. The loop's
    watcher observes what was recorded (`gc_pauses_flush`).
    """
    if phase == "start":
        _gc_started[:] = [time.perf_counter()]
    elif _gc_started:
        _gc_pauses.append((info["generation"], time.perf_counter() - _gc_started.pop()))


def gc_pauses_flush() -> None:
    """Observe the pauses recorded since the last call."""
    while _gc_pauses:
        try:
            generation, seconds = _gc_pauses.popleft()
        except IndexError:
            return
        gc_pause_seconds.labels(generation=str(generation)).observe(seconds)


def gc_pauses_observe() -> None:
    """Observe every garbage collection's pause in this process from now on."""
    if _gc_observe not in gc.callbacks:
        gc.callbacks.append(_gc_observe)


def loop_lag_watch(interval: float = 0.05) -> None:
    """Measure, every `interval`, how late the running event loop wakes a sleeping task."""
    loop = asyncio.get_running_loop()
    if loop in _lag_watchers:
        return
    _lag_watchers.add(loop)

    async def watch() -> None:
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            loop_lag_seconds.observe(max(loop.time() - due, 0.0))
            gc_pauses_flush()

    task = loop.create_task(watch(), name="loop-lag")
    task.add_done_callback(lambda _: _lag_watchers.discard(loop))


def admission_decided(*, deployment: str, reason: str) -> None:
    admission_decisions.labels(deployment=deployment, reason=reason).inc()


breaker_transitions = Counter(
    "roundhouse_breaker_transitions",
    "Alias circuit breakers that opened (their interactive requests go to the fallback) or "
    "closed again, in this frontend.",
    ["model", "state"],
)

# The worst state of an alias's breakers (one per tenant) in this frontend's processes: 0
# closed, 1 half-open, 2 open. Per alias, never per tenant: the aliases are the registry's few.
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
breaker_state = Gauge(
    "roundhouse_breaker_state",
    "The worst state of an alias's circuit breakers in this frontend: 0 closed, 1 half-open, "
    "2 open.",
    ["model"],
    multiprocess_mode="livemax",
)


def breaker_observed(*, model: str, state: str) -> None:
    breaker_state.labels(model=model).set(BREAKER_STATES[state])


prompt_renders = Counter(
    "roundhouse_prompt_renders",
    "Conversations a chat template rendered for a request's prompt, on the event loop or on a "
    "preprocessing thread (a truncation's search renders several).",
    ["on"],
)


def prompt_rendered() -> None:
    """Count a chat template's render, where it ran."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        prompt_renders.labels(on="thread").inc()
    else:
        prompt_renders.labels(on="loop").inc()


def breaker_changed(*, model: str, state: str) -> None:
    breaker_transitions.labels(model=model, state=state).inc()


def max_tokens_capped(*, deployment: str) -> None:
    max_tokens_caps.labels(deployment=deployment).inc()


def fallback_taken(*, model: str, fallback: str, reason: str) -> None:
    fallbacks.labels(model=model, fallback=fallback, reason=reason).inc()


@dataclass
class RequestClock:
    """Laps of one request through the frontend's stages, observed when it ends.

    The deployment is known only once the model is routed, so laps wait until `finish`.
    """

    endpoint: str
    started: float = field(default_factory=time.perf_counter)
    deployment: str = ""
    _last: float = 0.0
    _laps: list[tuple[str, float]] = field(default_factory=list)
    _finished: bool = False
    # Whether the request went through a worker (its reply is then relayed).
    dispatched: bool = False

    def __post_init__(self) -> None:
        self._last = self.started

    def lap(self, stage: str) -> None:
        """Close the stage that began at the previous lap (or at the start)."""
        now = time.perf_counter()
        self._laps.append((stage, now - self._last))
        self._last = now

    def skip(self) -> None:
        """Start the next stage now: what happened since is measured elsewhere (the worker)."""
        self._last = time.perf_counter()
        self.dispatched = True

    def finish(self) -> None:
        """Observe the stages and the end-to-end time; once."""
        if self._finished:
            return
        self._finished = True
        deployment = self.deployment
        for stage, seconds in self._laps:
            stage_seconds.labels(stage=stage, deployment=deployment).observe(seconds)
        request_seconds.labels(endpoint=self.endpoint, deployment=deployment).observe(
            time.perf_counter() - self.started
        )
