"""A worker's Prometheus series (docs/metrics.md), served on its own port
(`dataplane.metrics.metrics_serve`, which labels vLLM's own `vllm:*` series with the deployment).

The engine adapter reports each finished request's engine stages (`EngineStats`); the worker
loop reports each request's platform-side timings when it ends; the dynamic batcher reports
its batches.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from dataplane.metrics import LATENCY_BUCKETS, TTFT_BUCKETS, stage_seconds
from dataplane.types import Job, UsageEvent

platform_ttft = Histogram(
    "roundhouse_time_to_first_token_seconds",
    "First token minus admission: the TTFT the objective is about.",
    ["deployment", "priority"],
    buckets=TTFT_BUCKETS,
)
requests_ended = Counter(
    "roundhouse_worker_requests", "Requests a worker ended, by status.", ["deployment", "status"]
)
generated_tokens = Counter(
    "roundhouse_generated_tokens", "Completion tokens produced.", ["deployment"]
)
batch_size = Histogram(
    "roundhouse_encoder_batch_size",
    "Inputs per forward pass.",
    ["deployment"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
batch_fill = Histogram(
    "roundhouse_encoder_batch_fill_ratio",
    "Inputs per forward pass over max_batch_size.",
    ["deployment"],
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
)
batch_seconds = Histogram(
    "roundhouse_encoder_batch_seconds",
    "One forward pass.",
    ["deployment"],
    buckets=LATENCY_BUCKETS,
)


class WorkerMetrics:
    """The series of one deployment's worker process, with its labels bound."""

    def __init__(self, *, deployment: str) -> None:
        self.deployment = deployment
        self._engine_queue = stage_seconds.labels(stage="engine_queue", deployment=deployment)
        self._prefill = stage_seconds.labels(stage="prefill", deployment=deployment)
        self._decode = stage_seconds.labels(stage="decode", deployment=deployment)
        self._platform_queue = stage_seconds.labels(stage="platform_queue", deployment=deployment)
        self._generated = generated_tokens.labels(deployment=deployment)
        self._batch_size = batch_size.labels(deployment=deployment)
        self._batch_fill = batch_fill.labels(deployment=deployment)
        self._batch_seconds = batch_seconds.labels(deployment=deployment)

    # --- engine (EngineStats) ----------------------------------------------------------

    def finished(self, *, queued: float, prefill: float, decode: float) -> None:
        self._engine_queue.observe(queued)
        self._prefill.observe(prefill)
        self._decode.observe(decode)

    # --- the worker loop ---------------------------------------------------------------

    def request_ended(self, job: Job, usage: UsageEvent) -> None:
        """Count a request's end and observe the timings only the platform knows."""
        requests_ended.labels(deployment=self.deployment, status=str(usage.status)).inc()
        if usage.completion_tokens:
            self._generated.inc(usage.completion_tokens)
        if usage.started_at is not None:
            self._platform_queue.observe(max(usage.started_at - job.enqueued_at, 0.0))
        if usage.first_token_at is not None:
            platform_ttft.labels(deployment=self.deployment, priority=job.priority).observe(
                max(usage.first_token_at - job.enqueued_at, 0.0)
            )

    # --- the dynamic batcher -----------------------------------------------------------

    def batch(
        self, *, inputs: int, max_batch_size: int, seconds: float, waits: list[float]
    ) -> None:
        """Observe one forward pass: its size and time, and how long its inputs waited."""
        self._batch_size.observe(inputs)
        self._batch_fill.observe(inputs / max(max_batch_size, 1))
        self._batch_seconds.observe(seconds)
        for wait in waits:
            self._engine_queue.observe(wait)
            self._prefill.observe(seconds)
