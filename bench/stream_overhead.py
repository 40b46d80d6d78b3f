"""What Switchyard costs on top of vLLM: the same streaming load against both, one after the other.

(a) vLLM's own OpenAI server on the tiny demo model, (b) Switchyard end to end (frontend, Redis
queue, worker with the same engine settings, usage ingester) on the same model. Each runs
streaming completions of 64 output tokens (ignore_eos) at concurrency 1, 8 and 32, and we
report aggregate output tokens/s, TTFT p50/p99 and the ratios Switchyard / vLLM. CPU time per
process is sampled during each level, because on a small machine the platform's own processes
compete with the engine for the same cores.

    .venv/bin/python bench/stream_overhead.py [--requests-per-level 8] [--levels 1,8,32]

Writes docs/benchmarks.md and docs/stream_overhead.png. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUTPUT_TOKENS = 64
PROMPT = "Once upon a time, in a switchyard far away,"
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 64
KV_CACHE_BYTES = 256 << 20
DTYPE = "float32"
ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class Level:
    concurrency: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    errors: int
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


@dataclass
class Target:
    name: str
    base_url: str
    model: str
    api_key: str
    processes: dict[str, psutil.Process]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _progress(text: str) -> None:
    print(f"[bench] {text}", flush=True)


async def _one(session: aiohttp.ClientSession, target: Target) -> tuple[float, int]:
    """Stream one completion; return (TTFT seconds, output tokens)."""
    body = {
        "model": target.model,
        "prompt": PROMPT,
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    headers = {"Authorization": f"Bearer {target.api_key}"}
    started = time.perf_counter()
    ttft = -1.0
    tokens = 0
    async with session.post(
        f"{target.base_url}/v1/completions", json=body, headers=headers
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif ttft < 0 and chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - started
    return ttft, tokens


def _cpu(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """Return CPU seconds used so far by each named process and its children."""
    totals: dict[str, float] = {}
    for name, proc in processes.items():
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        totals[name] = total
    return totals


async def _level(target: Target, concurrency: int, requests: int) -> Level:
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm the path (caches, connections, the engine's first-use code) at this concurrency.
        await asyncio.gather(*(_one(session, target) for _ in range(concurrency)))
        await asyncio.gather(*(_one(session, target) for _ in range(concurrency)))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        results: list[tuple[float, int]] = []
        errors = 0

        async def client() -> None:
            nonlocal errors
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    results.append(await _one(session, target))
                except Exception as exc:
                    errors += 1
                    _progress(f"request failed: {exc}")

        cpu_before = _cpu(target.processes)
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu_after = _cpu(target.processes)
    ttfts = sorted(r[0] * 1000 for r in results if r[0] >= 0)
    tokens = sum(r[1] for r in results)
    p99_index = min(len(ttfts) - 1, max(0, round(0.99 * (len(ttfts) - 1))))
    return Level(
        concurrency=concurrency,
        tokens_per_s=tokens / wall,
        ttft_p50_ms=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99_ms=ttfts[p99_index] if ttfts else float("nan"),
        errors=errors,
        cpu_seconds={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
        wall_s=wall,
    )


def _wait(check: Callable[[], bool], popen: subprocess.Popen[bytes], what: str, log: Path) -> None:
    started = time.monotonic()
    last = started
    while time.monotonic() - started < 600:
        if popen.poll() is not None:
            raise SystemExit(f"{what} exited:\n{log.read_text(errors='replace')[-3000:]}")
        if check():
            _progress(f"{what} ready after {time.monotonic() - started:.0f}s")
            return
        if time.monotonic() - last > 10:
            last = time.monotonic()
            _progress(f"waiting for {what} ({time.monotonic() - started:.0f}s)")
        time.sleep(0.3)
    raise SystemExit(f"{what} not ready after 600s")


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(popens: list[subprocess.Popen[bytes]]) -> None:
    for popen in popens:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGTERM)
    for popen in popens:
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


def run_vllm_server(model_dir: Path, work: Path, levels: list[int], per_level: int) -> list[Level]:
    port = _free_port()
    log = work / "vllm-server.log"
    env = {**os.environ, **ENGINE_ENV}
    popen = _spawn(
        [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", DTYPE, "--enforce-eager",
            "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", str(MAX_NUM_SEQS),
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--disable-log-stats", "--uvicorn-log-level", "warning",
        ],
        log,
        env,
    )  # fmt: skip
    try:
        _wait(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), popen, "vLLM server", log)
        target = Target(
            name="vllm",
            base_url=f"http://127.0.0.1:{port}",
            model="tiny",
            api_key="none",
            processes={"vllm server": psutil.Process(popen.pid)},
        )
        return [_measure(target, c, per_level) for c in levels]
    finally:
        _stop([popen])


def _measure(target: Target, concurrency: int, per_level: int) -> Level:
    requests = max(per_level * concurrency, 32)
    _progress(f"{target.name}: concurrency {concurrency}, {requests} requests")
    level = asyncio.run(_level(target, concurrency, requests))
    _progress(
        f"{target.name}: c={concurrency} {level.tokens_per_s:,.0f} tok/s, "
        f"TTFT p50 {level.ttft_p50_ms:.1f} ms p99 {level.ttft_p99_ms:.1f} ms"
    )
    return level


@dataclass
class Platform:
    """Embedded servers and the data the Switchyard runs share: started once per benchmark."""

    services: object
    env: dict[str, str]
    token: str


def prepare_switchyard(model_dir: Path, work: Path) -> Platform:
    from embedded.servers import ServiceConfig, services_start

    services = ServiceConfig(data_dir=work / "services", pg_port=0, redis_port=0, fast=True)
    endpoints = services_start(services)
    env = {
        **os.environ,
        **ENGINE_ENV,
        "DATABASE_URL": endpoints.database_url,
        "REDIS_URL": endpoints.redis_url,
        "SWITCHYARD_DATA_DIR": str(work),
        "DJANGO_SETTINGS_MODULE": "config.settings.dev",
        "DJANGO_DEBUG": "0",
    }
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "SWITCHYARD_DATA_DIR")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.dev"
    import django

    django.setup()
    from django.core.management import call_command

    from models_registry.services import deployment_create, model_version_register
    from tenants.models import Quota
    from tenants.services import api_key_issue, tenant_create

    call_command("migrate", verbosity=0)
    version, _ = model_version_register(model_name="tiny", source_dir=model_dir)
    deployment_create(
        name="tiny",
        version=version,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=KV_CACHE_BYTES,
        enforce_eager=True,
        dtype=DTYPE,
    )
    tenant = tenant_create(slug="bench")
    # The benchmark measures the data path, not the tenant's limits: make them unreachable.
    Quota.objects.filter(tenant=tenant).update(
        max_tokens_per_request=4096,
        requests_per_minute=10_000_000,
        tokens_per_minute=1_000_000_000,
        max_concurrency=10_000,
        monthly_budget=Decimal("1000000"),
    )
    token = api_key_issue(tenant=tenant, name="bench").token
    return Platform(services=services, env=env, token=token)


def run_switchyard(
    platform: Platform, work: Path, levels: list[int], per_level: int
) -> list[Level]:
    work.mkdir(parents=True, exist_ok=True)
    env = platform.env
    port = _free_port()
    py = sys.executable
    worker_log, web_log, ingest_log = (work / f"{n}.log" for n in ("worker", "web", "ingester"))
    worker = _spawn([py, "manage.py", "run_worker", "--deployment", "tiny"], worker_log, env)
    web = _spawn(
        [py, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log", "--log-level", "warning"],
        web_log,
        env,
    )  # fmt: skip
    ingester = _spawn([py, "manage.py", "run_ingester"], ingest_log, env)
    popens = [web, worker, ingester]
    try:
        _wait(lambda: b"ready: serving" in worker_log.read_bytes(), worker, "worker", worker_log)
        _wait(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), web, "frontend", web_log)
        processes = {
            "frontend": psutil.Process(web.pid),
            "worker+engine": psutil.Process(worker.pid),
            "ingester": psutil.Process(ingester.pid),
        }
        for name in ("postgres", "valkey"):
            pid = services_pid(platform.services, name)
            if pid:
                processes[name] = psutil.Process(pid)
        target = Target(
            name="switchyard",
            base_url=f"http://127.0.0.1:{port}",
            model="tiny",
            api_key=platform.token,
            processes=processes,
        )
        return [_measure(target, c, per_level) for c in levels]
    finally:
        _stop(popens)


def services_pid(config: object, name: str) -> int | None:
    from embedded.servers import ServiceConfig, services_status

    assert isinstance(config, ServiceConfig)
    entry = services_status(config).get(name)
    pid = entry.get("pid") if isinstance(entry, dict) else None
    return pid if isinstance(pid, int) else None


def _median_levels(rounds: list[list[Level]]) -> list[Level]:
    """Return, per concurrency level, the round with the median throughput."""
    picked = []
    for per_level in zip(*rounds, strict=True):
        ordered = sorted(per_level, key=lambda lvl: lvl.tokens_per_s)
        picked.append(ordered[(len(ordered) - 1) // 2])
    return picked


def _table(vllm: list[Level], switchyard: list[Level]) -> str:
    rows = [
        "| concurrency | vLLM tok/s | Switchyard tok/s | throughput ratio "
        "| vLLM TTFT p50 / p99 (ms) | Switchyard TTFT p50 / p99 (ms) | TTFT p50 delta (ms) "
        "| errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a, b in zip(vllm, switchyard, strict=True):
        rows.append(
            f"| {a.concurrency} | {a.tokens_per_s:,.0f} | {b.tokens_per_s:,.0f} "
            f"| **{b.tokens_per_s / a.tokens_per_s:.2f}** "
            f"| {a.ttft_p50_ms:.1f} / {a.ttft_p99_ms:.1f} "
            f"| {b.ttft_p50_ms:.1f} / {b.ttft_p99_ms:.1f} "
            f"| **{b.ttft_p50_ms - a.ttft_p50_ms:+.1f}** | {a.errors + b.errors} |"
        )
    return "\n".join(rows)


def _cpu_table(switchyard: list[Level], vllm: list[Level]) -> str:
    names = list(switchyard[0].cpu_seconds)
    header = "| concurrency | vLLM server | " + " | ".join(names) + " |"
    rows = [header, "| ---: " * (len(names) + 2) + "|"]
    for s, v in zip(switchyard, vllm, strict=True):
        share = [f"{100 * s.cpu_seconds[n] / s.wall_s:.0f}%" for n in names]
        vllm_share = f"{100 * sum(v.cpu_seconds.values()) / v.wall_s:.0f}%"
        rows.append(f"| {s.concurrency} | {vllm_share} | " + " | ".join(share) + " |")
    return "\n".join(rows)


def _plot(vllm: list[Level], switchyard: list[Level], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [lvl.concurrency for lvl in vllm]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(conc, [lvl.tokens_per_s for lvl in vllm], "o-", label="vLLM OpenAI server")
    left.plot(conc, [lvl.tokens_per_s for lvl in switchyard], "s-", label="Switchyard")
    left.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s")
    left.set_xticks(conc, [str(c) for c in conc])
    left.set_title("Aggregate throughput")
    left.legend()
    width = 0.35
    xs = range(len(conc))
    right.bar([x - width / 2 for x in xs], [lvl.ttft_p50_ms for lvl in vllm], width, label="vLLM")
    right.bar(
        [x + width / 2 for x in xs],
        [lvl.ttft_p50_ms for lvl in switchyard],
        width,
        label="Switchyard",
    )
    right.set_xticks(list(xs), [str(c) for c in conc])
    right.set(xlabel="concurrent streams", ylabel="TTFT p50 (ms)")
    right.set_title("Time to first token")
    right.legend()
    fig.suptitle(f"Streaming {OUTPUT_TOKENS} tokens, tiny Llama on this CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,8,32", help="comma-separated concurrency levels")
    parser.add_argument(
        "--requests-per-level", type=int, default=16, help="requests per stream at each level"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternate the two targets this many times"
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    levels = [int(c) for c in args.levels.split(",")]
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    platform: Platform | None = None
    vllm_rounds: list[list[Level]] = []
    switchyard_rounds: list[list[Level]] = []
    try:
        from models_registry.demo_model import demo_model_build

        _progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_switchyard(model_dir, work)
        for round_ in range(1, args.rounds + 1):
            # Alternating the targets spreads slow phases of the machine over both.
            _progress(f"round {round_}/{args.rounds}: (a) vLLM's own OpenAI server")
            vllm_rounds.append(run_vllm_server(model_dir, work, levels, args.requests_per_level))
            _progress(f"round {round_}/{args.rounds}: (b) Switchyard end to end")
            switchyard_rounds.append(
                run_switchyard(platform, work / f"sy{round_}", levels, args.requests_per_level)
            )
    finally:
        if platform is not None:
            from embedded.servers import ServiceConfig, services_stop

            assert isinstance(platform.services, ServiceConfig)
            services_stop(platform.services)
        shutil.rmtree(work, ignore_errors=True)
    vllm = _median_levels(vllm_rounds)
    switchyard = _median_levels(switchyard_rounds)
    table = _table(vllm, switchyard)
    cpu = _cpu_table(switchyard, vllm)
    print("\n" + table + "\n\nCPU use during each level (100% = one core):\n" + cpu)
    args.docs.mkdir(exist_ok=True)
    _plot(vllm, switchyard, args.docs / "stream_overhead.png")
    (args.docs / "benchmarks.md").write_text(
        "# Benchmarks\n\n"
        "## Streaming overhead: Switchyard vs vLLM's own OpenAI server\n\n"
        f"`bench/stream_overhead.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"tiny Llama demo model, eager mode, {OUTPUT_TOKENS} output tokens per request "
        f"(ignore_eos), {args.requests_per_level} requests per stream per level (32 at least), "
        f"{args.rounds} alternating rounds, the median round per level shown. Both targets run "
        "the same engine settings, one after the other, from one process tree.\n\n"
        + table
        + "\n\nCPU use per process during each level of the Switchyard run "
        "(CPU seconds / wall seconds; 100% = one core of the machine's "
        f"{os.cpu_count()}):\n\n" + cpu + "\n\n![throughput and TTFT](stream_overhead.png)\n"
    )
    _progress(f"wrote {args.docs / 'benchmarks.md'} and {args.docs / 'stream_overhead.png'}")


if __name__ == "__main__":
    main()
