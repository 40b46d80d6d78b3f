"""The streaming output filter's cost: one load from tenants with and without a safety pack.

One Roundhouse stack (the engine on core 0, frontend and ingester on core 1) and three tenants
on the same deployment: `plain` has no safety pack, `spans` one that checks every generated
character for PII of every kind and a deny list, `full` the same plus the toxicity classifier
per sentence. Rounds alternate the tenants at each concurrency level; the table shows the
median round: output tokens/s, when the first text reaches the client, and the frontend's CPU
per 1,000 tokens (where the filter runs).

    .venv/bin/python bench/output_filter.py [--levels 1,8,32] [--requests 64] [--rounds 3]

Writes docs/benchmarks.md and docs/img/output_filter.png. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Target,
    cpu_seconds,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    roundhouse_stack,
    section_write,
)

OUTPUT_TOKENS = 128
# No pack; PII and deny lists only (span detectors); and the toxicity classifier on top.
TENANTS = ("plain", "spans", "full")
PROMPT = "Write a long letter about the railway yard"


@dataclass(frozen=True)
class Run:
    tenant: str
    concurrency: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    frontend_cpu_ms_per_1k: float
    errors: int


async def _one(session: aiohttp.ClientSession, target: Target, key: str) -> tuple[float, int]:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft, tokens = -1.0, 0
    async with session.post(
        f"{target.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif ttft < 0 and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - started
    return ttft, tokens


async def _level(target: Target, tenant: str, concurrency: int, requests: int) -> Run:
    key = target.api_keys[tenant]
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        await asyncio.gather(*(_one(session, target, key) for _ in range(concurrency)))
        pending = list(range(requests))
        results: list[tuple[float, int]] = []
        errors = 0

        async def client() -> None:
            nonlocal errors
            while pending:
                pending.pop()
                try:
                    results.append(await _one(session, target, key))
                except Exception:
                    errors += 1

        frontend = {"frontend": target.processes["frontend"]}
        cpu_before = cpu_seconds(frontend)["frontend"]
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu = cpu_seconds(frontend)["frontend"] - cpu_before
    tokens = sum(t for _, t in results)
    ttfts = [t * 1000 for t, _ in results if t >= 0]
    return Run(
        tenant=tenant,
        concurrency=concurrency,
        tokens_per_s=tokens / wall,
        ttft_p50_ms=percentile(ttfts, 0.5),
        ttft_p99_ms=percentile(ttfts, 0.99),
        frontend_cpu_ms_per_1k=cpu * 1000 / max(tokens, 1) * 1000,
        errors=errors,
    )


def _median(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2]


def _table(rows: list[tuple[Run, ...]]) -> str:
    lines = [
        "| concurrency | tok/s no pack | tok/s PII + deny (ratio) | tok/s + toxicity (ratio) "
        "| first text p50 / p99 (ms): no pack · PII + deny · + toxicity "
        "| frontend CPU ms per 1k tokens | errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for plain, spans, full in rows:
        lines.append(
            f"| {plain.concurrency} | {plain.tokens_per_s:,.0f} "
            f"| {spans.tokens_per_s:,.0f} (**{spans.tokens_per_s / plain.tokens_per_s:.2f}**) "
            f"| {full.tokens_per_s:,.0f} (**{full.tokens_per_s / plain.tokens_per_s:.2f}**) "
            f"| {plain.ttft_p50_ms:.0f} / {plain.ttft_p99_ms:.0f} · "
            f"{spans.ttft_p50_ms:.0f} / {spans.ttft_p99_ms:.0f} · "
            f"{full.ttft_p50_ms:.0f} / {full.ttft_p99_ms:.0f} "
            f"| {plain.frontend_cpu_ms_per_1k:.0f} · {spans.frontend_cpu_ms_per_1k:.0f} · "
            f"{full.frontend_cpu_ms_per_1k:.0f} "
            f"| {plain.errors + spans.errors + full.errors} |"
        )
    return "\n".join(lines)


def _plot(rows: list[tuple[Run, ...]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [row[0].concurrency for row in rows]
    labels = ("no pack", "PII + deny", "+ toxicity")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (label, marker) in enumerate(zip(labels, "os^", strict=True)):
        left.plot(levels, [row[i].tokens_per_s for row in rows], marker + "-", label=label)
        right.plot(levels, [row[i].ttft_p50_ms for row in rows], marker + "-", label=label)
    left.set(xlabel="concurrent streams", ylabel="output tokens/s", xscale="log")
    right.set(xlabel="concurrent streams", ylabel="first visible text p50 (ms)", xscale="log")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--requests", type=int, default=64, help="measured requests per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="sy-filter-bench-") as tmp:
        work = Path(tmp)
        progress("building the demo model and starting the platform")
        from models_registry.demo_model import demo_model_build

        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(
            model_dir, work, tenants={t: {} for t in TENANTS}, max_num_seqs=32
        )
        try:
            from safety.services import policy_assign, policy_pack_save
            from tenants.models import Tenant

            spans = policy_pack_save(
                name="spans",
                pii_kinds=["email", "phone", "card", "secret"],
                pii_action="redact",
                deny_terms=["zyzzyva", "quixotry"],
                deny_patterns=[r"\bTOPSECRET-\d{4}\b"],
                apply_to_input=False,
            )
            full = policy_pack_save(
                name="full",
                toxicity_threshold=0.8,
                pii_kinds=["email", "phone", "card", "secret"],
                pii_action="redact",
                deny_terms=["zyzzyva", "quixotry"],
                deny_patterns=[r"\bTOPSECRET-\d{4}\b"],
                apply_to_input=False,
            )
            policy_assign(tenant=Tenant.objects.get(slug="spans"), pack=spans)
            policy_assign(tenant=Tenant.objects.get(slug="full"), pack=full)
            with roundhouse_stack(
                platform, work / "stack", engine_cpus="0", platform_cpus="1"
            ) as target:
                rows = []
                for level in levels:
                    runs: dict[str, list[Run]] = {t: [] for t in TENANTS}
                    for round_ in range(args.rounds):
                        for tenant in TENANTS:
                            progress(f"concurrency {level}, round {round_ + 1}, {tenant}")
                            runs[tenant].append(
                                asyncio.run(_level(target, tenant, level, args.requests))
                            )
                    rows.append(tuple(_median(runs[t]) for t in TENANTS))
        finally:
            platform_stop(platform)
    table = _table(rows)
    print(table)
    _plot(rows, plot_path(args.docs, "output_filter"))
    text = (
        "## Safety: the streaming output filter's cost\n\n"
        f"`bench/output_filter.py`, {time.strftime('%Y-%m-%d')}, 2 CPU cores, tiny Llama demo "
        f"model, {OUTPUT_TOKENS} output tokens per streamed chat completion (ignore_eos), "
        f"{args.requests} requests per run, {args.rounds} alternating rounds, the median round "
        "shown. Same stack and deployment for three tenants: no pack; a pack with PII of every "
        "kind and a deny list on the output; the same plus the toxicity classifier. The engine "
        "runs on core 0, the frontend (where the filter runs), ingester and load generator on "
        "core 1. `first text` is when the client sees its first generated characters: the "
        "filter holds text back until its checks are sure of it, about 64 characters for the "
        "span detectors and to the end of the sentence (at most 400 characters) for toxicity; "
        "the demo model's random-weight output has few sentence ends, so this is its worst "
        "case.\n\n"
        f"{table}\n\n![output filter](img/output_filter.png)\n"
    )
    section_write(args.docs, "output_filter", text)
    print(f"written to {args.docs}/benchmarks.md")


if __name__ == "__main__":
    main()
