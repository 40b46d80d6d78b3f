"""The platform's own time per request: this checkout beside a base commit, on one machine.

One Roundhouse stack on the tiny demo model (embedded PostgreSQL and Valkey, a frontend and a
worker hosting the engine, the usage ingester) and vLLM's own OpenAI server with the same
engine settings. With `--base REV`, a second frontend and worker run that commit's code from a
git worktree, on the same servers, serving a deployment of their own of the same model
(registered under another name): the whole request path, before and after, measured in one
run. Every engine is pinned to core 0; the frontends, the datastores and the load generator
share core 1. The ingester and PostgreSQL serve both, so the base must keep this checkout's
database schema and usage records or an older form of them (since the base, migrations only
added and fields only added to `dataplane/types.py`); its requests carry a tenant of their
own, whose limits an older commit may keep in Valkey otherwise.

Three measures, in rounds:

- one at a time: streamed chats of 16 tokens (ignore_eos), to every target in turn request by
  request (the order shuffled each time, a pause after each), time to first token at the
  client; for each Roundhouse target its split by stage from the usage records (frontend:
  sent → job built; queue: job built → started, the quota and queue scripts and a worker's
  claim; relay: first token → client), and the TTFT it adds over vLLM's server; and the
  inter-token latency (ITL: the gaps between a stream's chunks of text after the first);
- eight at once: the same chats, 8 streams at a time, to each target in turn: ITL beside
  other streams;
- closed loop: one-token chats at concurrency 32 to each Roundhouse target in turn for
  `--seconds`: requests/s, and the frontend process's CPU seconds over the wall time, so
  requests/s per frontend core; and what a request cost in calls, from counters read around
  the loop: the frontend's system calls (reads and writes: its client's socket, Valkey's, its
  loop's wake-ups) and the script calls Valkey ran (the frontend's, and the worker's and the
  ingester's for the same requests).

    .venv/bin/python bench/platform_time.py [--base REV] [--rounds 3] [--requests 200]

Writes its section of docs/benchmarks.md, docs/img/platform_time.png and every sample to
docs/bench-data/platform_time.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    Sent,
    Target,
    TextTimes,
    bench_headers,
    chat_body,
    client_session,
    cpu_features,
    free_port,
    http_ok,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    services_pid,
    spawn,
    stop,
    tree_pin,
    ttft_stages,
    vllm_server,
    wait_for,
    worktree_add,
    worktree_remove,
)

MAX_NUM_SEQS = 64
PROMPT = "Once upon a time, in a roundhouse far away,"
TOKENS = 16
CONCURRENCY = 32
STREAMS = 8  # the second ITL measure: this many streams at once
ENGINE_CPUS = "0"
PLATFORM_CPUS = "1"
PAUSE_SECONDS = 0.03
ORDER = random.Random(20261206)
STAGES = ("frontend", "queue", "relay")
# What the base's frontend and worker share with this checkout's ingester and database.
SHARED = ("dataplane/types.py", "*/migrations/*")
BASE_MODEL = "tiny-base"  # the base's own deployment, and the name its requests call
BASE_TENANT = "bench-base"  # the tenant whose key the base's requests carry
# The commands that run a script, as Valkey's INFO commandstats names them.
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
# What issue 60 asks at one stream (medians).
STAGES_TARGET_MS = 2.0
ADDED_TARGET_MS = 2.0
ITL_TARGET = 1.5  # ITL p50 at 1 and STREAMS streams, ÷ vLLM's


@dataclass
class Samples:
    """One target's figures, pooled over the rounds."""

    ttft_ms: list[float] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)  # one stream at a time
    itl_streams_ms: list[float] = field(default_factory=list)  # STREAMS at once
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    rps: list[float] = field(default_factory=list)
    frontend_cores: list[float] = field(default_factory=list)
    syscalls: list[float] = field(default_factory=list)  # the frontend's, a request
    scripts: list[float] = field(default_factory=list)  # Valkey's script calls, a request
    errors: int = 0

    def per_core(self) -> list[float]:
        return [r / c for r, c in zip(self.rps, self.frontend_cores, strict=True) if c > 0]


# ------------------------------------------------------------------------------------- load


async def _streamed(session: aiohttp.ClientSession, target: Target) -> tuple[Sent, list[float]]:
    """Stream one chat; return its request id, when it was sent and its TTFT, and the gaps
    between the chunks that carried text after the first (ms)."""
    sent_at = time.time()
    times = TextTimes()
    request_id = ""
    async with session.post(
        f"{target.base_url}/v1/chat/completions",
        json=chat_body(target, PROMPT, TOKENS, stream=True),
        headers=bench_headers(target),
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {(await response.read())[:300]!r}")
        request_id = response.headers.get("x-request-id", "")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                times.text()
    return Sent(request_id, sent_at, times.ttft_ms), times.gaps_ms


async def _plain(session: aiohttp.ClientSession, target: Target) -> None:
    async with session.post(
        f"{target.base_url}/v1/chat/completions",
        json=chat_body(target, PROMPT, 1, stream=False),
        headers=bench_headers(target),
    ) as response:
        payload = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {payload[:300]!r}")


async def _one_at_a_time(targets: list[Target], requests: int, into: dict[str, Samples]) -> None:
    """Streamed chats one at a time, to every target in turn in a shuffled order."""
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(client_session(2)) for _ in targets]
        pairs = list(zip(sessions, targets, strict=True))
        for session, target in pairs:
            for _ in range(5):  # warm connections and caches on each path
                await _streamed(session, target)
        for done in range(requests):
            for session, target in ORDER.sample(pairs, len(pairs)):
                samples = into[target.name]
                try:
                    sent, gaps = await _streamed(session, target)
                except Exception as exc:
                    samples.errors += 1
                    progress(f"{target.name}: request failed: {exc}")
                else:
                    samples.ttft_ms.append(sent.ttft_ms)
                    samples.sent.append(sent)
                    samples.itl_ms.extend(gaps)
                await asyncio.sleep(PAUSE_SECONDS)
            if (done + 1) % 50 == 0:
                progress(f"one at a time: {done + 1}/{requests} requests to each target")


async def _streams_at_once(targets: list[Target], requests: int, into: dict[str, Samples]) -> None:
    """`requests` streamed chats, STREAMS at a time, to each target in turn (a shuffled order):
    the gaps between a stream's tokens while others run beside it."""
    for target in ORDER.sample(targets, len(targets)):
        await _streams(target, requests, into[target.name])


async def _streams(target: Target, requests: int, samples: Samples) -> None:
    left = requests
    async with client_session(STREAMS * 2) as session:

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                try:
                    _, gaps = await _streamed(session, target)
                except Exception as exc:
                    samples.errors += 1
                    progress(f"{target.name}: request failed: {exc}")
                else:
                    samples.itl_streams_ms.extend(gaps)

        await asyncio.gather(*(client() for _ in range(STREAMS)))


@dataclass(frozen=True)
class Calls:
    """Counters of calls, read before and after a closed loop: the frontend process's system
    calls (reads and writes) and the script calls Valkey has run."""

    syscalls: float
    scripts: float

    def per_request(self, before: Calls, requests: int) -> Calls | None:
        """What each of `requests` cost between `before` and these counters (None: none)."""
        if requests <= 0:
            return None
        return Calls(
            syscalls=(self.syscalls - before.syscalls) / requests,
            scripts=(self.scripts - before.scripts) / requests,
        )


def calls_read(frontend: psutil.Process, valkey: redis.Redis) -> Calls:
    """The frontend's system calls and Valkey's script calls so far."""
    io = frontend.io_counters()
    stats: dict = valkey.info("commandstats")
    scripts = sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in SCRIPT_COMMANDS)
    return Calls(syscalls=io.read_count + io.write_count, scripts=scripts)


@dataclass(frozen=True)
class Loop:
    """One closed loop's figures."""

    rps: float
    frontend_cores: float
    errors: int
    calls: Calls | None  # a request's


async def _closed_loop(
    target: Target, seconds: float, frontend: psutil.Process, valkey: redis.Redis
) -> Loop:
    """One-token chats at CONCURRENCY for `seconds`."""
    async with client_session(CONCURRENCY) as session:
        await asyncio.gather(*(_plain(session, target) for _ in range(CONCURRENCY)))
        done = errors = 0

        async def client(deadline: float) -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                try:
                    await _plain(session, target)
                    done += 1
                except Exception as exc:
                    errors += 1
                    if errors <= 3:
                        progress(f"{target.name}: request failed: {exc}")

        calls_before = calls_read(frontend, valkey)
        cpu_before = sum(frontend.cpu_times()[:2])
        started = time.perf_counter()
        await asyncio.gather(*(client(started + seconds) for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - started
        cpu = sum(frontend.cpu_times()[:2]) - cpu_before
        calls = calls_read(frontend, valkey).per_request(calls_before, done)
    return Loop(done / wall, cpu / wall, errors, calls)


# ----------------------------------------------------------------------------------- targets


def _schema_kept(rev: str, root: Path = ROOT) -> bool:
    """Whether `rev`'s code runs on this checkout's database and ingester: since `rev`, the
    shared files only gained (migrations added, none changed or removed; fields added to the
    usage records, which an older worker's events leave at their defaults)."""
    changed = subprocess.run(
        ["git", "-C", str(root), "diff", "--numstat", "--diff-filter=ADMR", rev, "--", *SHARED],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    added_files = subprocess.run(
        ["git", "-C", str(root), "diff", "--name-only", "--diff-filter=A", rev, "--", *SHARED],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for line in changed.splitlines():
        _added, removed, path = line.split("\t", 2)
        if path in added_files and "/migrations/" in path:
            continue
        if path == "dataplane/types.py" and removed == "0":
            continue
        return False
    return True


@contextlib.contextmanager
def _worktree(rev: str, work: Path) -> Iterator[Path]:
    """The base commit's code, checked out beside this one; refused unless its schema and
    usage records are this checkout's or an older form of them (`_schema_kept`)."""
    if not _schema_kept(rev):
        raise SystemExit(f"{rev} has another schema or usage record than this checkout")
    tree = worktree_add(rev, work)
    try:
        yield tree
    finally:
        worktree_remove(tree)


@contextlib.contextmanager
def _base_stack(platform: Platform, tree: Path, work: Path) -> Iterator[Target]:
    """A frontend and a worker running `tree`'s code on the platform's servers, the worker
    serving the base's own deployment (engine on the engine core, frontend on the other)."""
    port = free_port()
    env = {**platform.env, "PYTHONPATH": str(tree), "VLLM_CPU_OMP_THREADS_BIND": ENGINE_CPUS}
    worker_log, web_log = work / "base-worker.log", work / "base-web.log"
    worker_args = ["manage.py", "run_worker", "--deployment", BASE_MODEL]
    worker = spawn(["taskset", "-c", ENGINE_CPUS, sys.executable, *worker_args], worker_log, env,
                   cwd=tree)  # fmt: skip
    web_args = ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    web = spawn(["taskset", "-c", PLATFORM_CPUS, sys.executable, *web_args], web_log, env,
                cwd=tree)  # fmt: skip
    try:
        wait_for(lambda: b"ready: serving" in worker_log.read_bytes(), worker, "base worker",
                 worker_log)  # fmt: skip
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), web, "base", web_log)
        yield Target(
            name="base",
            base_url=f"http://127.0.0.1:{port}",
            model=BASE_MODEL,
            # A tenant of its own: an older commit may keep a tenant's limits in Valkey
            # otherwise than this one.
            api_keys={"bench": platform.tokens[BASE_TENANT]},
            processes={"frontend": psutil.Process(web.pid)},
        )
    finally:
        stop([web, worker])


def _base_deployment(model_dir: Path) -> None:
    """The base's own version and deployment of the demo model: another name and price make
    another version, served by the base's worker only."""
    from decimal import Decimal

    from bench.common import DTYPE, KV_CACHE_BYTES, MAX_MODEL_LEN
    from models_registry.services import deployment_create, model_version_register

    version, _ = model_version_register(
        model_name=BASE_MODEL, source_dir=model_dir, price_input_per_1k=Decimal("0.0001")
    )
    deployment_create(
        name=BASE_MODEL,
        version=version,
        max_num_seqs=MAX_NUM_SEQS,
        max_queued=256,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=KV_CACHE_BYTES,
        enforce_eager=True,
        dtype=DTYPE,
    )


def run(args: argparse.Namespace, work: Path) -> dict[str, Samples]:
    from models_registry.demo_model import demo_model_build

    progress("building the tiny demo model")
    model_dir = demo_model_build(out_dir=work / "model")
    platform: Platform | None = None
    names = ["vllm", "now", *(["base"] if args.base else [])]
    samples = {name: Samples() for name in names}
    try:
        platform = prepare_roundhouse(
            model_dir,
            work,
            tenants={"bench": {}, **({BASE_TENANT: {}} if args.base else {})},
            max_num_seqs=MAX_NUM_SEQS,
        )
        for service in ("postgres", "valkey"):
            pid = services_pid(platform.services, service)
            if pid is not None:
                tree_pin(psutil.Process(pid), PLATFORM_CPUS)
        if args.base:
            _base_deployment(model_dir)  # before the ingester starts: it reads them once
        with contextlib.ExitStack() as stack:
            progress("starting vLLM's OpenAI server")
            engine = stack.enter_context(
                vllm_server(model_dir, work, max_num_seqs=MAX_NUM_SEQS, cpus=ENGINE_CPUS)
            )
            engine.name = "vllm"
            progress("starting Roundhouse")
            now = stack.enter_context(
                roundhouse_stack(
                    platform, work / "rh", engine_cpus=ENGINE_CPUS, platform_cpus=PLATFORM_CPUS
                )
            )
            now.name = "now"
            frontends = {"now": now.processes["frontend"]}
            targets = [engine, now]
            if args.base:
                tree = stack.enter_context(_worktree(args.base, work))
                progress(f"starting a frontend and a worker at {args.base} beside it")
                base = stack.enter_context(_base_stack(platform, tree, work))
                targets.append(base)
                frontends["base"] = base.processes["frontend"]
            # The load generator shares the platform core, as in the other benchmarks.
            psutil.Process().cpu_affinity([int(PLATFORM_CPUS)])
            valkey = stack.enter_context(redis.Redis.from_url(platform.env["REDIS_URL"]))
            for round_ in range(1, args.rounds + 1):
                progress(f"round {round_}/{args.rounds}: {args.requests} streamed chats each")
                asyncio.run(_one_at_a_time(targets, args.requests, samples))
                progress(f"round {round_}/{args.rounds}: {STREAMS} streams at once")
                asyncio.run(_streams_at_once(targets, max(args.requests // 2, STREAMS), samples))
                order = [t for t in targets if t.name in frontends]
                for target in order if round_ % 2 else order[::-1]:
                    loop = asyncio.run(
                        _closed_loop(target, args.seconds, frontends[target.name], valkey)
                    )
                    found = samples[target.name]
                    found.rps.append(loop.rps)
                    found.frontend_cores.append(loop.frontend_cores)
                    found.errors += loop.errors
                    if loop.calls is not None:
                        found.syscalls.append(loop.calls.syscalls)
                        found.scripts.append(loop.calls.scripts)
                    progress(
                        f"{target.name}: {loop.rps:,.0f} req/s at concurrency {CONCURRENCY}, "
                        f"frontend {loop.frontend_cores:.2f} cores, "
                        f"{loop.rps / max(loop.frontend_cores, 1e-9):,.0f} req/s per core"
                    )
        for name in frontends:
            # Read once every usage record is in: every round's requests at once.
            samples[name].stages_ms = ttft_stages(samples[name].sent, wait_s=30)
    finally:
        platform_stop(platform)
    return samples


# ------------------------------------------------------------------------------------ report


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _summary(samples: dict[str, Samples]) -> dict[str, dict[str, float]]:
    vllm = samples["vllm"]
    vllm_ttft = _p50(vllm.ttft_ms)
    vllm_itl, vllm_itl_streams = _p50(vllm.itl_ms), _p50(vllm.itl_streams_ms)
    out: dict[str, dict[str, float]] = {
        "vllm": {
            "ttft_p50_ms": vllm_ttft,
            "itl_p50_ms": vllm_itl,
            "itl_streams_p50_ms": vllm_itl_streams,
        }
    }
    for name, found in samples.items():
        if name == "vllm":
            continue
        stages = {s: _p50(found.stages_ms.get(s, [])) for s in STAGES}
        out[name] = {
            "ttft_p50_ms": _p50(found.ttft_ms),
            "ttft_p99_ms": percentile(found.ttft_ms, 0.99),
            "ttft_added_p50_ms": _p50(found.ttft_ms) - vllm_ttft,
            **{f"{s}_p50_ms": v for s, v in stages.items()},
            "stages_p50_ms": sum(stages.values()),
            "engine_p50_ms": _p50(found.stages_ms.get("engine", [])),
            "itl_p50_ms": _p50(found.itl_ms),
            "itl_ratio": _p50(found.itl_ms) / vllm_itl,
            "itl_streams_p50_ms": _p50(found.itl_streams_ms),
            "itl_streams_ratio": _p50(found.itl_streams_ms) / vllm_itl_streams,
            "rps": _p50(found.rps),
            "frontend_cores": _p50(found.frontend_cores),
            "rps_per_core": _p50(found.per_core()),
            "syscalls_per_request": _p50(found.syscalls),
            "scripts_per_request": _p50(found.scripts),
            "errors": found.errors,
        }
    return out


def _table(summary: dict[str, dict[str, float]], base: str | None) -> str:
    names = ["now", *(["base"] if base else [])]
    label = {"now": "this checkout", "base": f"base `{base}`"}
    rows = [
        ("frontend: sent → job built", "frontend_p50_ms", "{:.2f} ms"),
        ("queue: job built → started", "queue_p50_ms", "{:.2f} ms"),
        ("relay: first token → client", "relay_p50_ms", "{:.2f} ms"),
        (f"**platform stages** (target ≤ {STAGES_TARGET_MS:g} ms)", "stages_p50_ms", "{:.2f} ms"),
        ("engine: started → first token", "engine_p50_ms", "{:.2f} ms"),
        ("TTFT at the client", "ttft_p50_ms", "{:.2f} ms"),
        (
            f"**TTFT added over vLLM's server** (target ≤ {ADDED_TARGET_MS:g} ms)",
            "ttft_added_p50_ms",
            "{:+.2f} ms",
        ),
        ("ITL at one stream", "itl_p50_ms", "{:.2f} ms"),
        (f"**ITL at one stream ÷ vLLM's** (target ≤ {ITL_TARGET:g})", "itl_ratio", "{:.2f}"),
        (f"ITL at {STREAMS} streams", "itl_streams_p50_ms", "{:.2f} ms"),
        (
            f"**ITL at {STREAMS} streams ÷ vLLM's** (target ≤ {ITL_TARGET:g})",
            "itl_streams_ratio",
            "{:.2f}",
        ),
        ("requests/s at concurrency 32 (one-token chats)", "rps", "{:,.0f}"),
        ("frontend cores used meanwhile", "frontend_cores", "{:.2f}"),
        ("**requests/s per frontend core**", "rps_per_core", "{:,.0f}"),
        ("frontend system calls a request (reads, writes)", "syscalls_per_request", "{:.2f}"),
        ("Valkey script calls a request", "scripts_per_request", "{:.2f}"),
    ]
    head = "| p50 | " + " | ".join(label[n] for n in names)
    head += " | now ÷ base |" if base else " |"
    lines = [head, "| --- |" + " ---: |" * (len(names) + (1 if base else 0))]
    for title, key, fmt in rows:
        cells = [fmt.format(summary[n][key]) for n in names]
        if base:
            before = summary["base"][key]
            cells.append(f"{summary['now'][key] / before:.2f}" if before else "")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    vllm = summary["vllm"]
    for title, value in (
        ("TTFT", vllm["ttft_p50_ms"]),
        ("ITL at one stream", vllm["itl_p50_ms"]),
        (f"ITL at {STREAMS} streams", vllm["itl_streams_p50_ms"]),
    ):
        lines.append(f"| vLLM's own server: {title} | {value:.2f} ms |"
                     + " |" * (len(names) - 1 + (1 if base else 0)))  # fmt: skip
    return "\n".join(lines)


def _plot(samples: dict[str, Samples], path: Path, base: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("now", "base") if n in samples]
    label = {"now": "this checkout", "base": f"base {base}"}
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    bottom = [0.0] * len(names)
    for stage in STAGES:
        values = [_p50(samples[n].stages_ms.get(stage, [])) for n in names]
        left.bar([label[n] for n in names], values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.axhline(STAGES_TARGET_MS, color="black", linestyle="--", linewidth=1, label="target")
    left.set(ylabel="ms (p50 of each stage)", title="The platform's stages at one stream")
    left.legend(fontsize=8)
    streamed = ["vllm", *names]
    width = 0.8 / len(streamed)
    for i, name in enumerate(streamed):
        found = samples[name]
        middle.bar(
            [x + (i - (len(streamed) - 1) / 2) * width for x in (0, 1)],
            [_p50(found.itl_ms), _p50(found.itl_streams_ms)],
            width,
            label=label.get(name, "vLLM's own server"),
        )
    middle.set_xticks([0, 1], ["one stream", f"{STREAMS} streams"])
    middle.set(ylabel="ms (p50 gap between chunks)", title="Inter-token latency")
    middle.legend(fontsize=8)
    right.bar([label[n] for n in names], [_p50(samples[n].per_core()) for n in names])
    right.set(ylabel="requests/s per frontend core", title="One-token chats, concurrency 32")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _headline(summary: dict[str, dict[str, float]], base: str | None) -> list[dict[str, object]]:
    now = summary["now"]
    rows: list[dict[str, object]] = [
        {
            "measure": "Platform stages at one stream (frontend + queue + relay), p50 (ms)",
            "value": now["stages_p50_ms"],
            "target": f"≤ {STAGES_TARGET_MS:g}",
        },
        {
            "measure": "TTFT added over vLLM's server at one stream, p50 (ms)",
            "value": now["ttft_added_p50_ms"],
            "target": f"≤ {ADDED_TARGET_MS:g}",
        },
        {
            "measure": "ITL p50 at one stream, Roundhouse ÷ vLLM",
            "value": now["itl_ratio"],
            "target": f"≤ {ITL_TARGET:g}",
        },
        {
            "measure": f"ITL p50 at {STREAMS} streams, Roundhouse ÷ vLLM",
            "value": now["itl_streams_ratio"],
            "target": f"≤ {ITL_TARGET:g}",
        },
        {"measure": "Frontend requests/s per core (concurrency 32)", "value": now["rps_per_core"]},
    ]
    if base:
        before = summary["base"]
        rows += [
            {
                "measure": f"Platform stages at one stream, this checkout ÷ `{base}`",
                "value": now["stages_p50_ms"] / before["stages_p50_ms"],
            },
            {
                "measure": f"Frontend requests/s per core, this checkout ÷ `{base}`",
                "value": now["rps_per_core"] / before["rps_per_core"],
            },
        ]
    return rows


def report(samples: dict[str, Samples], args: argparse.Namespace) -> None:
    summary = _summary(samples)
    print(_table(summary, args.base))
    plot = plot_path(args.docs, "platform_time")
    _plot(samples, plot, args.base)
    beside = (
        f" beside a frontend and a worker at commit `{args.base}` (a worktree, the same "
        "servers, a deployment of its own of the same model)"
        if args.base
        else ""
    )
    text = (
        "## The platform's own time per request\n\n"
        f"`bench/platform_time.py`, {time.strftime('%Y-%m-%d')}, {psutil.cpu_count()} CPU "
        f"cores ({cpu_features()}), tiny Llama demo model, {args.rounds} rounds. This "
        f"checkout's frontend and worker{beside}, and vLLM's own OpenAI server with the same "
        "engine settings; the engines on core 0, frontends, datastores and the load generator on "
        f"core 1. One at a time: {args.requests} streamed chats of {TOKENS} tokens to each "
        "target per round, in a shuffled order; the stages come from the usage records and "
        "the client's clock; ITL is the gap between a stream's chunks of text after the first, "
        f"one stream at a time and {STREAMS} at once ({max(args.requests // 2, STREAMS)} "
        "chats per target per round). Closed loop: one-token chats at concurrency 32 to each "
        f"frontend in turn for {args.seconds:g} s a round; requests/s ÷ the frontend process's CPU "
        "(cores). Medians over the rounds. On a 2-core machine the closed loop moves by up "
        "to a fifth between rounds (two unchanged stacks read 0.87 to 1.07 of each other in "
        "one run, and 1.03 of each other's ITL): a smaller ratio is noise. Compare figures "
        "within a run only.\n\n"
        + _table(summary, args.base)
        + "\n\n![the platform's stages, inter-token latency and requests per core]"
        + f"({plot.parent.name}/{plot.name})\n"
    )
    section_write(args.docs, "platform_time", text)
    results_write(
        args.docs,
        "platform_time",
        {
            "section": "platform_time",
            "headline": _headline(summary, args.base),
            "base": args.base,
            "rounds": args.rounds,
            "requests": args.requests,
            "seconds": args.seconds,
            "summary": summary,
            "samples": {
                name: {
                    "ttft_ms": found.ttft_ms,
                    "itl_ms": found.itl_ms,
                    "itl_streams_ms": found.itl_streams_ms,
                    "stages_ms": found.stages_ms,
                    "rps": found.rps,
                    "frontend_cores": found.frontend_cores,
                    "syscalls": found.syscalls,
                    "scripts": found.scripts,
                }
                for name, found in samples.items()
            },
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="a commit whose frontend is measured beside this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="streamed chats per round")
    parser.add_argument("--seconds", type=float, default=8.0, help="closed loop, per round")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    try:
        report(run(args, work), args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
