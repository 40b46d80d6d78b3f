"""Bursts: streams that start together, and how long the last of them waits for its first token.

A load whose clients start together (a load test's first round, an agent fanning a task out,
streams that ended together starting again) reaches a server as a burst. On a GPU host the
streaming benchmark's TTFT p99 at 32 streams is each level's first burst: a frontend admits
it one request after another. This measures that alone: bursts of N streams of a few tokens
each, started at once, the next burst after the last one ended. A burst's wait is the time to
first token of its slowest stream.

Targets, side by side from one process tree with the same engine settings: vLLM's own OpenAI
server; Roundhouse (frontend, worker, usage ingester); and beside it a second frontend on the
same worker with `ROUNDHOUSE_REDIS_COALESCE=0`, each request's quota and queue calls sent on
their own: the two frontends are compared on one engine. Each round runs every target at each
level, in an order that turns from round to round; a level's figures are its median round by
the burst-wait ratio Roundhouse ÷ vLLM. CPU per request is each server process's own CPU
time over the requests it served (vLLM's API server, Roundhouse's frontend; its worker
without the engine core beside).

    .venv/bin/python bench/bursts.py [--levels 8,32] [--bursts 30] [--tokens 16] [--rounds 3]

Writes the `bursts` section of docs/benchmarks.md (on a machine with an NVIDIA GPU,
`bursts_gpu`), its raw results in docs/bench-data/ and its plot. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    Target,
    accelerator,
    cpu_features,
    cpu_seconds,
    frontend_beside,
    machine_line,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    vllm_server,
    vllm_version,
)
from bench.structured import chat_stream  # noqa: E402

MAX_NUM_SEQS = 64
WARM_BURSTS = 2
PAUSE_S = 0.2  # between bursts: the last one's usage and settling land first
MESSAGES = [{"role": "user", "content": "Tell me a story about a dragon who learns to fly."}]
TARGETS = ("vllm", "roundhouse", "roundhouse_alone")
LABELS = {
    "vllm": "vLLM's server",
    "roundhouse": "Roundhouse",
    "roundhouse_alone": "Roundhouse, each call on its own",
}


@dataclass
class Level:
    """One target's bursts at one level, in one round."""

    target: str
    streams: int
    waits_ms: list[float] = field(default_factory=list)  # each burst's slowest TTFT
    ttfts_ms: list[float] = field(default_factory=list)
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    errors: int = 0

    @property
    def wait_p50(self) -> float:
        return statistics.median(self.waits_ms) if self.waits_ms else float("nan")

    @property
    def wait_p90(self) -> float:
        return percentile(self.waits_ms, 0.9)


def _body(tokens: int) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _ttft_ms(session: aiohttp.ClientSession, server: Target, tokens: int) -> float:
    """One streamed chat's time to first token, in ms."""
    ttft, _, _ = await chat_stream(session, server, _body(tokens))
    if ttft < 0:
        raise RuntimeError("the stream ended without content")
    return ttft * 1000


async def _bursts(server: Target, streams: int, bursts: int, tokens: int) -> Level:
    level = Level(server.name, streams)
    connector = aiohttp.TCPConnector(limit=streams * 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def burst() -> list[float | BaseException]:
            return await asyncio.gather(
                *(_ttft_ms(session, server, tokens) for _ in range(streams)),
                return_exceptions=True,
            )

        for _ in range(WARM_BURSTS):  # connections open, the path warm
            await burst()
            await asyncio.sleep(PAUSE_S)
        before = cpu_seconds(server.processes, children=False)
        served = 0
        for _ in range(bursts):
            found = await burst()
            times = [t for t in found if isinstance(t, float)]
            level.errors += len(found) - len(times)
            served += len(times)
            level.ttfts_ms += times
            if times:
                level.waits_ms.append(max(times))
            await asyncio.sleep(PAUSE_S)
        after = cpu_seconds(server.processes, children=False)
    level.cpu_ms_per_request = {
        name: (after[name] - before[name]) * 1000 / max(served, 1) for name in before
    }
    return level


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def median_round(rounds: list[dict[str, Level]]) -> dict[str, Level]:
    """The round whose burst wait ratio Roundhouse ÷ vLLM is the median (a round's targets
    ran back to back: one state of the machine)."""
    ordered = sorted(rounds, key=lambda r: _ratio(r["roundhouse"].wait_p50, r["vllm"].wait_p50))
    return ordered[(len(ordered) - 1) // 2]


def _cpu_cell(level: Level) -> str:
    return " + ".join(f"{ms:.2f} ({name})" for name, ms in level.cpu_ms_per_request.items())


def tables(by_level: dict[int, list[dict[str, Level]]]) -> str:
    """The section's tables: each level's median round, and every round's ratios."""
    rows = [
        "| streams | target | burst wait p50 / p90 (ms) | TTFT p50 / p99 (ms) | "
        "CPU per request (ms) | errors |",
        "| ---: | --- | ---: | ---: | --- | ---: |",
    ]
    ratios = [
        "| streams | burst wait, Roundhouse ÷ vLLM | burst wait, each call on its own ÷ "
        "coalesced | frontend CPU per request, coalesced ÷ each call on its own |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for streams, rounds in sorted(by_level.items()):
        shown = median_round(rounds)
        for name in TARGETS:
            lvl = shown[name]
            rows.append(
                f"| {streams} | {LABELS[name]} | {lvl.wait_p50:.1f} / {lvl.wait_p90:.1f} | "
                f"{percentile(lvl.ttfts_ms, 0.5):.1f} / {percentile(lvl.ttfts_ms, 0.99):.1f} | "
                f"{_cpu_cell(lvl)} | {lvl.errors} |"
            )
        ratios.append(
            f"| {streams} | "
            + " · ".join(
                f"{_ratio(r['roundhouse'].wait_p50, r['vllm'].wait_p50):.2f}" for r in rounds
            )
            + " | "
            + " · ".join(
                f"{_ratio(r['roundhouse_alone'].wait_p50, r['roundhouse'].wait_p50):.2f}"
                for r in rounds
            )
            + " | "
            + " · ".join(
                f"{_ratio(_frontend(r['roundhouse']), _frontend(r['roundhouse_alone'])):.2f}"
                for r in rounds
            )
            + " |"
        )
    return (
        "\n".join(rows)
        + "\n\nEvery round's ratios, in the order the rounds ran:\n\n"
        + "\n".join(ratios)
    )


def _frontend(level: Level) -> float:
    return level.cpu_ms_per_request.get("frontend", float("nan"))


def headline(by_level: dict[int, list[dict[str, Level]]], where: str) -> list[dict[str, Any]]:
    found = []
    for streams, rounds in sorted(by_level.items()):
        shown = median_round(rounds)
        found.append(
            {
                "measure": f"Burst of {streams} streams{where}: the last first token, "
                "Roundhouse ÷ vLLM (median burst)",
                "value": _ratio(shown["roundhouse"].wait_p50, shown["vllm"].wait_p50),
            }
        )
        found.append(
            {
                "measure": f"Burst of {streams} streams{where}: frontend CPU per request, "
                "calls coalesced ÷ each on its own",
                "value": _ratio(
                    _frontend(shown["roundhouse"]), _frontend(shown["roundhouse_alone"])
                ),
            }
        )
    return found


def _plot(by_level: dict[int, list[dict[str, Level]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(by_level)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(TARGETS)
    for i, name in enumerate(TARGETS):
        shown = [median_round(by_level[s])[name] for s in levels]
        xs = [x + (i - (len(TARGETS) - 1) / 2) * width for x in range(len(levels))]
        axes[0].bar(
            xs,
            [lvl.wait_p50 for lvl in shown],
            width,
            yerr=[[0] * len(shown), [lvl.wait_p90 - lvl.wait_p50 for lvl in shown]],
            label=LABELS[name],
        )
        # vLLM's API server does what Roundhouse's frontend and worker share: stacked.
        bottom = [0.0] * len(shown)
        for part, hatch in (("api server", ""), ("frontend", ""), ("worker", "//")):
            heights = [lvl.cpu_ms_per_request.get(part, 0.0) for lvl in shown]
            if any(heights):
                axes[1].bar(
                    xs,
                    heights,
                    width,
                    bottom=bottom,
                    color=f"C{i}",
                    hatch=hatch,
                    edgecolor="white",
                    label=LABELS[name] + (" (worker)" if part == "worker" else ""),
                )
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for ax in axes:
        ax.set_xticks(range(len(levels)), [f"{s} streams" for s in levels])
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    axes[0].set(ylabel="ms")
    axes[0].set_title(
        "A burst's wait: its slowest time to first token (p50, bar to p90)", fontsize=10
    )
    axes[1].set(ylabel="CPU ms per request")
    axes[1].set_title(
        "CPU per request outside the engine core (vLLM's server; frontend + worker)", fontsize=10
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _publish(args: argparse.Namespace, by_level: dict[int, list[dict[str, Level]]]) -> None:
    machine = machine_line(gpu=args.gpu, vllm=args.vllm, cores=args.cores, cpu=args.cpu)
    where = f" on one {args.gpu}" if args.gpu else ""
    rounds = min(len(r) for r in by_level.values())
    _plot(by_level, plot_path(args.docs, args.section), f"Bursts of streams, {machine}")
    text = f"""## Bursts: streams that start together

`bench/bursts.py`, {time.strftime("%Y-%m-%d")}, {machine}, tiny Llama demo model, eager mode.
Bursts of N streamed chats of {args.tokens} output tokens (ignore_eos) started at once, the
next burst {PAUSE_S:g} s after the last one ended, {args.bursts} bursts per target and level
after {WARM_BURSTS} to warm up, {rounds} round{"" if rounds == 1 else "s"}. A burst's wait is
the time to first token of its slowest stream: what a load's first round, or a fan-out of
calls, waits for. Targets side by side with the same engine settings: vLLM's own server;
Roundhouse; and a second Roundhouse frontend on the same worker with
`ROUNDHOUSE_REDIS_COALESCE=0`, so that each request's quota and queue calls go to Valkey on
their own instead of sharing a round trip with the calls the other requests of the burst make
in the same turn of the event loop. Each level shows its median round by the burst-wait ratio
Roundhouse ÷ vLLM. CPU per request is each server process's own CPU time, idle time between
bursts included, over the requests it served: vLLM's API server (its engine core apart),
Roundhouse's frontend, and the worker's process without its engine core (shared by both
frontends). vLLM's API server does the work that Roundhouse's frontend and worker share.

{tables(by_level)}

![bursts](img/{args.section}.png)
"""
    section_write(args.docs, args.section, text)
    results_write(
        args.docs,
        args.section,
        {
            "section": args.section,
            "machine": machine,
            "settings": {
                "levels": args.levels,
                "bursts": args.bursts,
                "tokens": args.tokens,
                "rounds": args.rounds,
            },
            "headline": headline(by_level, where),
            "rounds": {
                str(s): [{n: asdict(lvl) for n, lvl in r.items()} for r in rounds_]
                for s, rounds_ in by_level.items()
            },
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="8,32", help="comma-separated streams per burst")
    parser.add_argument("--bursts", type=int, default=30, help="bursts per target and level")
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per stream")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every target")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    args.gpu, args.vllm = accelerator(), vllm_version()
    args.cpu, args.cores = cpu_features(), os.cpu_count()
    args.section = "bursts_gpu" if args.gpu else "bursts"
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform: Platform | None = None
    by_level: dict[int, list[dict[str, Level]]] = {s: [] for s in args.levels}
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(
            model_dir, work, tenants={"bench": {}}, max_num_seqs=MAX_NUM_SEQS
        )
        with (
            vllm_server(model_dir, work, max_num_seqs=MAX_NUM_SEQS) as vllm_target,
            roundhouse_stack(platform, work / "roundhouse") as ours,
            frontend_beside(
                platform, work / "alone", env={"ROUNDHOUSE_REDIS_COALESCE": "0"}, name="frontend"
            ) as (alone_url, alone_process),
        ):
            worker = ours.processes["worker+engine"]
            servers = [
                replace(
                    vllm_target,
                    processes={"api server": vllm_target.processes["vllm server"]},
                ),
                replace(ours, processes={"frontend": ours.processes["frontend"], "worker": worker}),
                replace(
                    ours,
                    name="roundhouse_alone",
                    base_url=alone_url,
                    processes={"frontend": alone_process, "worker": worker},
                ),
            ]
            for round_no in range(args.rounds):
                for streams in args.levels:
                    turn = round_no % len(servers)
                    measured = {}
                    for server in servers[turn:] + servers[:turn]:
                        level = asyncio.run(_bursts(server, streams, args.bursts, args.tokens))
                        measured[server.name] = level
                        progress(
                            f"round {round_no + 1}, {streams} streams, {LABELS[server.name]}: "
                            f"burst wait p50 {level.wait_p50:.1f} ms, p90 {level.wait_p90:.1f} "
                            f"ms; CPU per request {_cpu_cell(level)}; errors {level.errors}"
                        )
                    by_level[streams].append(measured)
                # Written after every round: a run cut short keeps what it measured.
                _publish(args, by_level)
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
