from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import signal
import time
from typing import Any

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from config.db import db_call
from dataplane.identity import worker_id_new
from dataplane.leases import batch_every
from dataplane.metrics import metrics_serve
from dataplane.redis_client import redis_client_new
from dataplane.types import Sampling
from models_registry.manifest import ArtifactError
from models_registry.models import Deployment, DeploymentState
from workers.adapters import Adapters
from workers.batcher import REFERENCE_LENGTH, CostModel, DynamicBatcher
from workers.encoder import EncoderEngine, EncoderSpec
from workers.encoder_worker import EncoderWorker
from workers.engine import VllmEngine
from workers.fairness import tenant_caps
from workers.generative import GenerativeWorker
from workers.metrics import WorkerMetrics
from workers.runner import Worker, stream_interval_ms
from workers.selectors import tenant_slugs
from workers.services import (
    adapter_ref,
    deployment_report,
    lease_seconds,
    worker_plan,
)
from workers.weights import Progress

log = logging.getLogger("roundhouse.worker")


def reserved_slots(max_num_seqs: int) -> int:
    """Return how many engine slots the worker keeps for tenants with nothing running."""
    if max_num_seqs < 4:
        return 0
    return max(1, round(max_num_seqs * settings.ROUNDHOUSE_RESERVED_SLOTS))


async def _report(*, deployment_name: str, state: str) -> None:
    """Record the deployment's state, on a fresh connection if the database restarted."""
    await db_call(deployment_report, deployment_name=deployment_name, state=state)


class Command(BaseCommand):
    help = "Run a worker: verify the version's files, load vLLM, then serve the deployment's queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--deployment", required=True, help="deployment name to serve")
        parser.add_argument(
            "--drain-seconds",
            type=float,
            default=30.0,
            help="on SIGTERM, how long in-flight requests may take to finish",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=settings.ROUNDHOUSE_WORKER_METRICS_PORT,
            help="serve Prometheus metrics on this port (0: off)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["deployment"]
        fetched: set[str] = set()

        def progress(p: Progress) -> None:
            # One line per file as it lands in the cache (cached files report at once).
            if p.file_done == p.file_size and p.path not in fetched:
                fetched.add(p.path)
                self.stdout.write(f"weights {p.path}: {p.done >> 20}/{p.total >> 20} MiB")

        try:
            plan = worker_plan(deployment_name=name, progress=progress)
        except Deployment.DoesNotExist as exc:
            raise CommandError(f"no deployment {name!r}") from exc
        except ArtifactError as exc:
            raise CommandError(f"refusing to start: {exc}") from exc
        self.stdout.write(f"worker for {name} serving {plan.version} from {plan.spec.model_dir}")
        metrics_serve(options["metrics_port"], what="worker", deployment=plan.deployment)
        metrics = WorkerMetrics(
            deployment=plan.deployment,
            slugs_of=lambda ids: tenant_slugs(tenant_ids=ids),
        )
        # uvloop: the worker relays every token, so event-loop overhead is on the hot path.
        if plan.encoder is not None:
            serve = self._serve_encoder(
                plan.deployment, plan.encoder, options["drain_seconds"], metrics
            )
        else:
            spec = dataclasses.replace(plan.spec, served_name=str(plan.version))
            serve = self._serve(plan.deployment, spec, options["drain_seconds"], metrics)
        uvloop.run(serve)

    async def _serve_encoder(
        self, deployment: str, spec: EncoderSpec, drain_seconds: float, metrics: WorkerMetrics
    ) -> None:
        await _report(deployment_name=deployment, state=DeploymentState.LOADING)
        engine = EncoderEngine(spec)
        started = time.monotonic()
        await asyncio.to_thread(engine.start)
        await _report(deployment_name=deployment, state=DeploymentState.WARMING)
        # Warming up measures the model: a full batch's compute time sets the queue delay.
        cost = await asyncio.to_thread(
            CostModel.measure,
            engine.compute,
            max_batch_size=spec.max_batch_size,
            length=min(REFERENCE_LENGTH, spec.max_length),
        )
        batcher = DynamicBatcher.for_slo(
            engine.compute,
            max_batch_size=spec.max_batch_size,
            slo_seconds=spec.latency_slo_seconds,
            cost=cost,
            quiet_seconds=settings.ROUNDHOUSE_BATCHER_QUIET_MS / 1000,
            stats=metrics,
        )
        self.stdout.write(
            f"encoder ready in {time.monotonic() - started:.1f}s ({engine.dtype}): batches of "
            f"up to {spec.max_batch_size}, a full one of {REFERENCE_LENGTH}-token inputs "
            f"{cost.seconds(inputs=spec.max_batch_size, longest=REFERENCE_LENGTH) * 1000:.0f} ms, "
            "queue delay "
            f"{batcher.max_queue_delay * 1000:.0f} ms"
        )
        gc.collect()
        gc.freeze()
        client = redis_client_new()
        worker = EncoderWorker(
            deployment=deployment,
            engine=engine,
            batcher=batcher,
            normalize=spec.normalize,
            client=client,
            reply_ttl=settings.ROUNDHOUSE_REPLY_TTL_SECONDS,
            worker_id=worker_id_new(),
            # Requests held at once: enough to fill a few batches while one computes.
            capacity=4 * spec.max_batch_size,
            lease_seconds=lease_seconds(),
            drain_seconds=drain_seconds,
            metrics=metrics,
            batch_every=batch_every(settings.ROUNDHOUSE_BATCH_MIN_SHARE),
        )
        try:
            await self._run(worker, deployment)
        finally:
            engine.shutdown()
            await client.aclose()
            mean = batcher.batched_inputs / max(batcher.batches, 1)
            self.stdout.write(
                f"batched {batcher.batched_inputs} inputs in {batcher.batches} batches "
                f"(mean {mean:.1f} inputs per batch)"
            )

    async def _serve(
        self, deployment: str, spec: Any, drain_seconds: float, metrics: WorkerMetrics
    ) -> None:
        await _report(deployment_name=deployment, state=DeploymentState.LOADING)
        engine = VllmEngine(spec)
        started = time.monotonic()
        await engine.start()
        await _report(deployment_name=deployment, state=DeploymentState.WARMING)
        await _warm_up(engine, spec.max_model_len)
        engine.report_to(metrics)
        log.info("engine ready in %.1fs", time.monotonic() - started)
        # Long-lived objects of the engine and Django stay out of later collections, which
        # would otherwise pause the loop that relays every stream.
        gc.collect()
        gc.freeze()
        client = redis_client_new()
        reserved = reserved_slots(spec.max_num_seqs)
        interval_ms = stream_interval_ms(
            settings.ROUNDHOUSE_STREAM_INTERVAL_MS, on_accelerator=engine.on_accelerator
        )
        log.info(
            "stream interval %g ms past %d streams",
            interval_ms,
            settings.ROUNDHOUSE_STREAM_FLOW_STREAMS,
        )
        adapters = None
        if spec.max_loras:
            adapters = Adapters(
                engine,
                resolve=lambda digest: db_call(
                    adapter_ref, deployment_name=deployment, digest=digest
                ),
                capacity=spec.adapters_kept,
            )
        block_size, blocks = engine.kv_cache_blocks()
        caps = tenant_caps(
            max_num_seqs=spec.max_num_seqs,
            kv_blocks_total=blocks,
            seqs_share=settings.ROUNDHOUSE_TENANT_MAX_SEQS_SHARE,
            kv_share=settings.ROUNDHOUSE_TENANT_MAX_KV_SHARE,
        )
        log.info(
            "engine: %s scheduling, %d tokens a step; a tenant holds at most %s sequences and "
            "%s of %d KV-cache blocks",
            spec.scheduling_policy,
            spec.max_num_batched_tokens,
            caps.seqs or "any",
            caps.kv_blocks or "any",
            blocks,
        )
        worker = GenerativeWorker(
            deployment=deployment,
            engine=engine,
            kv_block_size=block_size,
            caps=caps,
            client=client,
            reply_ttl=settings.ROUNDHOUSE_REPLY_TTL_SECONDS,
            worker_id=worker_id_new(),
            capacity=spec.max_num_seqs - reserved,
            reserved=reserved,
            lease_seconds=lease_seconds(),
            drain_seconds=drain_seconds,
            stream_interval=interval_ms / 1000,
            flow_streams=settings.ROUNDHOUSE_STREAM_FLOW_STREAMS,
            adapters=adapters,
            metrics=metrics,
            batch_every=batch_every(settings.ROUNDHOUSE_BATCH_MIN_SHARE),
        )
        try:
            await self._run(worker, deployment)
        finally:
            engine.shutdown()
            await client.aclose()

    async def _run(self, worker: Worker, deployment: str) -> None:
        """Serve until SIGTERM or SIGINT drains the worker; report each state on the way."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.drain)

        async def ready() -> None:
            await _report(deployment_name=deployment, state=DeploymentState.READY)
            self.stdout.write(f"ready: serving {deployment}", ending="\n")
            self.stdout.flush()

        async def draining() -> None:
            await _report(deployment_name=deployment, state=DeploymentState.DRAINING)

        try:
            await worker.run(on_ready=ready, on_draining=draining)
        finally:
            await _report(deployment_name=deployment, state=DeploymentState.STOPPED)
            log.info("stopped after serving %d requests", worker.served)


async def _warm_up(engine: VllmEngine, max_model_len: int) -> None:
    """Run a concurrent batch of short and long prompts before taking traffic.

    The first requests after start-up are several times slower (lazy allocations, first-use
    code paths); they should not be a client's.
    """
    lengths = [n for n in (8, 64, 256, 1024) if n < max_model_len // 2]
    sampling = Sampling(max_tokens=16, ignore_eos=True, temperature=0.0)

    async def one(i: int, length: int) -> None:
        prompt = [(i * 7 + k) % 200 + 5 for k in range(length)]
        async for _ in engine.generate(
            request_id=f"warmup-{i}", prompt_token_ids=prompt, sampling=sampling
        ):
            pass

    for _ in range(2):
        await asyncio.gather(*(one(i, lengths[i % len(lengths)]) for i in range(8)))
