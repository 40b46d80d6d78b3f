"""Prefix caching and prefix-aware routing: TTFT with a shared system prompt on two replicas.

One deployment served by two workers (each engine pinned to a core of its own), run twice from
one process tree: (a) prefix caching on, which is also what turns on routing same-prefix
requests to one replica, and (b) both off. Clients stream chat completions that share a
400-token system prompt and end in a question of their own, after a warm-up round; we report
TTFT p50/p99, the ratios (a)/(b), the prefix-cache hit rate vLLM counted during the measured
requests and how they split over the two replicas.

The model is the demo model's tokenizer and architecture made wider and deeper (random
weights, about 20M parameters), so that a 400-token prefill costs a noticeable share of the
time to first token, as it does with real models; `--tiny` runs the demo model itself, whose
prefill is a millisecond or two, next to the platform's own path.

    .venv/bin/python bench/prefix_cache.py [--requests 64] [--concurrency 4] [--rounds 2] [--tiny]

Writes docs/benchmarks.md and docs/img/prefix_cache.png. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    free_port,
    http_ok,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    section_write,
    spawn,
    stop,
    wait_for,
)

SYSTEM_TOKENS = 400
OUTPUT_TOKENS = 16
MAX_NUM_SEQS = 16
MODES = {"a": "prefix caching + routing", "b": "off"}


@dataclass
class Replicas:
    base_url: str
    metrics_urls: list[str]


@dataclass
class Run:
    mode: str
    ttfts_ms: list[float]
    errors: int
    served: list[float]  # requests per replica
    hits: float
    queries: float

    @property
    def p50(self) -> float:
        return statistics.median(self.ttfts_ms) if self.ttfts_ms else float("nan")

    @property
    def p99(self) -> float:
        return percentile(self.ttfts_ms, 0.99)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class Totals:
    runs: dict[str, list[Run]] = field(default_factory=lambda: {m: [] for m in MODES})


def widened(demo_dir: Path, out_dir: Path) -> Path:
    """Copy the demo model with a wider, deeper random Llama of the same tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shutil.copytree(demo_dir, out_dir)
    for path in out_dir.iterdir():
        path.chmod(0o644)
    config = LlamaConfig.from_pretrained(out_dir)
    config.hidden_size, config.intermediate_size = 512, 2048
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 4, 8, 4
    torch.manual_seed(0)
    LlamaForCausalLM(config).float().save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def system_prompt(model_dir: Path, tokens: int) -> str:
    """A system prompt at least `tokens` long in the demo model's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    colours = ("red", "blue", "green", "yellow")
    sentences = ["You are the roundhouse's dispatcher."]
    while len(tokenizer.encode(" ".join(sentences)).ids) < tokens:
        i = len(sentences)
        sentences.append(f"Track {i} holds the {colours[i % 4]} freight cars.")
    return " ".join(sentences)


@contextlib.contextmanager
def replicas(platform: Platform, work: Path, *, prefix_caching: bool) -> Iterator[Replicas]:
    """Run a frontend, the usage ingester and two workers of the deployment, one per core."""
    from models_registry.models import Deployment

    Deployment.objects.filter(name="tiny").update(prefix_caching=prefix_caching)
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    port = free_port()
    popens = []
    logs: list[Path] = []
    metrics_urls = []
    for cpu in ("0", "1"):
        metrics = free_port()
        log = work / f"worker-{cpu}.log"
        env = {**platform.env, "VLLM_CPU_OMP_THREADS_BIND": cpu}
        args = ["taskset", "-c", cpu, py, "manage.py", "run_worker", "--deployment", "tiny",
                "--metrics-port", str(metrics)]  # fmt: skip
        popens.append(spawn(args, log, env))
        logs.append(log)
        metrics_urls.append(f"http://127.0.0.1:{metrics}/metrics")
    web_log = work / "web.log"
    web = spawn(
        [py, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log", "--log-level", "warning"],
        web_log,
        platform.env,
    )  # fmt: skip
    ingester = spawn([py, "manage.py", "run_ingester"], work / "ingester.log", platform.env)
    popens += [web, ingester]
    try:
        for popen, log in zip(popens[:2], logs, strict=True):
            wait_for(functools.partial(_ready, log), popen, "worker", log)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), web, "frontend", web_log)
        yield Replicas(base_url=f"http://127.0.0.1:{port}", metrics_urls=metrics_urls)
    finally:
        stop(popens)


def _ready(log: Path) -> bool:
    return b"ready: serving" in log.read_bytes()


def _scrape(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _counters(target: Replicas) -> tuple[list[float], float, float]:
    """Return (requests each replica served, prefix-cache hits, queries) so far."""
    served = [
        _scrape(url, "roundhouse_worker_requests_total", status="ok") for url in target.metrics_urls
    ]
    hits = sum(_scrape(url, "vllm:prefix_cache_hits_total") for url in target.metrics_urls)
    queries = sum(_scrape(url, "vllm:prefix_cache_queries_total") for url in target.metrics_urls)
    return served, hits, queries


async def _one(
    session: aiohttp.ClientSession, target: Replicas, key: str, system: str, i: int
) -> float:
    """Stream one chat completion; return its TTFT in seconds."""
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Request {i}: which track holds the red cars?"},
        ],
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
    }
    headers = {"Authorization": f"Bearer {key}"}
    started = time.perf_counter()
    async with session.post(
        f"{target.base_url}/v1/chat/completions", json=body, headers=headers
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {await response.text()}")
        ttft = -1.0
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if ttft < 0 and choices and choices[0]["delta"].get("content"):
                ttft = time.perf_counter() - started
    return ttft


async def _drive(
    target: Replicas, key: str, system: str, requests: int, concurrency: int, first: int
) -> tuple[list[float], int]:
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(first, first + requests):
            queue.put_nowait(i)
        ttfts: list[float] = []
        errors = 0

        async def client() -> None:
            nonlocal errors
            while not queue.empty():
                i = queue.get_nowait()
                try:
                    ttft = await _one(session, target, key, system, i)
                except Exception as exc:
                    errors += 1
                    progress(f"request failed: {exc}")
                    continue
                if ttft >= 0:
                    ttfts.append(ttft * 1000)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return ttfts, errors


def run_mode(
    platform: Platform, work: Path, mode: str, system: str, requests: int, concurrency: int
) -> Run:
    key = platform.tokens["bench"]
    with replicas(platform, work, prefix_caching=mode == "a") as target:
        progress(f"({mode}) {MODES[mode]}: warm-up, then {requests} requests")
        asyncio.run(_drive(target, key, system, 2 * concurrency, concurrency, first=10_000))
        served_before, hits_before, queries_before = _counters(target)
        ttfts, errors = asyncio.run(_drive(target, key, system, requests, concurrency, first=0))
        # The workers count a request as it ends; the last ones may still be flushing.
        time.sleep(1.0)
        served, hits, queries = _counters(target)
    run = Run(
        mode=mode,
        ttfts_ms=ttfts,
        errors=errors,
        served=[a - b for a, b in zip(served, served_before, strict=True)],
        hits=hits - hits_before,
        queries=queries - queries_before,
    )
    progress(
        f"({mode}) TTFT p50 {run.p50:.1f} ms p99 {run.p99:.1f} ms, hit rate "
        f"{run.hit_rate:.0%}, per replica {[int(s) for s in run.served]}"
    )
    return run


def _merged(runs: list[Run]) -> Run:
    """All rounds of one mode as one run."""
    return Run(
        mode=runs[0].mode,
        ttfts_ms=[t for r in runs for t in r.ttfts_ms],
        errors=sum(r.errors for r in runs),
        served=[sum(s) for s in zip(*(r.served for r in runs), strict=True)],
        hits=sum(r.hits for r in runs),
        queries=sum(r.queries for r in runs),
    )


def _table(a: Run, b: Run) -> str:
    rows = [
        "| mode | TTFT p50 (ms) | TTFT p99 (ms) | prefix-cache hit rate "
        "| requests per replica | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in (a, b):
        split = " / ".join(str(int(s)) for s in run.served)
        rows.append(
            f"| ({run.mode}) {MODES[run.mode]} | {run.p50:.1f} | {run.p99:.1f} "
            f"| {run.hit_rate:.0%} | {split} | {run.errors} |"
        )
    rows.append(f"| **(a) / (b)** | **{a.p50 / b.p50:.2f}** | **{a.p99 / b.p99:.2f}** | | | |")
    return "\n".join(rows)


def _plot(a: Run, b: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.35
    xs = [0, 1]
    ax.bar([x - width / 2 for x in xs], [a.p50, a.p99], width, label=f"(a) {MODES['a']}")
    ax.bar([x + width / 2 for x in xs], [b.p50, b.p99], width, label=f"(b) {MODES['b']}")
    ax.set_xticks(xs, ["TTFT p50", "TTFT p99"])
    ax.set_ylabel("ms")
    ax.set_title(f"Shared {SYSTEM_TOKENS}-token system prompt, two replicas")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64, help="measured requests per mode")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent streams")
    parser.add_argument("--rounds", type=int, default=2, help="alternate the modes this often")
    parser.add_argument("--tiny", action="store_true", help="the demo model as it is")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform: Platform | None = None
    totals = Totals()
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the model")
        model_dir = demo_model_build(out_dir=work / "demo")
        if not args.tiny:
            model_dir = widened(model_dir, work / "model")
        system = system_prompt(model_dir, SYSTEM_TOKENS)
        platform = prepare_roundhouse(
            model_dir, work, tenants={"bench": {}}, max_num_seqs=MAX_NUM_SEQS
        )
        for round_ in range(1, args.rounds + 1):
            for mode in MODES:
                progress(f"round {round_}/{args.rounds}: ({mode}) {MODES[mode]}")
                totals.runs[mode].append(
                    run_mode(
                        platform,
                        work / f"{mode}{round_}",
                        mode,
                        system,
                        args.requests,
                        args.concurrency,
                    )
                )
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)
    a, b = _merged(totals.runs["a"]), _merged(totals.runs["b"])
    model = (
        "tiny Llama demo model"
        if args.tiny
        else "the demo model widened (hidden 512, 4 layers, random weights)"
    )
    table = _table(a, b)
    print("\n" + table)
    args.docs.mkdir(parents=True, exist_ok=True)
    _plot(a, b, plot_path(args.docs, "prefix_cache"))
    section_write(
        args.docs,
        "prefix_cache",
        "## Prefix caching and prefix-aware routing\n\n"
        f"`bench/prefix_cache.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"{model}, eager mode, one deployment served by two workers (each engine "
        "pinned to a core of its own; frontend and ingester unpinned). Streaming chat "
        f"completions sharing a {SYSTEM_TOKENS}-token system prompt, each with a question of "
        f"its own, {OUTPUT_TOKENS} output tokens, {args.concurrency} concurrent streams, "
        f"{args.requests} measured requests per mode and round after a warm-up, "
        f"{args.rounds} round(s). (a) the deployment's `prefix_caching` on: vLLM reuses cached "
        "prefix blocks and dispatch sends same-prefix requests to one replica (within a load "
        "bound); (b) both off. Hit rate: vLLM's `prefix_cache_hits` / `prefix_cache_queries` "
        "(tokens) during the measured requests. Requests per replica add up the rounds; the "
        "workers start anew each round, so the replica that owns the shared prefix (and takes "
        "about three quarters of the requests, as far as the load bound lets it at 4 streams) "
        "differs from round to round.\n\n" + table + "\n\n"
        "![prefix cache TTFT](img/prefix_cache.png)\n",
    )
    progress(f"wrote {args.docs / 'benchmarks.md'} and {args.docs / 'img' / 'prefix_cache.png'}")


if __name__ == "__main__":
    main()
