"""What the benchmarks share: starting vLLM's own server or a Roundhouse stack on the demo model.

Each benchmark runs its targets side by side from one process tree, with the same engine
settings, and writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAX_MODEL_LEN = 2048
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
UNLIMITED_QUOTA: dict[str, Any] = {
    "max_tokens_per_request": 4096,
    "requests_per_minute": 10_000_000,
    "tokens_per_minute": 1_000_000_000,
    "max_concurrency": 10_000,
    "monthly_budget": Decimal("1000000"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def progress(text: str) -> None:
    """Print a progress line; paths inside the checkout are shown from its root, so a saved
    log names no machine's folders."""
    print(f"[bench] {text.replace(f'{ROOT}/', '')}", flush=True)


def percentile(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1) of values by nearest rank; NaN when empty."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# The stages of a Roundhouse request's time to first token, read from its usage record's
# timestamps and the client's clock (one machine: one clock).
TTFT_STAGES = {
    "frontend": "sent → admitted: HTTP, key, parsing, chat template and tokens",
    "queue": "admitted → started: quota and queue scripts, a worker's claim",
    "engine": "started → first token: the engine's prefill step behind the running batch",
    "relay": "first token → client: the worker's write, the frontend's relay, SSE",
}


@dataclass
class TextTimes:
    """When a stream's chunks of text reached its client: the time to the first (TTFT) and the
    gaps between the ones after it (ITL), in ms. Call `text` as each chunk with text is read."""

    started: float = field(default_factory=time.perf_counter)
    ttft_ms: float = -1.0
    gaps_ms: list[float] = field(default_factory=list)
    _last: float = 0.0

    def text(self) -> None:
        now = time.perf_counter()
        if self.ttft_ms < 0:
            self.ttft_ms = (now - self.started) * 1000
        else:
            self.gaps_ms.append((now - self._last) * 1000)
        self._last = now


@dataclass
class Sent:
    """One streamed request as its client saw it: what finds its usage record, and its TTFT."""

    request_id: str
    sent_at: float  # time.time() as it was sent
    ttft_ms: float


def ttft_stages(sent: list[Sent], *, wait_s: float = 10.0) -> dict[str, list[float]]:
    """Split each request's TTFT into `TTFT_STAGES` (ms per request, in `sent`'s order).

    Waits up to `wait_s` for the ingester to write the usage records; a request without one
    (or one that never started) is left out. Needs Django set up (`prepare_roundhouse`).
    """
    from billing.models import UsageRecord

    ids = [x.request_id for x in sent]
    deadline = time.monotonic() + wait_s
    while UsageRecord.objects.filter(request_id__in=ids).count() < len(set(ids)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    records = UsageRecord.objects.in_bulk(ids, field_name="request_id")
    out: dict[str, list[float]] = {name: [] for name in TTFT_STAGES}
    for x in sent:
        record = records.get(x.request_id)
        if record is None or record.started_at is None or record.first_token_at is None:
            continue
        admitted = record.enqueued_at.timestamp()
        started = record.started_at.timestamp()
        first = record.first_token_at.timestamp()
        seen = x.sent_at + x.ttft_ms / 1000
        for name, seconds in (
            ("frontend", admitted - x.sent_at),
            ("queue", started - admitted),
            ("engine", first - started),
            ("relay", seen - first),
        ):
            out[name].append(seconds * 1000)
    return out


def cpu_features() -> str:
    """The processor's model and the vector extensions vLLM's CPU kernels use, as one line.

    The engine's speed differs by about five times between cores with AVX-512 and bf16 (or
    AMX) and plain AVX2 ones, so a figure means little without it.
    """
    model, flags = "unknown processor", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
    found = [flag for flag in wanted if flag in flags]
    return f"{model}; {', '.join(found) or 'no AVX2'}"


def accelerator() -> str:
    """The GPU the engines run on, as nvidia-smi names it, or "" on a machine without one.

    Asked of nvidia-smi rather than torch, so that the benchmark's own process opens no CUDA
    context beside the engines'.
    """
    try:
        found = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    names = [line.strip() for line in found.stdout.splitlines() if line.strip()]
    return names[0] if names else ""


def machine_line(*, gpu: str, vllm: str, cores: int | None, cpu: str) -> str:
    """How a section names the machine it ran on: the GPU, or the CPU's cores and features."""
    if gpu:
        return f"one {gpu}, vLLM {vllm} on both sides, {cores} CPU cores"
    return f"{cores} CPU cores ({cpu}), vLLM {vllm}"


def vllm_version() -> str:
    """The installed vLLM's version (vllm-cpu on CPU machines, CUDA vllm on GPU ones)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return version(dist)
    return "unknown"


def median_ratio_pair(pairs: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Of (vLLM, Roundhouse) figures measured back to back, the pair whose tokens/s ratio
    Roundhouse ÷ vLLM is the median.

    A pair sees one state of the machine; its speed drifts between rounds by more than the
    difference measured, so each side's own median round would pair two different moments.
    """
    ordered = sorted(pairs, key=lambda p: p[1].tokens_per_s / p[0].tokens_per_s)
    return ordered[(len(ordered) - 1) // 2]


def closed_loop_rate(slots: int, durations: list[float]) -> float:
    """Completions per second of a closed loop that keeps `slots` requests busy (Little's law).

    Pass the durations of the requests sent after the loop's first round: the slots start
    together and finish in step, so counting completions in a window is off by a round.
    """
    return slots / (sum(durations) / len(durations))


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def chat_request(
    base_url: str, key: str, *, model: str, content: str, max_tokens: int, stream: bool
) -> urllib.request.Request:
    """One chat completion request to a target's /v1, for urllib.request.urlopen."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )


def chat_body(target: Target, content: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    """A greedy chat completion of `max_tokens` tokens for a target, usage last when streamed."""
    body: dict[str, Any] = {
        "model": target.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def bench_headers(target: Target) -> dict[str, str]:
    """The headers of a request as the bench tenant (a key vLLM's own server ignores)."""
    return {"Authorization": f"Bearer {target.api_keys.get('bench', 'none')}"}


def client_session(limit: int, *, total_s: float = 120) -> Any:
    """An aiohttp session of `limit` connections whose requests give up after `total_s`."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        timeout=aiohttp.ClientTimeout(total=total_s),
    )


def tree_pin(root: psutil.Process, cpus: str) -> None:
    """Pin a running process and its children (PostgreSQL, Valkey) to `cpus` ("0,1")."""
    cores = [int(c) for c in cpus.split(",")]
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            proc.cpu_affinity(cores)


def worktree_add(rev: str, work: Path) -> Path:
    """Check out commit `rev` beside this checkout (under `work`), to run its code too."""
    tree = work / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree),
                    rev], check=True, capture_output=True)  # fmt: skip
    return tree


def worktree_remove(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                   check=False, capture_output=True)  # fmt: skip


def wait_for(
    check: Callable[[], bool], popen: subprocess.Popen[bytes], what: str, log: Path
) -> None:
    started = time.monotonic()
    last = started
    while time.monotonic() - started < 600:
        if popen.poll() is not None:
            raise SystemExit(f"{what} exited:\n{log.read_text(errors='replace')[-3000:]}")
        if check():
            progress(f"{what} ready after {time.monotonic() - started:.0f}s")
            return
        if time.monotonic() - last > 10:
            last = time.monotonic()
            progress(f"waiting for {what} ({time.monotonic() - started:.0f}s)")
        time.sleep(0.3)
    raise SystemExit(f"{what} not ready after 600s")


def spawn(
    args: list[str], log: Path, env: dict[str, str], *, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def engine_core(worker_pid: int, log: Path) -> psutil.Process | None:
    """A worker's engine core, the child process vLLM runs its engine in (the worker's log
    names it, "(EngineCore pid=N)"), or None while it has none."""
    pids = re.findall(r"\(EngineCore pid=(\d+)\)", log.read_text(errors="replace"))
    children = {c.pid: c for c in psutil.Process(worker_pid).children(recursive=True)}
    live = [int(pid) for pid in pids if int(pid) in children]
    return children[live[-1]] if live else None


def stop(popens: list[subprocess.Popen[bytes]]) -> None:
    for popen in popens:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGTERM)
    for popen in popens:
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


@dataclass
class Target:
    name: str
    base_url: str
    model: str
    api_keys: dict[str, str]
    processes: dict[str, psutil.Process] = field(default_factory=dict)


@contextlib.contextmanager
def vllm_server(
    model_dir: Path,
    work: Path,
    *,
    max_num_seqs: int,
    cpus: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Target]:
    """Run vLLM's own OpenAI server (first come, first served) with the benchmark's settings.

    `cpus` (a taskset list) pins the server and its engine, as `roundhouse_stack` pins a worker.
    `extra_args` are more server flags, such as the tool parser's.
    The server keeps its default engine statistics (its Prometheus series), as Roundhouse's
    worker does: with `--disable-log-stats` its engine skipped per-step work Roundhouse's
    engine does, and the comparison was of two settings rather than of what is in front.
    """
    port = free_port()
    log = work / "vllm-server.log"
    env = {**os.environ, **ENGINE_ENV}
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    popen = spawn(
        _pinned(cpus, [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", DTYPE, "--enforce-eager",
            "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", str(max_num_seqs),
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--uvicorn-log-level", "warning",
            *extra_args,
        ]),
        log,
        env,
    )  # fmt: skip
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/health"), popen, "vLLM server", log)
        yield Target(
            name="vllm",
            base_url=f"http://127.0.0.1:{port}",
            model="tiny",
            api_keys={},
            processes={"vllm server": psutil.Process(popen.pid)},
        )
    finally:
        stop([popen])


@dataclass
class Platform:
    """Embedded servers and the data the Roundhouse runs share: started once per benchmark."""

    services: Any
    env: dict[str, str]
    tokens: dict[str, str]


def prepare_roundhouse(
    model_dir: Path,
    work: Path,
    *,
    tenants: dict[str, dict[str, Any]],
    max_num_seqs: int,
    max_queued: int = 256,
    tool_parser: str = "",
) -> Platform:
    """Start embedded servers, register the model and deploy it, and create the tenants.

    `tenants` maps a slug to quota fields over the unlimited defaults; `tool_parser` names the
    vLLM tool parser the model is registered with (none: it serves no tools).
    """
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

    from models_registry.services import deployment_create, model_version_register
    from tenants.models import Quota
    from tenants.services import api_key_issue, tenant_create

    call_command("migrate", verbosity=0)
    version, _ = model_version_register(
        model_name="tiny", source_dir=model_dir, tool_parser=tool_parser
    )
    deployment_create(
        name="tiny",
        version=version,
        max_num_seqs=max_num_seqs,
        max_queued=max_queued,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=KV_CACHE_BYTES,
        enforce_eager=True,
        dtype=DTYPE,
    )
    tokens = {}
    for slug, quota in tenants.items():
        tenant = tenant_create(slug=slug)
        Quota.objects.filter(tenant=tenant).update(**{**UNLIMITED_QUOTA, **quota})
        tokens[slug] = api_key_issue(tenant=tenant, name="bench").token
    return Platform(services=services, env=env, tokens=tokens)


def platform_stop(platform: Platform | None) -> None:
    if platform is not None:
        from embedded.servers import services_stop

        services_stop(platform.services)


def services_pid(config: Any, name: str) -> int | None:
    from embedded.servers import services_status

    entry = services_status(config).get(name)
    pid = entry.get("pid") if isinstance(entry, dict) else None
    return pid if isinstance(pid, int) else None


def _pinned(cpus: str | None, args: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *args] if cpus else args


def _frontend_command(port: int) -> list[str]:
    """A frontend: uvicorn serving the platform's ASGI app on a loopback port."""
    return [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
            "--port", str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip


@contextlib.contextmanager
def roundhouse_stack(
    platform: Platform,
    work: Path,
    *,
    engine_cpus: str | None = None,
    platform_cpus: str | None = None,
    frontends: int = 1,
) -> Iterator[Target]:
    """Run a frontend, a worker and the usage ingester against the platform's servers.

    `engine_cpus` and `platform_cpus` (taskset lists such as "0") keep the worker with its
    engine apart from the frontend and ingester, as separate machines would in production.
    `frontends` > 1 runs the frontend as that many uvicorn processes on one port, as a pod of
    the Helm chart runs them (`frontend.webConcurrency`), sharing their metrics' files.
    """
    work.mkdir(parents=True, exist_ok=True)
    env = dict(platform.env)
    workers: list[str] = []
    if frontends > 1:
        metrics = work / "prometheus"
        shutil.rmtree(metrics, ignore_errors=True)
        metrics.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
        workers = ["--workers", str(frontends)]
    if engine_cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = engine_cpus
    port = free_port()
    py = sys.executable
    worker_log, web_log, ingest_log = (work / f"{n}.log" for n in ("worker", "web", "ingester"))
    worker = spawn(
        _pinned(engine_cpus, [py, "manage.py", "run_worker", "--deployment", "tiny"]),
        worker_log,
        env,
    )
    web = spawn(_pinned(platform_cpus, [*_frontend_command(port), *workers]), web_log, env)
    ingester = spawn(_pinned(platform_cpus, [py, "manage.py", "run_ingester"]), ingest_log, env)
    popens = [web, worker, ingester]
    try:
        wait_for(lambda: b"ready: serving" in worker_log.read_bytes(), worker, "worker", worker_log)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), web, "frontend", web_log)
        processes = {
            "frontend": psutil.Process(web.pid),
            "worker+engine": psutil.Process(worker.pid),
            "ingester": psutil.Process(ingester.pid),
        }
        for name in ("postgres", "valkey"):
            pid = services_pid(platform.services, name)
            if pid:
                processes[name] = psutil.Process(pid)
        yield Target(
            name="roundhouse",
            base_url=f"http://127.0.0.1:{port}",
            model="tiny",
            api_keys=platform.tokens,
            processes=processes,
        )
    finally:
        stop(popens)


@contextlib.contextmanager
def frontend_beside(
    platform: Platform, work: Path, *, env: dict[str, str], name: str
) -> Iterator[tuple[str, psutil.Process]]:
    """One more frontend on the platform's servers, with `env` over the platform's own.

    Beside a running `roundhouse_stack` it serves through that stack's worker: two frontends
    set differently are compared on one engine. Yields its base URL and its process.
    """
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = work / f"{name}.log"
    web = spawn(_frontend_command(port), log, {**platform.env, **env})
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), web, name, log)
        yield f"http://127.0.0.1:{port}", psutil.Process(web.pid)
    finally:
        stop([web])


def cpu_seconds(processes: dict[str, psutil.Process], *, children: bool = True) -> dict[str, float]:
    """Return CPU seconds used so far by each named process and (unless not) its children."""
    totals: dict[str, float] = {}
    for name, proc in processes.items():
        total = 0.0
        for p in [proc, *(proc.children(recursive=True) if children else [])]:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        totals[name] = total
    return totals


def section_write(docs: Path, name: str, text: str) -> Path:
    """Put one benchmark's section into docs/benchmarks.md, replacing its previous run."""
    path = docs / "benchmarks.md"
    docs.mkdir(exist_ok=True)
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(current):
        updated = pattern.sub(lambda _: block, current)
    else:
        updated = current.rstrip() + "\n\n" + block + "\n"
    path.write_text(updated)
    return path


def section_write_first(docs: Path, name: str, text: str) -> Path:
    """Put a section right under the title of docs/benchmarks.md, replacing its previous run.

    A section already in the file stays where it is.
    """
    path = docs / "benchmarks.md"
    docs.mkdir(exist_ok=True)
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    title = re.search(r"^# .*$", current, re.M)
    if pattern.search(current):
        updated = pattern.sub(lambda _: block, current)
    elif title:
        below = current[title.end() :].lstrip("\n")
        updated = current[: title.end()] + "\n\n" + block + "\n" + ("\n" + below if below else "")
    else:
        updated = "# Benchmarks\n\n" + block + "\n\n" + current
    path.write_text(updated)
    return path


def plot_path(docs: Path, name: str) -> Path:
    """Return where a benchmark's plot goes, docs/img/<name>.png, creating the folder."""
    path = docs / "img" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def results_write(docs: Path, name: str, data: dict[str, Any]) -> Path:
    """Save one benchmark's raw results as docs/bench-data/<name>.json, for bench/summary.py.

    `benchmark` (the name) and `measured` (today's date) are added unless given. By convention
    `summary` holds the headline figures, `targets` what the issue asks of some of them by the
    same keys ("≤ 1.5", "≥ 0.9"), and `section` the benchmarks.md section they belong to.
    Floats are rounded to 3 decimals; NaN and infinities are written as null.
    """
    path = docs / "bench-data" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": name, "measured": time.strftime("%Y-%m-%d"), **data}
    path.write_text(_json_text(_json_ready(record)) + "\n", encoding="utf-8")
    return path


def _json_ready(value: Any, digits: int = 3) -> Any:
    """Floats to three decimals; a ratio to six, so that the summary, rounding it to two,
    reads what the section read from the unrounded figure (1.29503 kept as 1.295 read 1.29)."""
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {
            str(k): _json_ready(v, 6 if str(k).endswith("ratio") else 3) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_json_ready(v, digits) for v in value]
    return value


def _json_text(value: Any, depth: int = 0) -> str:
    """Indent objects and lists of objects; keep a list of samples on one line."""
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{json.dumps(k, ensure_ascii=False)}: {_json_text(v, depth + 1)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [f"{inner}{_json_text(v, depth + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
