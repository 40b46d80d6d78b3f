"""Structured output and tools through Roundhouse vs vLLM alone; the frontend's time for big tools.

(1) The same streaming chat load against vLLM's own OpenAI server (started with
`--enable-auto-tool-choice --tool-call-parser hermes`) and against Roundhouse end to end
(frontend, queue, worker, ingester; the model registered with the hermes tool parser), with the
same engine settings, in two scenarios: `response_format` json_schema, and two tools with
`tool_choice` "required", beside a control: the same chat with neither, which shows what any
stream costs through the platform, so the scenarios' ratios read against it. All run at
concurrency 1, 8 and 32, and we report aggregate output tokens/s and the ratio
Roundhouse ÷ vLLM. Every request sets ignore_eos and max_tokens, so every stream on both sides
is the same number of tokens, and pushes the tokenizer's whitespace-only tokens away
(logit_bias -100), so that no stream fills up with whitespace inside the JSON. Both servers run
side by side from one process tree; the rounds alternate which goes first.

(2) The frontend's added time for a chat request carrying 20 tools (8 KB of JSON) over the
same conversation without tools, measured in process on the frontend's own functions: the
body's JSON decode, `inference.body.parser.generation_parse` (validation, and each tool's schema
compiled by xgrammar as the engine would), `inference.pipeline.tokenization.prompt_ids` (the chat
template rendered with the tools, then tokenised) and the job's tool list. p50 and p99 of many
alternating runs of each body.

    .venv/bin/python bench/structured.py [--levels 1,8,32] [--requests-per-level 4] [--rounds 7]

Writes its section of docs/benchmarks.md, docs/img/structured.png and the raw results to
docs/bench-data/structured.json, after every level, so a run cut short keeps the levels it
finished (the section says which are missing). On a machine with an NVIDIA GPU the
section, plot and results are `structured_gpu`, beside the CPU ones, and name the card and
vLLM's version. Asserts nothing.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    Target,
    accelerator,
    median_ratio_pair,
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

OUTPUT_TOKENS = 64
# Requests per level at least. The machine's speed drifts by ±15 % from one minute to the
# next, so many short rounds, each pairing both servers back to back, say more than a few
# long ones: the median pair's ratio and the quartiles of all pairs are reported.
MIN_REQUESTS = 16
MAX_NUM_SEQS = 64
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
TARGET_RATIO = "≥ 0.95"
MESSAGES = [{"role": "user", "content": "Find a review of the new roundhouse and rate it."}]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "score", "tags"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
]
SCENARIOS: dict[str, dict[str, Any]] = {
    # The control: the same chat without a constraint, so the table shows what structured
    # output and tools cost beyond what every stream costs through the platform.
    "plain": {},
    "json_schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "review", "schema": SCHEMA, "strict": True},
        }
    },
    "tools_required": {"tools": TOOLS, "tool_choice": "required"},
}
LABELS = {
    "plain": "plain text (control)",
    "json_schema": "response_format json_schema",
    "tools_required": 'tool_choice "required"',
}


# --- (1) streaming through both servers ------------------------------------------------------


@dataclass
class Level:
    scenario: str
    concurrency: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    errors: int
    short: int  # streams that did not produce OUTPUT_TOKENS tokens
    shaped: int  # streams whose deltas carried what the scenario asks (content, tool calls)
    requests: int
    wall_s: float = 0.0
    load_1m: float = 0.0  # the machine's 1-minute load average as the level started
    ttfts_ms: list[float] = field(default_factory=list)


def whitespace_ids(model_dir: Path) -> list[int]:
    """The tokenizer's tokens that are only whitespace (not its special tokens)."""
    from models_registry.demo_model import whitespace_token_ids

    return whitespace_token_ids(model_dir)


def request_body(scenario: str, model: str, no_whitespace: dict[str, float]) -> dict[str, Any]:
    return {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
        "logit_bias": no_whitespace,
        "stream": True,
        "stream_options": {"include_usage": True},
        **SCENARIOS[scenario],
    }


async def chat_stream(
    session: aiohttp.ClientSession, target: Target, body: dict[str, Any]
) -> tuple[float, int, bool]:
    """Stream one chat; return (TTFT seconds, output tokens, whether it was shaped as asked)."""
    headers = {"Authorization": f"Bearer {target.api_keys.get('bench', 'none')}"}
    wanted = "tool_calls" if "tools" in body else "content"
    started = time.perf_counter()
    ttft = -1.0
    tokens = 0
    shaped = False
    async with session.post(
        f"{target.base_url}/v1/chat/completions", json=body, headers=headers
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
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("tool_calls"):
                    if ttft < 0:
                        ttft = time.perf_counter() - started
                    shaped = shaped or bool(delta.get(wanted))
    return ttft, tokens, shaped


async def _level(
    target: Target, scenario: str, body: dict[str, Any], concurrency: int, requests: int, warm: bool
) -> Level:
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if warm:
            # Warm the path (connections, compiled grammars, the engine's first-use code).
            await asyncio.gather(*(chat_stream(session, target, body) for _ in range(concurrency)))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        results: list[tuple[float, int, bool]] = []
        errors = 0

        async def client() -> None:
            nonlocal errors
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    results.append(await chat_stream(session, target, body))
                except Exception as exc:
                    errors += 1
                    progress(f"request failed: {exc}")

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    ttfts = sorted(r[0] * 1000 for r in results if r[0] >= 0)
    return Level(
        scenario=scenario,
        concurrency=concurrency,
        tokens_per_s=sum(r[1] for r in results) / wall,
        ttft_p50_ms=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99_ms=percentile(ttfts, 0.99),
        errors=errors,
        short=sum(1 for r in results if r[1] != OUTPUT_TOKENS),
        shaped=sum(1 for r in results if r[2]),
        requests=requests,
        wall_s=wall,
        ttfts_ms=ttfts,
    )


def _measure(
    target: Target,
    scenario: str,
    body: dict[str, Any],
    concurrency: int,
    per_level: int,
    warm: bool,
) -> Level:
    requests = max(per_level * concurrency, MIN_REQUESTS)
    load = os.getloadavg()[0]
    level = asyncio.run(_level(target, scenario, body, concurrency, requests, warm))
    level.load_1m = load
    progress(
        f"{target.name} {scenario}: c={concurrency} {level.tokens_per_s:,.0f} tok/s, "
        f"TTFT p50 {level.ttft_p50_ms:.1f} ms, {level.errors} errors, {level.short} short, "
        f"{level.shaped}/{len(level.ttfts_ms)} shaped"
    )
    return level


Rounds = dict[str, dict[str, dict[int, list[Level]]]]  # target → scenario → concurrency → rounds


def run_streams(
    vllm: Target,
    roundhouse: Target,
    no_whitespace: dict[str, float],
    levels: list[int],
    per_level: int,
    rounds: int,
    level_done: Callable[[Rounds, list[int]], None] | None = None,
) -> Rounds:
    """Every scenario at every level, alternating the two servers' order round by round.

    `level_done` gets what was measured and the levels finished, after each level.
    """
    measured: Rounds = {"vllm": {}, "roundhouse": {}}
    for done, concurrency in enumerate(levels, start=1):
        for scenario in SCENARIOS:
            for round_ in range(rounds):
                pair = [vllm, roundhouse] if round_ % 2 == 0 else [roundhouse, vllm]
                for target in pair:
                    body = request_body(scenario, target.model, no_whitespace)
                    level = _measure(target, scenario, body, concurrency, per_level, round_ == 0)
                    by_level = measured[target.name].setdefault(scenario, {})
                    by_level.setdefault(concurrency, []).append(level)
        if level_done is not None:
            level_done(measured, levels[:done])
    return measured


# --- (2) the frontend's time for a big tool list ---------------------------------------------

_TOOL_SUBJECTS = (
    "customer", "invoice", "order", "shipment", "ticket", "refund", "product", "warehouse",
    "supplier", "contract", "payment", "subscription", "employee", "meeting", "document",
    "campaign", "lead", "asset", "incident", "report",
)  # fmt: skip


def big_tools() -> list[dict[str, Any]]:
    """Twenty tools of a business assistant, about 8 KB of JSON, each with a different schema."""
    tools = []
    for i, subject in enumerate(_TOOL_SUBJECTS):
        properties: dict[str, Any] = {
            f"{subject}_id": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["open", "pending", "closed", "archived"][: 2 + i % 3],
            },
            "limit": {"type": "integer", "maximum": 100 + i},
            "fields": {"type": "array", "items": {"type": "string"}},
        }
        if i % 4 == 1:
            properties["since"] = {"type": "string", "format": "date"}
        if i % 5 == 0:
            properties["owner"] = {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            }
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"find_{subject}",
                    "description": f"Find {subject}s by id or state.",
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": [f"{subject}_id"],
                    },
                },
            }
        )
    return tools


@dataclass
class FrontendTimes:
    body: str
    body_bytes: int
    prompt_tokens: int
    total_ms: list[float]
    parse_ms: list[float]
    prompt_ms: list[float]


def frontend_times(iterations: int) -> dict[str, FrontendTimes]:
    """Time the frontend's preprocessing of a plain chat and the same chat with 20 tools."""
    from billing.services import price_current
    from inference.body.fields import CHAT
    from inference.body.parser import body_parse, generation_parse
    from inference.pipeline.submission import tools_build
    from inference.pipeline.tokenization import prompt_ids
    from models_registry.selectors import route_resolve

    route = route_resolve(name="tiny", price_of=price_current)
    assert route is not None and route.tool_parser, "the tiny model is not deployed with tools"
    plain = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16}
    bodies = {
        "plain": json.dumps(plain).encode(),
        "20 tools": json.dumps({**plain, "tools": big_tools(), "tool_choice": "auto"}).encode(),
    }
    times = {name: FrontendTimes(name, len(raw), 0, [], [], []) for name, raw in bodies.items()}
    for i in range(iterations + 10):  # the first ten warm the caches and are not kept
        for name, raw in bodies.items():
            started = time.perf_counter()
            request = generation_parse(body_parse(raw), endpoint=CHAT)
            parsed = time.perf_counter()
            # As the frontend tokenises: without a context bound the 20 tools' prompt is
            # measured whole even where it is longer than the tiny model's context.
            prompts = prompt_ids(request, route)
            tools_build(request, route)
            ended = time.perf_counter()
            if i < 10:
                continue
            entry = times[name]
            entry.prompt_tokens = len(prompts[0])
            entry.total_ms.append((ended - started) * 1000)
            entry.parse_ms.append((parsed - started) * 1000)
            entry.prompt_ms.append((ended - parsed) * 1000)
    return times


def _quantiles(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), percentile(values, 0.99)


# --- the report ------------------------------------------------------------------------------


def _pair_ratios(measured: Rounds, scenario: str, concurrency: int) -> list[float]:
    """Roundhouse ÷ vLLM of every round of one scenario and level, sorted."""
    pairs = zip(
        measured["vllm"][scenario][concurrency],
        measured["roundhouse"][scenario][concurrency],
        strict=True,
    )
    return sorted(b.tokens_per_s / a.tokens_per_s for a, b in pairs)


def _stream_table(
    vllm: dict[str, list[Level]], roundhouse: dict[str, list[Level]], measured: Rounds
) -> str:
    rows = [
        "| scenario | concurrency | vLLM tok/s | Roundhouse tok/s | throughput ratio "
        "| rounds' ratios p25 – p75 "
        "| vLLM TTFT p50 (ms) | Roundhouse TTFT p50 (ms) | errors | short streams |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario in SCENARIOS:
        for a, b in zip(vllm[scenario], roundhouse[scenario], strict=True):
            ratios = _pair_ratios(measured, scenario, a.concurrency)
            rows.append(
                f"| {LABELS[scenario]} | {a.concurrency} | {a.tokens_per_s:,.0f} "
                f"| {b.tokens_per_s:,.0f} | **{b.tokens_per_s / a.tokens_per_s:.2f}** "
                f"| {percentile(ratios, 0.25):.2f} – {percentile(ratios, 0.75):.2f} "
                f"| {a.ttft_p50_ms:.1f} | {b.ttft_p50_ms:.1f} | {a.errors + b.errors} "
                f"| {a.short + b.short} |"
            )
    return "\n".join(rows)


def _frontend_table(times: dict[str, FrontendTimes]) -> str:
    rows = [
        "| body | bytes | prompt tokens | total p50 / p99 (ms) | parse + schema compile p50 (ms) "
        "| template + tokenise p50 (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in times.values():
        p50, p99 = _quantiles(t.total_ms)
        rows.append(
            f"| {t.body} | {t.body_bytes:,} | {t.prompt_tokens:,} | {p50:.2f} / {p99:.2f} "
            f"| {statistics.median(t.parse_ms):.2f} | {statistics.median(t.prompt_ms):.2f} |"
        )
    return "\n".join(rows)


def _added(times: dict[str, FrontendTimes]) -> tuple[float, float]:
    plain, tools = (_quantiles(times[n].total_ms) for n in ("plain", "20 tools"))
    return tools[0] - plain[0], tools[1] - plain[1]


def _plot(
    vllm: dict[str, list[Level]],
    roundhouse: dict[str, list[Level]],
    times: dict[str, FrontendTimes],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for ax, scenario in zip(axes[:3], SCENARIOS, strict=True):
        conc = [lvl.concurrency for lvl in vllm[scenario]]
        ax.plot(conc, [lvl.tokens_per_s for lvl in vllm[scenario]], "o--", label="vLLM server")
        ax.plot(conc, [lvl.tokens_per_s for lvl in roundhouse[scenario]], "s-", label="Roundhouse")
        for a, b in zip(vllm[scenario], roundhouse[scenario], strict=True):
            ratio = b.tokens_per_s / a.tokens_per_s
            ax.annotate(
                f"×{ratio:.2f}",
                (b.concurrency, b.tokens_per_s),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc, [str(c) for c in conc])
        top = max(lvl.tokens_per_s for lvl in [*vllm[scenario], *roundhouse[scenario]])
        # Headroom for the ratios written above the points.
        ax.set(xlabel="concurrent streams", ylabel="output tokens/s", ylim=(0, top * 1.15))
        ax.set_title(f"Streaming, {LABELS[scenario]}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    right = axes[3]
    names = list(times)
    xs = range(len(names))
    width = 0.35
    quantiles = [_quantiles(times[n].total_ms) for n in names]
    right.bar([x - width / 2 for x in xs], [q[0] for q in quantiles], width, label="p50")
    right.bar([x + width / 2 for x in xs], [q[1] for q in quantiles], width, label="p99")
    right.set_xticks(list(xs), names)
    right.set(ylabel="ms per request")
    right.set_title("Frontend: parse, schema compile, template, tokenise", fontsize=10)
    right.legend(fontsize=8)
    fig.suptitle(f"Structured output and tools, {OUTPUT_TOKENS} tokens per stream, tiny Llama")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _results(
    vllm: dict[str, list[Level]],
    roundhouse: dict[str, list[Level]],
    measured: Rounds,
    times: dict[str, FrontendTimes],
    args: argparse.Namespace,
    levels: list[int],
) -> dict[str, object]:
    headline: list[dict[str, object]] = []
    # A GPU run's rows say so: the CPU rows beside them are of another machine.
    streaming = f"Streaming on one {args.gpu}" if args.gpu else "Streaming"
    for scenario in SCENARIOS:
        for a, b in zip(vllm[scenario], roundhouse[scenario], strict=True):
            streams = "1 stream" if a.concurrency == 1 else f"{a.concurrency} streams"
            headline.append(
                {
                    "measure": f"{streaming} tok/s with {LABELS[scenario]}, Roundhouse ÷ vLLM, "
                    f"{streams}",
                    "value": b.tokens_per_s / a.tokens_per_s,
                    "target": "" if scenario == "plain" else TARGET_RATIO,
                }
            )
    added_p50, added_p99 = _added(times)
    host = f" on the {args.gpu} host" if args.gpu else ""
    headline += [
        {"measure": f"Frontend time added by 20 tools (8 KB){host}, p50 (ms)", "value": added_p50},
        {"measure": f"Frontend time added by 20 tools (8 KB){host}, p99 (ms)", "value": added_p99},
    ]
    return {
        "section": args.section,
        "settings": {
            "gpu": args.gpu,
            "vllm": args.vllm,
            "cpu_count": os.cpu_count(),
            "output_tokens": OUTPUT_TOKENS,
            "max_num_seqs": MAX_NUM_SEQS,
            "levels": levels,
            "requests_per_level": args.requests_per_level,
            "rounds": args.rounds,
            "frontend_iterations": args.iterations,
        },
        "headline": headline,
        "summary": {
            "streams": [
                {
                    "scenario": s,
                    "concurrency": a.concurrency,
                    "vllm_tokens_per_s": a.tokens_per_s,
                    "roundhouse_tokens_per_s": b.tokens_per_s,
                    "throughput_ratio": b.tokens_per_s / a.tokens_per_s,
                    "vllm_ttft_p50_ms": a.ttft_p50_ms,
                    "roundhouse_ttft_p50_ms": b.ttft_p50_ms,
                    "errors": a.errors + b.errors,
                    "short": a.short + b.short,
                }
                for s in SCENARIOS
                for a, b in zip(vllm[s], roundhouse[s], strict=True)
            ],
            "frontend": {
                name: {
                    "body_bytes": t.body_bytes,
                    "prompt_tokens": t.prompt_tokens,
                    "p50_ms": _quantiles(t.total_ms)[0],
                    "p99_ms": _quantiles(t.total_ms)[1],
                    "parse_p50_ms": statistics.median(t.parse_ms),
                    "prompt_p50_ms": statistics.median(t.prompt_ms),
                }
                for name, t in times.items()
            },
            "frontend_added_p50_ms": added_p50,
            "frontend_added_p99_ms": added_p99,
        },
        "rounds": {
            target: {
                s: {str(c): [asdict(lvl) for lvl in rs] for c, rs in by_level.items()}
                for s, by_level in scenarios.items()
            }
            for target, scenarios in measured.items()
        },
        "frontend_samples_ms": {name: t.total_ms for name, t in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,8,32", help="comma-separated concurrency levels")
    parser.add_argument(
        "--requests-per-level", type=int, default=4, help="requests per stream at each level"
    )
    parser.add_argument("--rounds", type=int, default=7, help="runs of each target per level")
    parser.add_argument(
        "--iterations", type=int, default=300, help="frontend runs of each body for (2)"
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    # A GPU run writes a section of its own: the CPU figures are of another machine.
    args.gpu, args.vllm = accelerator(), vllm_version()
    args.section = "structured_gpu" if args.gpu else "structured"
    progress(f"GPU: {args.gpu or 'none'}; vLLM {args.vllm}; {os.cpu_count()} CPU cores")
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform: Platform | None = None
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        no_whitespace = {str(t): -100.0 for t in whitespace_ids(model_dir)}
        platform = prepare_roundhouse(
            model_dir,
            work,
            tenants={"bench": {}},
            max_num_seqs=MAX_NUM_SEQS,
            tool_parser="hermes",
        )
        # (2) first, while no engine runs beside it.
        progress(f"frontend: {args.iterations} runs of a plain body and of a 20-tool body")
        times = frontend_times(args.iterations)
        with (
            vllm_server(
                model_dir, work, max_num_seqs=MAX_NUM_SEQS, extra_args=TOOL_FLAGS
            ) as vllm_target,
            roundhouse_stack(platform, work / "roundhouse") as roundhouse_target,
        ):
            run_streams(
                vllm_target,
                roundhouse_target,
                no_whitespace,
                args.levels,
                args.requests_per_level,
                args.rounds,
                # Written after every level: a run cut short keeps the levels it finished.
                level_done=lambda measured, levels: _report(args, measured, times, levels),
            )
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)


def _report(
    args: argparse.Namespace, measured: Rounds, times: dict[str, FrontendTimes], levels: list[int]
) -> None:
    """Print and write the results of the levels finished so far (section, plot, JSON)."""
    medians = {
        s: [
            median_ratio_pair(
                list(zip(measured["vllm"][s][c], measured["roundhouse"][s][c], strict=True))
            )
            for c in levels
        ]
        for s in SCENARIOS
    }
    vllm = {s: [pair[0] for pair in medians[s]] for s in SCENARIOS}
    roundhouse = {s: [pair[1] for pair in medians[s]] for s in SCENARIOS}
    streams = _stream_table(vllm, roundhouse, measured)
    loads = [
        lvl.load_1m for t in measured.values() for s in t.values() for r in s.values() for lvl in r
    ]
    frontend = _frontend_table(times)
    added_p50, added_p99 = _added(times)
    missing = [c for c in args.levels if c not in levels]
    cut = (
        f" Levels of {', '.join(map(str, missing))} streams are missing: the run stopped "
        "before them."
        if missing
        else ""
    )
    print(f"\n{streams}\n\n{frontend}\n\nadded: p50 {added_p50:.2f} ms, p99 {added_p99:.2f} ms")
    _plot(vllm, roundhouse, times, plot_path(args.docs, args.section))
    tools_bytes = len(json.dumps(big_tools()))
    section_write(
        args.docs,
        args.section,
        f"## Structured output and tools{' on a GPU' if args.gpu else ''}: Roundhouse vs vLLM's "
        "own OpenAI server\n\n"
        f"`bench/structured.py`, {time.strftime('%Y-%m-%d')}, "
        + (f"one {args.gpu}, vLLM {args.vllm} on both sides, " if args.gpu else "")
        + f"{os.cpu_count()} CPU cores, tiny "
        f"Llama demo model, eager mode. Streaming chat, {OUTPUT_TOKENS} output "
        "tokens per request (ignore_eos, greedy, the tokenizer's whitespace-only tokens biased "
        "by -100 so the grammar's output is not whitespace forever), "
        "in two scenarios: `response_format` json_schema (three fields), and two tools with "
        '`tool_choice: "required"` (vLLM\'s server started with `--enable-auto-tool-choice '
        "--tool-call-parser hermes`, the model registered with the hermes parser), beside a "
        "control: the same chat with neither, whose ratio is what any stream costs through the "
        "platform (the per-request overhead, measured on its own in `bench/stream_overhead.py`). "
        "Both servers "
        "run side by side from one process tree with the same engine settings; each level runs "
        f"{args.rounds} rounds per target, alternating which goes first; the round whose ratio "
        "is the median is shown (a round measures both servers back to back, so its ratio sees "
        "one state of the machine); "
        f"{args.requests_per_level} requests per stream per level ({MIN_REQUESTS} at least). "
        "Target: "
        f"Roundhouse ÷ vLLM {TARGET_RATIO}, as for plain text. The machine's 1-minute load "
        f"average ran from {min(loads):.1f} to {max(loads):.1f} during the streams: other work "
        f"shared its cores, so a ratio here measures that work too.{cut}\n\n"
        + streams
        + "\n\n### The frontend's time for a big tool list\n\n"
        "Measured in process, on the frontend's own functions (not through HTTP): the body's "
        "JSON decode and `generation_parse` (validation, and every tool's parameters compiled "
        "by xgrammar as the engine will, so a bad schema is a 400 before queueing), then "
        "`prompt_ids` (the chat template rendered with the tools, tokenised) and the job's "
        f"tool list; {args.iterations} runs of each body, alternating. The tool body carries 20 "
        f"tools ({tools_bytes:,} bytes of JSON) over the same one-message conversation. On the "
        "tiny model (2,048-token context) the frontend would refuse that prompt as too long "
        "after tokenising it; it is timed whole here. A request with tools is preprocessed off "
        "the event loop (a thread), which this leaves out.\n\n"
        + frontend
        + f"\n\nAdded by the 20 tools: **{added_p50:.2f} ms** at p50, **{added_p99:.2f} ms** at "
        "p99 (the tool body's quantile minus the plain body's).\n\n"
        f"![structured output and tools](img/{args.section}.png)\n",
    )
    results_write(
        args.docs, args.section, _results(vllm, roundhouse, measured, times, args, levels)
    )
    progress(
        f"wrote {args.docs / 'benchmarks.md'}, {args.docs / 'img' / f'{args.section}.png'} and "
        f"{args.docs / 'bench-data' / f'{args.section}.json'}"
    )


if __name__ == "__main__":
    main()
