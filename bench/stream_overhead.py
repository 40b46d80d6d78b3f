"""What Roundhouse costs on top of vLLM: the same streaming load against both, one after the other.

(a) vLLM's own OpenAI server on the tiny demo model, (b) Roundhouse end to end (frontend, Redis
queue, worker with the same engine settings, usage ingester) on the same model. Each runs
streaming completions of 64 output tokens (ignore_eos) at concurrency 1, 8 and 32, and we
report aggregate output tokens/s, time to first token (TTFT) p50/p99, inter-token latency (ITL:
the gap between consecutive chunks that carry text, as `vllm bench serve` counts it, so a chunk
of several tokens is one gap) p50/p99 and end-to-end p99, with the ratios Roundhouse / vLLM.
Roundhouse's TTFT is split by stage (frontend, queue, engine, relay) from its usage records and
the client's clock, for every request and for the slowest 1 %. CPU time per process is sampled
during each level, because on a small machine the platform's own processes compete with the
engine for the same cores.

The machine is kept honest: the report names the processor and its vector extensions (vLLM's
CPU kernels run about five times faster with AVX-512 and bf16 than on plain AVX2), each level
records the 1-minute load average before it ran, and a round whose vLLM figures moved more than
10 % from the earlier rounds' median is run again (twice at most).

    .venv/bin/python bench/stream_overhead.py [--requests-per-level 16] [--levels 1,8,32]
        [--stream-interval-ms 0] [--keep-servers]

`--keep-servers` starts both servers once for every round instead of once a round, which on a
GPU machine lent for minutes leaves time for three rounds.

Each level runs at least 256 requests, so that its p99 is not one request's luck.

Writes docs/benchmarks.md, docs/img/stream_overhead.png and the raw results (every TTFT, gap
and stage of every round) to docs/bench-data/stream_overhead.json, after every round, so a run
cut short keeps what it finished. On a machine with an NVIDIA GPU the section, plot and results
are `stream_overhead_gpu`, beside the CPU ones. `--from-log LOG` rebuilds a section from a
run's progress lines. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
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
    TTFT_STAGES,
    Platform,
    Sent,
    Target,
    TextTimes,
    accelerator,
    cpu_features,
    cpu_seconds,
    median_ratio_pair,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    ttft_stages,
    vllm_server,
    vllm_version,
)

OUTPUT_TOKENS = 64
PROMPT = "Once upon a time, in a roundhouse far away,"
MAX_NUM_SEQS = 64
# A round whose vLLM tokens/s at some level moved more than this from the earlier rounds'
# median is run again, at most RERUNS times: the machine changed under it.
DRIFT = 0.10
RERUNS = 2
# Requests per level at least. A p99 is only as good as the requests behind it: of 32 it is
# the slowest request, of 256 the third slowest, so one late wake-up no longer makes it.
MIN_REQUESTS = 256
TARGETS = {
    "throughput_ratio": "≥ 0.97",
    "ttft_p99_ratio": "≤ 1.25",
    "itl_p99_ratio": "≤ 1.25",
    "ttft_p50_delta_ms": "≤ 5",  # at one stream
}


@dataclass
class Stream:
    """One streamed completion as its client saw it."""

    request_id: str
    sent_at: float  # time.time()
    ttft_ms: float
    e2e_ms: float
    tokens: int
    gaps_ms: list[float]  # between consecutive chunks that carried text


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
    itl_p50_ms: float = float("nan")
    itl_p99_ms: float = float("nan")
    e2e_p99_ms: float = float("nan")
    load_1m: float = 0.0  # the machine's 1-minute load average as the level started
    # Roundhouse only: each TTFT stage in ms, for every request and for the slowest 1 %.
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    slowest_stages_ms: dict[str, list[float]] = field(default_factory=dict)


async def _one(session: aiohttp.ClientSession, target: Target) -> Stream:
    """Stream one completion; return what its client saw."""
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
    sent_at = time.time()
    times = TextTimes()
    tokens = 0
    async with session.post(
        f"{target.base_url}/v1/completions", json=body, headers=headers
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {await response.text()}")
        request_id = response.headers.get("x-request-id", "")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                times.text()
    return Stream(
        request_id=request_id,
        sent_at=sent_at,
        ttft_ms=times.ttft_ms,
        e2e_ms=(time.perf_counter() - times.started) * 1000,
        tokens=tokens,
        gaps_ms=times.gaps_ms,
    )


async def _level(target: Target, concurrency: int, requests: int) -> tuple[Level, list[Stream]]:
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm the path (caches, connections, the engine's first-use code) at this concurrency.
        await asyncio.gather(*(_one(session, target) for _ in range(concurrency)))
        await asyncio.gather(*(_one(session, target) for _ in range(concurrency)))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        results: list[Stream] = []
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
    ttfts = sorted(r.ttft_ms for r in results if r.ttft_ms >= 0)
    gaps = [gap for r in results for gap in r.gaps_ms]
    level = Level(
        concurrency=concurrency,
        tokens_per_s=sum(r.tokens for r in results) / wall,
        ttft_p50_ms=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99_ms=percentile(ttfts, 0.99),
        errors=errors,
        cpu_seconds={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
        wall_s=wall,
        ttfts_ms=ttfts,
        itl_p50_ms=percentile(gaps, 0.5),
        itl_p99_ms=percentile(gaps, 0.99),
        e2e_p99_ms=percentile([r.e2e_ms for r in results], 0.99),
    )
    return level, results


def _stages_into(level: Level, streams: list[Stream]) -> None:
    """Split the level's Roundhouse TTFTs by stage: every request, and the slowest 1 %."""
    timed = [s for s in streams if s.ttft_ms >= 0 and s.request_id]
    level.stages_ms = ttft_stages([Sent(s.request_id, s.sent_at, s.ttft_ms) for s in timed])
    slowest = sorted(timed, key=lambda s: s.ttft_ms)[-max(1, len(timed) // 100) :]
    level.slowest_stages_ms = ttft_stages(
        [Sent(s.request_id, s.sent_at, s.ttft_ms) for s in slowest]
    )


def _vllm_started(
    model_dir: Path, work: Path, args: argparse.Namespace
) -> contextlib.AbstractContextManager[Target]:
    """vLLM's server with as many API processes as Roundhouse has frontend processes."""
    extra = ("--api-server-count", str(args.api_processes)) if args.api_processes > 1 else ()
    return vllm_server(model_dir, work, max_num_seqs=MAX_NUM_SEQS, extra_args=extra)


def run_vllm_server(
    model_dir: Path,
    work: Path,
    levels: list[int],
    args: argparse.Namespace,
    running: Target | None = None,
) -> list[Level]:
    """Measure every level on vLLM's server: `running`, or one started for this round."""
    if running is not None:
        return [_measure(running, c, args)[0] for c in levels]
    with _vllm_started(model_dir, work, args) as target:
        return [_measure(target, c, args)[0] for c in levels]


def run_roundhouse(
    platform: Platform,
    work: Path,
    levels: list[int],
    args: argparse.Namespace,
    running: Target | None = None,
) -> list[Level]:
    """Measure every level on Roundhouse: `running`, or a stack started for this round."""
    with contextlib.ExitStack() as started:
        target = running or started.enter_context(
            roundhouse_stack(platform, work, frontends=args.api_processes)
        )
        measured = []
        for c in levels:
            level, streams = _measure(target, c, args)
            _stages_into(level, streams)
            measured.append(level)
        return measured


def _measure(
    target: Target, concurrency: int, args: argparse.Namespace
) -> tuple[Level, list[Stream]]:
    requests = max(args.requests_per_level * concurrency, args.min_requests)
    progress(f"{target.name}: concurrency {concurrency}, {requests} requests")
    load = os.getloadavg()[0]
    level, streams = asyncio.run(_level(target, concurrency, requests))
    level.load_1m = load
    progress(
        f"{target.name}: c={concurrency} {level.tokens_per_s:,.0f} tok/s, "
        f"TTFT p50 {level.ttft_p50_ms:.1f} ms p99 {level.ttft_p99_ms:.1f} ms, "
        f"ITL p50 {level.itl_p50_ms:.1f} ms p99 {level.itl_p99_ms:.1f} ms "
        f"(load {load:.1f}, {level.errors} errors)"
    )
    return level, streams


def _drifted(vllm: list[Level], earlier: list[list[Level]]) -> str:
    """Why a round's vLLM figures are off the earlier rounds' median, or "" when they are not."""
    if not earlier:
        return ""
    for i, level in enumerate(vllm):
        median = statistics.median(r[i].tokens_per_s for r in earlier)
        moved = level.tokens_per_s / median - 1
        if abs(moved) > DRIFT:
            return f"vLLM at {level.concurrency} streams moved {moved:+.0%} from {median:,.0f}"
    return ""


def _median_pairs(
    vllm_rounds: list[list[Level]], roundhouse_rounds: list[list[Level]]
) -> tuple[list[Level], list[Level]]:
    """Per level, the round whose throughput ratio is the median: both of its figures."""
    vllm, roundhouse = [], []
    for per_vllm, per_rh in zip(
        zip(*vllm_rounds, strict=True), zip(*roundhouse_rounds, strict=True), strict=True
    ):
        a, b = median_ratio_pair(list(zip(per_vllm, per_rh, strict=True)))
        vllm.append(a)
        roundhouse.append(b)
    return vllm, roundhouse


def _ratio(b: float, a: float) -> float:
    return b / a if a else float("nan")


def _rounds_table(vllm_rounds: list[list[Level]], roundhouse_rounds: list[list[Level]]) -> str:
    """Every round's ratios, in the order they ran: how far the shown round is from the others."""
    rows = [
        "| streams | throughput ratio | TTFT p99 ratio | ITL p99 ratio | TTFT p50 added (ms) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, level in enumerate(vllm_rounds[0]):
        pairs = [(v[i], r[i]) for v, r in zip(vllm_rounds, roundhouse_rounds, strict=True)]

        def each(figure: str, pairs: list[tuple[Level, Level]] = pairs) -> str:
            values = []
            for a, b in pairs:
                if figure == "added":
                    values.append(f"{b.ttft_p50_ms - a.ttft_p50_ms:+.1f}")
                else:
                    values.append(f"{_ratio(getattr(b, figure), getattr(a, figure)):.2f}")
            return " · ".join(values)

        rows.append(
            f"| {level.concurrency} | {each('tokens_per_s')} | {each('ttft_p99_ms')} "
            f"| {each('itl_p99_ms')} | {each('added')} |"
        )
    return "\n".join(rows)


def _whole(ms: float) -> str:
    return "—" if math.isnan(ms) else f"{ms:.0f}"


def _table(vllm: list[Level], roundhouse: list[Level]) -> str:
    rows = [
        "| streams | tok/s vLLM / Roundhouse | throughput ratio "
        "| TTFT p50 vLLM / Roundhouse (ms) | TTFT p99 vLLM / Roundhouse (ms) | TTFT p99 ratio "
        "| ITL p50 vLLM / Roundhouse (ms) | ITL p99 vLLM / Roundhouse (ms) | ITL p99 ratio "
        "| E2E p99 vLLM / Roundhouse (ms) | errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a, b in zip(vllm, roundhouse, strict=True):
        rows.append(
            f"| {a.concurrency} | {a.tokens_per_s:,.0f} / {b.tokens_per_s:,.0f} "
            f"| **{_ratio(b.tokens_per_s, a.tokens_per_s):.2f}** "
            f"| {a.ttft_p50_ms:.1f} / {b.ttft_p50_ms:.1f} "
            f"| {a.ttft_p99_ms:.1f} / {b.ttft_p99_ms:.1f} "
            f"| **{_ratio(b.ttft_p99_ms, a.ttft_p99_ms):.2f}** "
            f"| {a.itl_p50_ms:.1f} / {b.itl_p50_ms:.1f} "
            f"| {a.itl_p99_ms:.1f} / {b.itl_p99_ms:.1f} "
            f"| **{_ratio(b.itl_p99_ms, a.itl_p99_ms):.2f}** "
            f"| {_whole(a.e2e_p99_ms)} / {_whole(b.e2e_p99_ms)} "
            f"| {a.errors + b.errors if min(a.errors, b.errors) >= 0 else '—'} |"
        )
    return "\n".join(rows)


def _stages_table(roundhouse: list[Level]) -> str:
    """Roundhouse's TTFT by stage: the median of every request, the mean of the slowest 1 %."""
    rows = [
        "| stage | "
        + " | ".join(f"{lvl.concurrency} streams: p50 / slowest 1 % (ms)" for lvl in roundhouse)
        + " |",
        "| --- " + "| ---: " * len(roundhouse) + "|",
    ]
    for name, meaning in TTFT_STAGES.items():
        cells = []
        for lvl in roundhouse:
            every, slowest = lvl.stages_ms.get(name, []), lvl.slowest_stages_ms.get(name, [])
            mean = statistics.fmean(slowest) if slowest else float("nan")
            cells.append(f"{percentile(every, 0.5):.1f} / {mean:.1f}")
        rows.append(f"| {name} ({meaning}) | " + " | ".join(cells) + " |")
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
    reruns: list[str],
    args: argparse.Namespace,
) -> dict[str, object]:
    """Return what docs/bench-data/stream_overhead.json keeps: the table, then every round."""
    summary = [
        {
            "concurrency": a.concurrency,
            "vllm_tokens_per_s": a.tokens_per_s,
            "roundhouse_tokens_per_s": b.tokens_per_s,
            "throughput_ratio": _ratio(b.tokens_per_s, a.tokens_per_s),
            "vllm_ttft_p50_ms": a.ttft_p50_ms,
            "vllm_ttft_p99_ms": a.ttft_p99_ms,
            "roundhouse_ttft_p50_ms": b.ttft_p50_ms,
            "roundhouse_ttft_p99_ms": b.ttft_p99_ms,
            "ttft_p50_delta_ms": b.ttft_p50_ms - a.ttft_p50_ms,
            "ttft_p99_ratio": _ratio(b.ttft_p99_ms, a.ttft_p99_ms),
            "vllm_itl_p50_ms": a.itl_p50_ms,
            "vllm_itl_p99_ms": a.itl_p99_ms,
            "roundhouse_itl_p50_ms": b.itl_p50_ms,
            "roundhouse_itl_p99_ms": b.itl_p99_ms,
            "itl_p99_ratio": _ratio(b.itl_p99_ms, a.itl_p99_ms),
            "vllm_e2e_p99_ms": a.e2e_p99_ms,
            "roundhouse_e2e_p99_ms": b.e2e_p99_ms,
            # -1: not known (a level rebuilt from a log that did not say).
            "errors": a.errors + b.errors if min(a.errors, b.errors) >= 0 else None,
        }
        for a, b in zip(vllm, roundhouse, strict=True)
    ]
    return {
        "measured": args.measured,
        "section": args.section,
        "settings": {
            "cpu_count": args.cores,
            "cpu": args.cpu,
            "gpu": args.gpu,
            "vllm": args.vllm,
            "stream_interval_ms": args.stream_interval_ms,
            "from_log": args.from_log is not None,
            # Absent from a Namespace built without the parser (a rebuild's test builds one).
            "keep_servers": getattr(args, "keep_servers", False),
            "api_processes": getattr(args, "api_processes", 1),
            "min_requests": args.min_requests,
            "output_tokens": OUTPUT_TOKENS,
            "max_num_seqs": MAX_NUM_SEQS,
            "levels": [lvl.concurrency for lvl in vllm],
            "requests_per_level": args.requests_per_level,
            "rounds": args.rounds,
            "drift": DRIFT,
        },
        "targets": TARGETS,
        "summary": {"levels": summary},
        "reruns": reruns,
        "median": {
            "vllm": [asdict(lvl) for lvl in vllm],
            "roundhouse": [asdict(lvl) for lvl in roundhouse],
        },
        "rounds": {
            "vllm": [[asdict(lvl) for lvl in r] for r in vllm_rounds],
            "roundhouse": [[asdict(lvl) for lvl in r] for r in roundhouse_rounds],
        },
    }


def _plot(vllm: list[Level], roundhouse: list[Level], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [lvl.concurrency for lvl in vllm]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    left.plot(conc, [lvl.tokens_per_s for lvl in vllm], "o-", label="vLLM OpenAI server")
    left.plot(conc, [lvl.tokens_per_s for lvl in roundhouse], "s-", label="Roundhouse")
    left.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s")
    left.set_xticks(conc, [str(c) for c in conc])
    left.set_title("Aggregate throughput")
    left.legend()
    xs = list(range(len(conc)))
    width = 0.2
    for ax, title, p50, p99 in (
        (middle, "Time to first token", "ttft_p50_ms", "ttft_p99_ms"),
        (right, "Inter-token latency (gap between chunks)", "itl_p50_ms", "itl_p99_ms"),
    ):
        bars = (
            ("vLLM p50", vllm, p50, -1.5),
            ("Roundhouse p50", roundhouse, p50, -0.5),
            ("vLLM p99", vllm, p99, 0.5),
            ("Roundhouse p99", roundhouse, p99, 1.5),
        )
        for label, levels, attr, offset in bars:
            values = [getattr(lvl, attr) for lvl in levels]
            ax.bar([x + offset * width for x in xs], values, width, label=label)
        ax.set_xticks(xs, [str(c) for c in conc])
        ax.set(xlabel="concurrent streams", ylabel="ms")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"Streaming {OUTPUT_TOKENS} tokens, tiny Llama on {machine}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rounds(
    model_dir: Path, platform: Platform, work: Path, levels: list[int], args: argparse.Namespace
) -> None:
    """Every round, both targets one after the other; a round whose vLLM figures drifted from
    the earlier rounds' median runs again (`--reruns` times at most, then it is kept).

    The results are written after every round, so a run cut short (a borrowed GPU's time
    running out) leaves the rounds it finished in the docs.
    """
    vllm_rounds: list[list[Level]] = []
    roundhouse_rounds: list[list[Level]] = []
    reruns: list[str] = []
    with contextlib.ExitStack() as kept:
        vllm_running = roundhouse_running = None
        if args.keep_servers:
            # Both started once and kept for every round: on a borrowed GPU the starts
            # (a minute for vLLM's server, half one for the worker) cost more than a round.
            progress("starting vLLM's own OpenAI server and Roundhouse, kept for every round")
            vllm_running = kept.enter_context(_vllm_started(model_dir, work, args))
            roundhouse_running = kept.enter_context(
                roundhouse_stack(platform, work / "rh", frontends=args.api_processes)
            )
        for round_ in range(1, args.rounds + 1):
            for attempt in range(args.reruns + 1):
                # Alternating the targets spreads slow phases of the machine over both.
                progress(f"round {round_}/{args.rounds}: (a) vLLM's own OpenAI server")
                vllm = run_vllm_server(model_dir, work, levels, args, vllm_running)
                drift = _drifted(vllm, vllm_rounds)
                if drift and attempt < args.reruns:
                    reruns.append(f"round {round_}, try {attempt + 1}: {drift}")
                    progress(f"running round {round_} again: {drift}")
                    continue
                progress(f"round {round_}/{args.rounds}: (b) Roundhouse end to end")
                where = work / f"rh{round_}-{attempt}"
                roundhouse = run_roundhouse(platform, where, levels, args, roundhouse_running)
                vllm_rounds.append(vllm)
                roundhouse_rounds.append(roundhouse)
                break
            _publish(args, vllm_rounds, roundhouse_rounds, reruns)


# What the progress lines of a run say, for rebuilding its results from its log (--from-log).
_LOG_MACHINE = re.compile(r"processor: (?P<cpu>.*); GPU: (?P<gpu>.*); vLLM (?P<vllm>\S+)")
_LOG_CORES = re.compile(r"(?P<cores>\d+) CPU cores")
_LOG_ROUND = re.compile(r"round (?P<round>\d+)/(?P<of>\d+): \((?P<target>[ab])\)")
_LOG_LEVEL = re.compile(
    r"(?P<name>vllm|roundhouse): c=(?P<c>\d+) (?P<tok>[\d,.]+) tok/s, TTFT p50 (?P<t50>[\d.]+) ms "
    r"p99 (?P<t99>[\d.]+) ms, ITL p50 (?P<i50>[\d.]+) ms p99 (?P<i99>[\d.]+) ms "
    r"\(load (?P<load>[\d.]+)(?:, (?P<errors>\d+) errors)?\)"
)
_LOG_RERUN = re.compile(r"running round \d+ again: .*")
_LOG_REQUESTS = re.compile(r": concurrency \d+, (?P<n>\d+) requests")


def section_name(gpu: str, api_processes: int) -> str:
    """The section a run writes: a GPU's beside the CPU's, and one per count of API processes
    (a log does not say how many its run had: `--from-log` takes `--api-processes` as given)."""
    name = "stream_overhead_gpu" if gpu else "stream_overhead"
    return name + (f"_api{api_processes}" if api_processes > 1 else "")


def _from_log(args: argparse.Namespace) -> None:
    """Rebuild a run's section from its progress lines: the rounds it finished, with the
    figures the lines carry (throughput, TTFT and ITL percentiles; not the stage split or the
    CPU use, which only the finished run writes)."""
    text = args.from_log.read_text(errors="replace")
    machine = _LOG_MACHINE.search(text)
    if machine is None:
        raise SystemExit(f"{args.from_log}: no 'processor:' line; is it this benchmark's log?")
    args.gpu = "" if machine["gpu"] == "none" else machine["gpu"]
    args.section = section_name(args.gpu, getattr(args, "api_processes", 1))
    args.cpu, args.vllm = machine["cpu"], machine["vllm"]
    cores = _LOG_CORES.search(text)
    args.cores = int(cores["cores"]) if cores else None
    requests = [int(m["n"]) for m in _LOG_REQUESTS.finditer(text)]
    args.min_requests = min(requests) if requests else args.min_requests
    rounds: dict[tuple[int, str], list[Level]] = {}
    current: tuple[int, str] | None = None
    for line in text.splitlines():
        if found := _LOG_ROUND.search(line):
            args.rounds = int(found["of"])
            current = (int(found["round"]), found["target"])
            rounds[current] = []
        elif (found := _LOG_LEVEL.search(line)) and current is not None:
            rounds[current].append(
                Level(
                    concurrency=int(found["c"]),
                    tokens_per_s=float(found["tok"].replace(",", "")),
                    ttft_p50_ms=float(found["t50"]),
                    ttft_p99_ms=float(found["t99"]),
                    errors=int(found["errors"]) if found["errors"] else -1,  # -1: not logged
                    itl_p50_ms=float(found["i50"]),
                    itl_p99_ms=float(found["i99"]),
                    load_1m=float(found["load"]),
                )
            )
    levels = max((len(v) for v in rounds.values()), default=0)
    done = sorted(
        r for (r, t) in rounds if t == "a" and levels and len(rounds.get((r, "b"), [])) == levels
    )
    if not done:
        raise SystemExit(f"{args.from_log}: no round finished both targets")
    # A round run again after drifting leaves its last try in the dict: the one that was kept.
    reruns = [m.group(0) for m in _LOG_RERUN.finditer(text)]
    _publish(args, [rounds[(r, "a")] for r in done], [rounds[(r, "b")] for r in done], reruns)


def _publish(
    args: argparse.Namespace,
    vllm_rounds: list[list[Level]],
    roundhouse_rounds: list[list[Level]],
    reruns: list[str],
) -> None:
    """Write the rounds run so far into the docs: the section, the plot and the raw results."""
    vllm, roundhouse = _median_pairs(vllm_rounds, roundhouse_rounds)
    table = _table(vllm, roundhouse)
    spread = _rounds_table(vllm_rounds, roundhouse_rounds)
    measured = bool(roundhouse[0].cpu_seconds)
    stages = _stages_table(roundhouse) if measured else ""
    cpu_use = _cpu_table(roundhouse, vllm) if measured else ""
    loads = [lvl.load_1m for r in [*vllm_rounds, *roundhouse_rounds] for lvl in r]
    print(f"\n{table}\n\n{stages}\n\n{cpu_use}")
    args.docs.mkdir(exist_ok=True)
    machine = f"one {args.gpu}" if args.gpu else "this CPU"
    _plot(vllm, roundhouse, plot_path(args.docs, args.section), machine)
    rerun_text = (
        "; ".join(reruns) + "."
        if reruns
        else f"none: every round's vLLM figures stayed within {DRIFT:.0%} of the earlier rounds'."
    )
    cores = f"{args.cores} CPU cores" if args.cores else "CPU cores not recorded"
    finished = len(roundhouse_rounds)
    rounds_text = (
        f"{args.rounds} rounds"
        if finished == args.rounds
        else f"{finished} of {args.rounds} rounds (the run stopped before the rest)"
    )
    interval = (
        f"`ROUNDHOUSE_STREAM_INTERVAL_MS={args.stream_interval_ms:g}`"
        if args.stream_interval_ms is not None
        else "the worker's default stream interval (every engine step on a GPU; on CPU every "
        "step up to 8 streams, 20 ms past them)"
    )
    processes = getattr(args, "api_processes", 1)
    if processes > 1:
        interval += (
            f", {processes} HTTP processes on each side (Roundhouse's frontend as {processes} "
            f"uvicorn workers, vLLM's server with `--api-server-count {processes}`)"
        )
    extra = (
        "\n\nRebuilt from the run's progress lines (`--from-log`): the stage split and the "
        "CPU use are written only by a run that finishes, and are not here."
        if not measured
        else (
            "\n\nRoundhouse's time to first token by stage, from each request's usage record "
            "and the client's clock: the median over every request of the level, and the mean "
            "over its slowest 1 % (the requests that make the p99):\n\n"
            + stages
            + "\n\nCPU use per process during each level of the Roundhouse run "
            f"(CPU seconds / wall seconds; 100% = one core of the machine's {args.cores}):\n\n"
            + cpu_use
        )
    )
    section_write(
        args.docs,
        args.section,
        f"## Streaming overhead{' on a GPU' if args.gpu else ''}: Roundhouse vs vLLM's own "
        "OpenAI server\n\n"
        f"`bench/stream_overhead.py`, {args.measured}, "
        + (f"one {args.gpu}, " if args.gpu else "")
        + f"{cores} ({args.cpu}), vLLM {args.vllm} on both sides, "
        f"tiny Llama demo model, eager mode, {OUTPUT_TOKENS} output tokens per request "
        f"(ignore_eos), {args.requests_per_level} requests per stream per level "
        f"({args.min_requests} at least), {interval}, "
        f"{rounds_text}, each running vLLM then Roundhouse with the same engine settings "
        "from one process tree"
        + (
            " (both servers started once and kept up for every round, `--keep-servers`)"
            if getattr(args, "keep_servers", False)
            else ""
        )
        + "; per level, the round whose throughput ratio is the median is "
        "shown. ITL is the gap between consecutive chunks that carry text, as `vllm bench serve` "
        "counts it: vLLM's server sends a chunk per token; Roundhouse's worker sends each "
        "engine step's tokens while it runs at most `ROUNDHOUSE_STREAM_FLOW_STREAMS` streams "
        "and past that gathers a stream's tokens for `ROUNDHOUSE_STREAM_INTERVAL_MS` into one "
        "event (the first token and the end at once), so its gaps there are fewer and longer. "
        "The 1-minute load average "
        f"before each level ran from {min(loads):.1f} to {max(loads):.1f}. Rounds run again "
        f"because vLLM's own figures moved by more than {DRIFT:.0%}: {rerun_text}\n\n"
        + table
        + "\n\nEvery round's Roundhouse ÷ vLLM figures, in the order the rounds ran (the "
        "table above shows the median one by throughput):\n\n"
        + spread
        + extra
        + f"\n\n![throughput, TTFT and ITL](img/{args.section}.png)\n",
    )
    results_write(
        args.docs,
        args.section,
        _results(vllm, roundhouse, vllm_rounds, roundhouse_rounds, reruns, args),
    )
    progress(
        f"wrote {args.docs / 'benchmarks.md'}, {args.docs / 'img' / args.section}.png and "
        f"{args.docs / 'bench-data' / args.section}.json"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,8,32", help="comma-separated concurrency levels")
    parser.add_argument(
        "--requests-per-level", type=int, default=16, help="requests per stream at each level"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternate the two targets this many times"
    )
    parser.add_argument(
        "--min-requests",
        type=int,
        default=MIN_REQUESTS,
        help="requests per level at least (the p99 of fewer is one request's luck)",
    )
    parser.add_argument(
        "--reruns", type=int, default=RERUNS, help="times a drifted round may run again"
    )
    parser.add_argument(
        "--stream-interval-ms",
        type=float,
        default=None,
        help="the worker's ROUNDHOUSE_STREAM_INTERVAL_MS for this run (default: the setting's)",
    )
    parser.add_argument(
        "--keep-servers",
        action="store_true",
        help="start vLLM's server and Roundhouse once and keep both up for every round "
        "(each round still measures one, then the other); for a borrowed GPU's short time",
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="HTTP processes on each side: Roundhouse's frontend as this many uvicorn workers, "
        "vLLM's server with --api-server-count; above 1 the results are a section of their own",
    )
    parser.add_argument(
        "--from-log",
        type=Path,
        default=None,
        help="rebuild the section from the progress lines of a run that stopped early",
    )
    parser.add_argument(
        "--measured", default=time.strftime("%Y-%m-%d"), help="the run's date, for --from-log"
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    if args.from_log is not None:
        _from_log(args)
        return
    # On a GPU machine the results are a section of their own beside the CPU one.
    args.gpu = accelerator()
    args.section = section_name(args.gpu, args.api_processes)
    args.cpu, args.vllm, args.cores = cpu_features(), vllm_version(), os.cpu_count()
    levels = [int(c) for c in args.levels.split(",")]
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform: Platform | None = None
    progress(
        f"{args.cores} CPU cores, processor: {args.cpu}; GPU: {args.gpu or 'none'}; "
        f"vLLM {args.vllm}"
    )
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(
            model_dir, work, tenants={"bench": {}}, max_num_seqs=MAX_NUM_SEQS
        )
        if args.stream_interval_ms is not None:
            platform.env["ROUNDHOUSE_STREAM_INTERVAL_MS"] = f"{args.stream_interval_ms:g}"
        _rounds(model_dir, platform, work, levels, args)
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
