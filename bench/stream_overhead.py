"""What Roundhouse costs on top of vLLM: the same streaming load against both, one after the other.

(a) vLLM's own OpenAI server on the tiny demo model, (b) Roundhouse end to end (frontend, Redis
queue, worker with the same engine settings, usage ingester) on the same model. Each runs
streaming completions of 64 output tokens (ignore_eos) at concurrency 1, 8 and 32, and we
report aggregate output tokens/s, TTFT p50/p99 and the ratios Roundhouse / vLLM. CPU time per
process is sampled during each level, because on a small machine the platform's own processes
compete with the engine for the same cores.

    .venv/bin/python bench/stream_overhead.py [--requests-per-level 8] [--levels 1,8,32]

Writes docs/benchmarks.md, docs/img/stream_overhead.png and the raw results (every TTFT of every
round) to docs/bench-data/stream_overhead.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    Target,
    cpu_seconds,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    vllm_server,
)

OUTPUT_TOKENS = 64
PROMPT = "Once upon a time, in a roundhouse far away,"
MAX_NUM_SEQS = 64


@dataclass
class Level:
    concurrency: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    errors: int
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    ttfts_ms: list[float] = field(default_factory=list)


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
    headers = {"Authorization": f"Bearer {target.api_keys.get('bench', 'none')}"}
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
                    progress(f"request failed: {exc}")

        cpu_before = cpu_seconds(target.processes)
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu_after = cpu_seconds(target.processes)
    ttfts = sorted(r[0] * 1000 for r in results if r[0] >= 0)
    tokens = sum(r[1] for r in results)
    return Level(
        concurrency=concurrency,
        tokens_per_s=tokens / wall,
        ttft_p50_ms=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99_ms=percentile(ttfts, 0.99),
        errors=errors,
        cpu_seconds={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
        wall_s=wall,
        ttfts_ms=ttfts,
    )


def run_vllm_server(model_dir: Path, work: Path, levels: list[int], per_level: int) -> list[Level]:
    with vllm_server(model_dir, work, max_num_seqs=MAX_NUM_SEQS) as target:
        return [_measure(target, c, per_level) for c in levels]


def run_roundhouse(
    platform: Platform, work: Path, levels: list[int], per_level: int
) -> list[Level]:
    with roundhouse_stack(platform, work) as target:
        return [_measure(target, c, per_level) for c in levels]


def _measure(target: Target, concurrency: int, per_level: int) -> Level:
    requests = max(per_level * concurrency, 32)
    progress(f"{target.name}: concurrency {concurrency}, {requests} requests")
    level = asyncio.run(_level(target, concurrency, requests))
    progress(
        f"{target.name}: c={concurrency} {level.tokens_per_s:,.0f} tok/s, "
        f"TTFT p50 {level.ttft_p50_ms:.1f} ms p99 {level.ttft_p99_ms:.1f} ms"
    )
    return level


def _median_levels(rounds: list[list[Level]]) -> list[Level]:
    """Return, per concurrency level, the round with the median throughput."""
    picked = []
    for per_level in zip(*rounds, strict=True):
        ordered = sorted(per_level, key=lambda lvl: lvl.tokens_per_s)
        picked.append(ordered[(len(ordered) - 1) // 2])
    return picked


def _table(vllm: list[Level], roundhouse: list[Level]) -> str:
    rows = [
        "| concurrency | vLLM tok/s | Roundhouse tok/s | throughput ratio "
        "| vLLM TTFT p50 / p99 (ms) | Roundhouse TTFT p50 / p99 (ms) | TTFT p50 delta (ms) "
        "| errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a, b in zip(vllm, roundhouse, strict=True):
        rows.append(
            f"| {a.concurrency} | {a.tokens_per_s:,.0f} | {b.tokens_per_s:,.0f} "
            f"| **{b.tokens_per_s / a.tokens_per_s:.2f}** "
            f"| {a.ttft_p50_ms:.1f} / {a.ttft_p99_ms:.1f} "
            f"| {b.ttft_p50_ms:.1f} / {b.ttft_p99_ms:.1f} "
            f"| **{b.ttft_p50_ms - a.ttft_p50_ms:+.1f}** | {a.errors + b.errors} |"
        )
    return "\n".join(rows)


def _cpu_table(roundhouse: list[Level], vllm: list[Level]) -> str:
    names = list(roundhouse[0].cpu_seconds)
    header = "| concurrency | vLLM server | " + " | ".join(names) + " |"
    rows = [header, "| ---: " * (len(names) + 2) + "|"]
    for s, v in zip(roundhouse, vllm, strict=True):
        share = [f"{100 * s.cpu_seconds[n] / s.wall_s:.0f}%" for n in names]
        vllm_share = f"{100 * sum(v.cpu_seconds.values()) / v.wall_s:.0f}%"
        rows.append(f"| {s.concurrency} | {vllm_share} | " + " | ".join(share) + " |")
    return "\n".join(rows)


def _results(
    vllm: list[Level],
    roundhouse: list[Level],
    vllm_rounds: list[list[Level]],
    roundhouse_rounds: list[list[Level]],
    args: argparse.Namespace,
) -> dict[str, object]:
    """Return what docs/bench-data/stream_overhead.json keeps: the table, then every round."""
    summary = [
        {
            "concurrency": a.concurrency,
            "vllm_tokens_per_s": a.tokens_per_s,
            "roundhouse_tokens_per_s": b.tokens_per_s,
            "throughput_ratio": b.tokens_per_s / a.tokens_per_s,
            "vllm_ttft_p50_ms": a.ttft_p50_ms,
            "vllm_ttft_p99_ms": a.ttft_p99_ms,
            "roundhouse_ttft_p50_ms": b.ttft_p50_ms,
            "roundhouse_ttft_p99_ms": b.ttft_p99_ms,
            "ttft_p50_delta_ms": b.ttft_p50_ms - a.ttft_p50_ms,
            "errors": a.errors + b.errors,
        }
        for a, b in zip(vllm, roundhouse, strict=True)
    ]
    return {
        "section": "stream_overhead",
        "settings": {
            "cpu_count": os.cpu_count(),
            "output_tokens": OUTPUT_TOKENS,
            "max_num_seqs": MAX_NUM_SEQS,
            "levels": [lvl.concurrency for lvl in vllm],
            "requests_per_level": args.requests_per_level,
            "rounds": args.rounds,
        },
        "summary": {"levels": summary},
        "median": {
            "vllm": [asdict(lvl) for lvl in vllm],
            "roundhouse": [asdict(lvl) for lvl in roundhouse],
        },
        "rounds": {
            "vllm": [[asdict(lvl) for lvl in r] for r in vllm_rounds],
            "roundhouse": [[asdict(lvl) for lvl in r] for r in roundhouse_rounds],
        },
    }


def _plot(vllm: list[Level], roundhouse: list[Level], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [lvl.concurrency for lvl in vllm]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(conc, [lvl.tokens_per_s for lvl in vllm], "o-", label="vLLM OpenAI server")
    left.plot(conc, [lvl.tokens_per_s for lvl in roundhouse], "s-", label="Roundhouse")
    left.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s")
    left.set_xticks(conc, [str(c) for c in conc])
    left.set_title("Aggregate throughput")
    left.legend()
    width = 0.35
    xs = range(len(conc))
    right.bar([x - width / 2 for x in xs], [lvl.ttft_p50_ms for lvl in vllm], width, label="vLLM")
    right.bar(
        [x + width / 2 for x in xs],
        [lvl.ttft_p50_ms for lvl in roundhouse],
        width,
        label="Roundhouse",
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
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform: Platform | None = None
    vllm_rounds: list[list[Level]] = []
    roundhouse_rounds: list[list[Level]] = []
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(
            model_dir, work, tenants={"bench": {}}, max_num_seqs=MAX_NUM_SEQS
        )
        for round_ in range(1, args.rounds + 1):
            # Alternating the targets spreads slow phases of the machine over both.
            progress(f"round {round_}/{args.rounds}: (a) vLLM's own OpenAI server")
            vllm_rounds.append(run_vllm_server(model_dir, work, levels, args.requests_per_level))
            progress(f"round {round_}/{args.rounds}: (b) Roundhouse end to end")
            roundhouse_rounds.append(
                run_roundhouse(platform, work / f"sy{round_}", levels, args.requests_per_level)
            )
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)
    vllm = _median_levels(vllm_rounds)
    roundhouse = _median_levels(roundhouse_rounds)
    table = _table(vllm, roundhouse)
    cpu = _cpu_table(roundhouse, vllm)
    print("\n" + table + "\n\nCPU use during each level (100% = one core):\n" + cpu)
    args.docs.mkdir(exist_ok=True)
    _plot(vllm, roundhouse, plot_path(args.docs, "stream_overhead"))
    section_write(
        args.docs,
        "stream_overhead",
        "## Streaming overhead: Roundhouse vs vLLM's own OpenAI server\n\n"
        f"`bench/stream_overhead.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"tiny Llama demo model, eager mode, {OUTPUT_TOKENS} output tokens per request "
        f"(ignore_eos), {args.requests_per_level} requests per stream per level (32 at least), "
        f"{args.rounds} alternating rounds, the median round per level shown. Both targets run "
        "the same engine settings, one after the other, from one process tree.\n\n"
        + table
        + "\n\nCPU use per process during each level of the Roundhouse run "
        "(CPU seconds / wall seconds; 100% = one core of the machine's "
        f"{os.cpu_count()}):\n\n" + cpu + "\n\n![throughput and TTFT](img/stream_overhead.png)\n",
    )
    results_write(
        args.docs,
        "stream_overhead",
        _results(vllm, roundhouse, vllm_rounds, roundhouse_rounds, args),
    )
    progress(
        f"wrote {args.docs / 'benchmarks.md'}, {args.docs / 'img' / 'stream_overhead.png'} and "
        f"{args.docs / 'bench-data' / 'stream_overhead.json'}"
    )


if __name__ == "__main__":
    main()
