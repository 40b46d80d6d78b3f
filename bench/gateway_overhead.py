"""What a gateway adds in front of the engine: Roundhouse against LiteLLM's proxy, same engine.

Three targets on the tiny demo model, the engine settings the same for all:

(a) vLLM's own OpenAI server alone: the engine with its HTTP layer, nothing in front;
(b) LiteLLM's proxy in front of (a), run as its users run it: a master key, a virtual key made
    with /key/generate, spend tracked in PostgreSQL (see bench/litellm_proxy.py);
(c) Roundhouse end to end: frontend, Redis queue, a worker hosting the same engine, the usage
    ingester.

All three are up at once, in one process tree, and measured in rounds. Each engine is pinned
to core 0; the gateways (LiteLLM with its database client, Roundhouse's frontend and
ingester), PostgreSQL, Valkey and the load generator to core 1.

Latency: chat completions of 16 tokens (ignore_eos), one at a time, to each target in turn
request by request, non-streaming and streaming. Added latency = a gateway's quantile minus
the engine's alone at the same quantile. Throughput: each target in turn, closed-loop
chat completions of one token at rising concurrency; the best requests/s over the levels,
divided by the CPU cores the gateway's processes used meanwhile.

    .venv/bin/python bench/gateway_overhead.py [--quick] [--rounds 3]

Builds LiteLLM's virtualenv under .data/bench-venvs/ on first use (a few minutes). Writes its
section of docs/benchmarks.md, docs/img/gateway_overhead.png and the raw results (every latency
sample) to docs/bench-data/gateway_overhead.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    Target,
    bench_headers,
    chat_body,
    client_session,
    cpu_seconds,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    services_pid,
    tree_pin,
    vllm_server,
)
from bench.litellm_proxy import (  # noqa: E402
    LITELLM_VERSION,
    LiteLLM,
    Spend,
    litellm_database_create,
    litellm_install,
    litellm_proxy,
    litellm_spend,
)

MAX_NUM_SEQS = 64
PROMPT = "Once upon a time, in a roundhouse far away,"
LATENCY_TOKENS = 16
# Latency requests go to the targets in a shuffled order, each followed by this pause (see
# _latency_round); seeded, so a run can be repeated.
ORDER = random.Random(20261125)
SETTLE_SECONDS = 0.03
ENGINE_CPUS = "0"
PLATFORM_CPUS = "1"
NAMES = {"vllm": "engine alone", "litellm": "LiteLLM", "roundhouse": "Roundhouse"}
# The processes that are the gateway proper, and the same with its datastores, per target.
FRONTEND: dict[str, tuple[str, ...]] = {"litellm": ("litellm",), "roundhouse": ("frontend",)}
PLATFORM: dict[str, tuple[str, ...]] = {
    "litellm": ("litellm", "postgres"),
    "roundhouse": ("frontend", "ingester", "valkey", "postgres"),
}
ENGINE = ("vllm server",)
# Everything each target's requests go through; the rest sits idle while it is measured.
USES: dict[str, tuple[str, ...]] = {
    "vllm": ENGINE,
    "litellm": ("litellm", "postgres", *ENGINE),
    "roundhouse": ("frontend", "worker+engine", "ingester", "valkey", "postgres"),
}
# What the issue asks of Roundhouse's added latency ÷ LiteLLM's.
TARGET = "≤ 0.5"

# Requests sent per target, warm-ups included: LiteLLM should log spend for every one.
SENT: Counter[str] = Counter()


@dataclass
class Latencies:
    """Seconds per request, pooled over rounds."""

    plain_total: list[float] = field(default_factory=list)
    stream_ttft: list[float] = field(default_factory=list)
    stream_total: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    short_answers: int = 0  # answers with fewer tokens than asked for


@dataclass
class Level:
    concurrency: int
    rps: float
    errors: int
    wall_s: float
    cpu_seconds: dict[str, float]

    def cores(self, names: tuple[str, ...]) -> float:
        return sum(self.cpu_seconds.get(n, 0.0) for n in names) / self.wall_s


@dataclass
class Result:
    latencies: Latencies = field(default_factory=Latencies)
    rounds: list[list[Level]] = field(default_factory=list)

    def levels(self) -> list[Level]:
        """Return, per concurrency, the round with the median requests/s."""
        picked = []
        for per_level in zip(*self.rounds, strict=True):
            ordered = sorted(per_level, key=lambda lvl: lvl.rps)
            picked.append(ordered[(len(ordered) - 1) // 2])
        return picked

    def saturation(self) -> Level:
        return max(self.levels(), key=lambda lvl: lvl.rps)


# ------------------------------------------------------------------------------------- load


async def _plain(
    session: aiohttp.ClientSession, target: Target, max_tokens: int
) -> tuple[float, int]:
    """Send one non-streaming chat completion; return (seconds, completion tokens)."""
    SENT[target.name] += 1
    started = time.perf_counter()
    async with session.post(
        f"{target.base_url}/v1/chat/completions",
        json=chat_body(target, PROMPT, max_tokens, stream=False),
        headers=bench_headers(target),
    ) as response:
        payload = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {payload[:300]!r}")
    elapsed = time.perf_counter() - started
    return elapsed, int(json.loads(payload)["usage"]["completion_tokens"])


async def _stream(
    session: aiohttp.ClientSession, target: Target, max_tokens: int
) -> tuple[float, float, int]:
    """Stream one chat completion; return (TTFT seconds, total seconds, completion tokens)."""
    SENT[target.name] += 1
    started = time.perf_counter()
    ttft = -1.0
    tokens = 0
    async with session.post(
        f"{target.base_url}/v1/chat/completions",
        json=chat_body(target, PROMPT, max_tokens, stream=True),
        headers=bench_headers(target),
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {(await response.read())[:300]!r}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            choices = chunk.get("choices") or []
            if ttft < 0 and choices and (choices[0].get("delta") or {}).get("content"):
                ttft = time.perf_counter() - started
    return ttft, time.perf_counter() - started, tokens


async def _one(
    session: aiohttp.ClientSession, target: Target, stream: bool, into: Latencies
) -> None:
    into.requests += 1
    try:
        if stream:
            ttft, total, tokens = await _stream(session, target, LATENCY_TOKENS)
            into.stream_ttft.append(ttft)
            into.stream_total.append(total)
        else:
            total, tokens = await _plain(session, target, LATENCY_TOKENS)
            into.plain_total.append(total)
    except Exception as exc:
        into.errors += 1
        progress(f"{target.name}: request failed: {exc}")
        return
    if tokens < LATENCY_TOKENS:
        into.short_answers += 1


async def _latency_round(targets: list[Target], requests: int, results: dict[str, Result]) -> None:
    """Send one request at a time, to each target in turn, non-streaming then streaming.

    Interleaving request by request gives every target the same share of the machine's slow
    and fast moments, which matters more than anything else on a shared machine. The order is
    shuffled every time and each request is followed by a pause: a gateway's work after its
    response (LiteLLM's spend logging, Roundhouse's usage ingestion) would otherwise land on
    the request measured next, and a fixed rotation always puts the same target next.
    """
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(client_session(2)) for _ in targets]
        for session, target in zip(sessions, targets, strict=True):
            for _ in range(5):  # warm connections and caches on each path
                await _plain(session, target, LATENCY_TOKENS)
                await _stream(session, target, LATENCY_TOKENS)
        pairs = list(zip(sessions, targets, strict=True))
        for stream in (False, True):
            for _ in range(requests):
                for session, target in ORDER.sample(pairs, len(pairs)):
                    await _one(session, target, stream, results[target.name].latencies)
                    await asyncio.sleep(SETTLE_SECONDS)


async def _saturate(
    target: Target, concurrency: int, seconds: float, watch: dict[str, psutil.Process]
) -> Level:
    """Keep `concurrency` one-token requests in flight for `seconds`; count, and sample CPU.

    `watch` holds every target's processes, so what the idle ones use shows too.
    """
    async with client_session(concurrency) as session:
        await asyncio.gather(*(_plain(session, target, 1) for _ in range(concurrency)))
        done = 0
        errors = 0

        async def client(deadline: float) -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                try:
                    await _plain(session, target, 1)
                    done += 1
                except Exception as exc:
                    errors += 1
                    if errors <= 3:
                        progress(f"{target.name}: request failed: {exc}")

        before = cpu_seconds(watch)
        started = time.perf_counter()
        await asyncio.gather(*(client(started + seconds) for _ in range(concurrency)))
        wall = time.perf_counter() - started
        after = cpu_seconds(watch)
    return Level(
        concurrency=concurrency,
        rps=done / wall,
        errors=errors,
        wall_s=wall,
        cpu_seconds={k: after[k] - before.get(k, 0.0) for k in after},
    )


def _throughput_round(
    target: Target, result: Result, args: argparse.Namespace, watch: dict[str, psutil.Process]
) -> None:
    levels = []
    for concurrency in args.levels:
        level = asyncio.run(_saturate(target, concurrency, args.seconds, watch))
        progress(
            f"{target.name}: c={concurrency} {level.rps:,.0f} req/s, {level.errors} errors; "
            + ", ".join(f"{k} {v / level.wall_s:.2f}" for k, v in level.cpu_seconds.items())
            + " cores"
        )
        levels.append(level)
    result.rounds.append(levels)


# ----------------------------------------------------------------------------------- targets


def _datastores(platform: Platform) -> dict[str, psutil.Process]:
    processes = {}
    for name in ("postgres", "valkey"):
        pid = services_pid(platform.services, name)
        if pid:
            processes[name] = psutil.Process(pid)
    return processes


def run(args: argparse.Namespace, work: Path) -> tuple[dict[str, Result], Spend]:
    """Start the three targets, measure them in rounds; return the results and LiteLLM's spend."""
    litellm: LiteLLM = litellm_install()
    from models_registry.demo_model import demo_model_build

    progress("building the tiny demo model")
    model_dir = demo_model_build(out_dir=work / "model")
    platform: Platform | None = None
    results = {name: Result() for name in NAMES}
    try:
        platform = prepare_roundhouse(
            model_dir, work, tenants={"bench": {}}, max_num_seqs=MAX_NUM_SEQS
        )
        datastores = _datastores(platform)
        for process in datastores.values():
            tree_pin(process, PLATFORM_CPUS)
        litellm_db = litellm_database_create(litellm, platform.env["DATABASE_URL"])
        # The load generator shares the platform core, as in the other benchmarks.
        os.sched_setaffinity(0, {int(PLATFORM_CPUS)})
        with contextlib.ExitStack() as stack:
            progress("starting vLLM's OpenAI server")
            engine = stack.enter_context(
                vllm_server(model_dir, work, max_num_seqs=MAX_NUM_SEQS, cpus=ENGINE_CPUS)
            )
            progress("starting LiteLLM's proxy in front of it")
            gateway = stack.enter_context(
                litellm_proxy(
                    litellm,
                    upstream=engine,
                    database_url=litellm_db,
                    work=work / "litellm",
                    cpus=PLATFORM_CPUS,
                    extra_processes={"postgres": datastores["postgres"]},
                )
            )
            progress("starting Roundhouse")
            roundhouse = stack.enter_context(
                roundhouse_stack(
                    platform, work / "sy", engine_cpus=ENGINE_CPUS, platform_cpus=PLATFORM_CPUS
                )
            )
            targets = [engine, gateway, roundhouse]
            watch = {k: v for t in targets for k, v in t.processes.items()}
            for round_ in range(args.rounds):
                progress(
                    f"round {round_ + 1}/{args.rounds}: latency, {args.latency_requests} "
                    "requests each way to each target, interleaved"
                )
                asyncio.run(_latency_round(targets, args.latency_requests, results))
                # Rotating the order spreads slow phases of the machine over all three.
                for target in targets[round_ % 3 :] + targets[: round_ % 3]:
                    _throughput_round(target, results[target.name], args, watch)
            progress("waiting for LiteLLM's batched spend writes to land")
            spend = litellm_spend(litellm_db)
    finally:
        platform_stop(platform)
    return results, spend


# ----------------------------------------------------------------------------------- report


QUANTITIES = (
    ("non-streaming, total", "plain_total"),
    ("streaming, time to first token", "stream_ttft"),
    ("streaming, total", "stream_total"),
)
GATEWAYS = ("litellm", "roundhouse")


def _ms(values: list[float], q: float) -> float:
    return 1000 * percentile(values, q)


def _added_ms(results: dict[str, Result], name: str, attr: str, q: float) -> float:
    """Return what `name` adds over the engine alone at quantile q of one latency measure."""
    mine = getattr(results[name].latencies, attr)
    return _ms(mine, q) - _ms(getattr(results["vllm"].latencies, attr), q)


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _shown(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}"


def _latency_ratios(results: dict[str, Result]) -> dict[str, float | None]:
    """Return Roundhouse's added latency ÷ LiteLLM's, by measure and quantile."""
    return {
        f"{attr}_p{round(q * 100)}_added_ratio": _ratio(
            _added_ms(results, "roundhouse", attr, q), _added_ms(results, "litellm", attr, q)
        )
        for _, attr in QUANTITIES
        for q in (0.5, 0.99)
    }


def _per_core(result: Result, name: str, processes: dict[str, tuple[str, ...]]) -> float:
    top = result.saturation()
    return top.rps / top.cores(processes[name])


def _latency_table(results: dict[str, Result]) -> str:
    rows = [
        f"| {LATENCY_TOKENS} tokens, one at a time (ms) | engine alone p50 / p99 "
        "| LiteLLM p50 / p99 | Roundhouse p50 / p99 | LiteLLM adds p50 / p99 "
        "| Roundhouse adds p50 / p99 | **Roundhouse ÷ LiteLLM added** p50 / p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios = _latency_ratios(results)
    for label, attr in QUANTITIES:
        cells = []
        for name in NAMES:
            values = getattr(results[name].latencies, attr)
            cells.append(f"{_ms(values, 0.5):.1f} / {_ms(values, 0.99):.1f}")
        for name in GATEWAYS:
            p50, p99 = (_added_ms(results, name, attr, q) for q in (0.5, 0.99))
            cells.append(f"{p50:+.1f} / {p99:+.1f}")
        shown = [_shown(ratios[f"{attr}_p{q}_added_ratio"]) for q in (50, 99)]
        cells.append(f"**{shown[0]}** / **{shown[1]}**")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _throughput_table(results: dict[str, Result]) -> str:
    rows = [
        "| target | best req/s | at concurrency | frontend cores used "
        "| **req/s per frontend core** | with its datastores: cores | req/s per core | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in NAMES.items():
        top = results[name].saturation()
        errors = sum(lvl.errors for rnd in results[name].rounds for lvl in rnd)
        if name not in FRONTEND:
            rows.append(
                f"| {label} | {top.rps:,.0f} | {top.concurrency} "
                f"| (engine: {top.cores(ENGINE):.2f}) | | | | {errors} |"
            )
            continue
        front, whole = top.cores(FRONTEND[name]), top.cores(PLATFORM[name])
        rows.append(
            f"| {label} | {top.rps:,.0f} | {top.concurrency} | {front:.2f} "
            f"| **{top.rps / front:,.0f}** | {whole:.2f} | {top.rps / whole:,.0f} | {errors} |"
        )
    ratio = _ratio(*(_per_core(results[n], n, FRONTEND) for n in ("roundhouse", "litellm")))
    rows.append(f"| **Roundhouse ÷ LiteLLM** | | | | **{_shown(ratio)}** | | | |")
    return "\n".join(rows)


def _idle_text(results: dict[str, Result]) -> str:
    parts = []
    for name, label in NAMES.items():
        top = results[name].saturation()
        idle = sum(v for k, v in top.cpu_seconds.items() if k not in USES[name]) / top.wall_s
        parts.append(f"{idle:.2f} while {label} was at its best level")
    return "The idle targets' processes used " + "; ".join(parts) + " (cores)."


def _levels_table(results: dict[str, Result]) -> str:
    rows = [
        "| concurrency | " + " | ".join(f"{label} req/s" for label in NAMES.values()) + " |",
        "| ---: " * (len(NAMES) + 1) + "|",
    ]
    per_target = [results[n].levels() for n in NAMES]
    for levels in zip(*per_target, strict=True):
        cells = " | ".join(f"{lvl.rps:,.0f}" for lvl in levels)
        rows.append(f"| {levels[0].concurrency} | {cells} |")
    return "\n".join(rows)


def _plot(results: dict[str, Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    qs = [i / 200 for i in range(201)]
    colours = {"vllm": "tab:grey", "litellm": "tab:orange", "roundhouse": "tab:blue"}
    for name in GATEWAYS:
        for attr, style, what in (("stream_ttft", "-", "TTFT"), ("plain_total", "--", "total")):
            added = [_added_ms(results, name, attr, q) for q in qs]
            left.plot(added, qs, style, color=colours[name], label=f"{NAMES[name]}, {what}")
    left.axvline(0, color="grey", linewidth=0.8)
    left.set(xlabel="added latency over the engine alone (ms)", ylabel="quantile")
    left.set_title(f"Added latency by quantile, {LATENCY_TOKENS}-token chats")
    left.legend(fontsize=8)
    markers = {"vllm": "o:", "litellm": "s-", "roundhouse": "^-"}
    conc: list[int] = []
    for name, label in NAMES.items():
        levels = results[name].levels()
        conc = [lvl.concurrency for lvl in levels]
        if name in FRONTEND:
            label += f" ({_per_core(results[name], name, FRONTEND):,.0f} req/s per core)"
        right.plot(conc, [lvl.rps for lvl in levels], markers[name], color=colours[name],
                   label=label)  # fmt: skip
    right.set(xscale="log", xlabel="concurrent requests", ylabel="requests/s (1-token chats)")
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_xticks(conc, [str(c) for c in conc])
    right.set_title("Closed-loop throughput")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _results(
    results: dict[str, Result], spend: Spend, args: argparse.Namespace
) -> dict[str, object]:
    """Return what docs/bench-data/gateway_overhead.json keeps: headline figures and samples."""
    ratios = _latency_ratios(results)
    per_core = {n: _per_core(results[n], n, FRONTEND) for n in GATEWAYS}
    core_ratio = _ratio(per_core["roundhouse"], per_core["litellm"])
    summary: dict[str, object] = {
        **ratios,
        **{f"{n}_rps_per_frontend_core": v for n, v in per_core.items()},
        "rps_per_frontend_core_ratio": core_ratio,
        "litellm_requests": SENT["litellm"],
        "litellm_spend_log_rows": spend.log_rows,
        "litellm_key_spend_dollars": spend.key_dollars,
        "litellm_database_transactions": spend.transactions,
    }
    headline = [
        {
            "measure": f"Gateway latency added over the engine, Roundhouse ÷ LiteLLM: {label} "
            f"p{q} ({LATENCY_TOKENS}-token chats)",
            "value": ratios[f"{attr}_p{q}_added_ratio"],
            "target": TARGET,
        }
        for label, attr in QUANTITIES[:2]
        for q in (50, 99)
    ]
    headline.append(
        {
            "measure": "Gateway requests/s per frontend core, Roundhouse ÷ LiteLLM "
            f"({per_core['roundhouse']:,.0f} vs {per_core['litellm']:,.0f})",
            "value": core_ratio,
        }
    )
    return {
        "section": "gateway_overhead",
        "settings": {
            "cpu_count": os.cpu_count(),
            "litellm_version": LITELLM_VERSION,
            "max_num_seqs": MAX_NUM_SEQS,
            "latency_tokens": LATENCY_TOKENS,
            "rounds": args.rounds,
            "latency_requests": args.latency_requests,
            "levels": args.levels,
            "seconds": args.seconds,
        },
        "headline": headline,
        "summary": summary,
        "targets": {k: TARGET for k in ratios},
        "latency_ms": {
            name: {attr: [1000 * v for v in getattr(r.latencies, attr)] for _, attr in QUANTITIES}
            for name, r in results.items()
        },
        "throughput": {
            name: [
                {
                    "concurrency": lvl.concurrency,
                    "rps": lvl.rps,
                    "errors": lvl.errors,
                    "cores": {k: v / lvl.wall_s for k, v in lvl.cpu_seconds.items()},
                }
                for lvl in r.levels()
            ]
            for name, r in results.items()
        },
    }


def _report(
    results: dict[str, Result], spend: Spend, args: argparse.Namespace, wall_s: float
) -> None:
    latency = _latency_table(results)
    throughput = _throughput_table(results)
    levels = _levels_table(results)
    idle = _idle_text(results)
    checks = ", ".join(
        f"{NAMES[n]}: {r.latencies.errors} errors, {r.latencies.short_answers} short answers"
        for n, r in results.items()
    )
    sent = SENT["litellm"]
    print(f"\n{latency}\n\n{throughput}\n\n{levels}\n\n{idle}\n")
    print(
        f"LiteLLM: {spend.log_rows} spend-log rows for {sent} requests, key spend "
        f"${spend.key_dollars:.6f}, {spend.transactions} database transactions"
    )
    print(f"Latency checks: {checks}. Run took {wall_s / 60:.1f} min.")
    args.docs.mkdir(exist_ok=True)
    _plot(results, plot_path(args.docs, "gateway_overhead"))
    results_write(args.docs, "gateway_overhead", _results(results, spend, args))
    samples = len(results["vllm"].latencies.plain_total)
    section_write(
        args.docs,
        "gateway_overhead",
        "## Gateway overhead: Roundhouse vs LiteLLM's proxy\n\n"
        f"`bench/gateway_overhead.py{' --quick' if args.quick else ''}`, "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, tiny Llama demo model, eager "
        f"mode, {MAX_NUM_SEQS} engine slots, {args.rounds} round{'s' if args.rounds > 1 else ''}, "
        f"{wall_s / 60:.0f} min in all. Three targets, up at once in one process tree: "
        "vLLM's own OpenAI server alone; LiteLLM's proxy "
        f"{LITELLM_VERSION} in front of that same server; Roundhouse end to end (frontend, "
        "Redis queue, a worker hosting an engine with the same settings, usage ingester). "
        "Each engine runs on core 0; LiteLLM, Roundhouse's frontend and ingester, "
        "PostgreSQL, Valkey and the load generator on core 1.\n\n"
        "LiteLLM runs as its users run it: a master key, a virtual key made with "
        "`/key/generate` (with a budget) and sent with every request, spend tracked in "
        "PostgreSQL (the server Roundhouse uses, a database of its own), one uvicorn worker, "
        f"`LITELLM_LOG=WARNING` (no access log, as Roundhouse's frontend). During the run it "
        f"wrote {spend.log_rows} spend-log rows for the {sent} requests sent to it and added "
        f"${spend.key_dollars:.4f} to the key's spend, in {spend.transactions} database "
        "transactions in all: it checks the key in its own memory after the first request and "
        "writes spend in batches. Its Prisma client talks to Prisma's query engine 5.17 built "
        "for WebAssembly (from npm), served behind the native engine's HTTP interface by "
        "`bench/litellm_prisma_engine.mjs`: the native engine is downloaded from Prisma's own "
        "server, and the benchmark installs from package registries only. LiteLLM's schema "
        "comes from its own migration files, with its start-up schema update off.\n\n"
        f"**Latency.** Chat completions of {LATENCY_TOKENS} tokens (ignore_eos), one at a "
        "time, to the three targets in turn request by request (so each sees the machine's "
        "slow and fast moments alike; the order shuffled every time and each request followed "
        f"by a {SETTLE_SECONDS * 1000:.0f} ms pause, so no gateway's work after its response "
        f"lands on another's request), {samples} non-streaming then {samples} streaming per "
        "target, pooled over the rounds. Added = the gateway's quantile minus the engine's "
        "alone at that quantile. LiteLLM's path ends in the very server measured alone; "
        "Roundhouse's ends in its worker's engine (same engine, same settings, another "
        "host process), so its figure also carries the difference between the two hosts, and "
        "a negative one means its path measured faster than vLLM's server alone. Target: "
        f"Roundhouse adds at most half of LiteLLM's latency (ratio {TARGET}).\n\n"
        + latency
        + "\n\n**Throughput.** Each target in turn (the order rotating over the rounds), "
        f"closed-loop one-token chat completions, {args.seconds:g} s per concurrency level; "
        "the best level (median of the rounds) "
        "divided by the CPU the gateway used meanwhile (CPU seconds ÷ wall seconds; "
        "LiteLLM's count includes its query engine process). The wider count adds each "
        "gateway's datastores: PostgreSQL for LiteLLM; the usage ingester, Valkey and "
        "PostgreSQL for Roundhouse.\n\n"
        + throughput
        + "\n\n"
        + levels
        + f"\n\n{idle}\n\n![added latency and throughput](img/gateway_overhead.png)\n",
    )
    progress(
        f"wrote {args.docs / 'benchmarks.md'} and {args.docs / 'img' / 'gateway_overhead.png'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round, for development")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the three targets")
    parser.add_argument(
        "--latency-requests", type=int, default=120, help="per target per round, each way"
    )
    parser.add_argument("--levels", default="2,8,32", help="comma-separated concurrency levels")
    parser.add_argument("--seconds", type=float, default=6.0, help="per concurrency level")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    parser.add_argument("--keep", action="store_true", help="keep the work dir and its logs")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.latency_requests, args.seconds = 1, 20, 3.0
        args.levels = "2,16"
    args.levels = [int(c) for c in args.levels.split(",")]
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    try:
        results, spend = run(args, work)
    finally:
        if args.keep:
            progress(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    _report(results, spend, args, time.monotonic() - started)


if __name__ == "__main__":
    main()
