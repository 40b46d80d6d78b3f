"""Batch shedding: a flood of batch-class requests must not make interactive requests queue_full.

Tenant A floods the deployment with `service_tier: "flex"` chats (the batch class, as Batch API
lines and shadow copies are) from many clients that retry at once when refused; meanwhile A's
own interactive chats and tenant B's take turns, one at a time. The deployment admits few
requests beyond its free slots (`max_queued` 8), so the flood keeps its queue full. It runs
twice, on a fresh stack each time: with `ROUNDHOUSE_BATCH_QUEUE_SHARE` 1.0 (batch work may
fill the whole queue) and 0.5 (the default: batch work fills half, interactive work the rest).
We report how the interactive chats were answered (the 503 queue_full share, target 0 with the
default), their latency, and what the flood got.

    .venv/bin/python bench/batch_shedding.py [--requests 60] [--flooders 24]

Writes its section of docs/benchmarks.md, docs/img/batch_shedding.png and the raw results to
docs/bench-data/batch_shedding.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
)

DEFAULT_SHARE = 0.5  # ROUNDHOUSE_BATCH_QUEUE_SHARE's default
SHARES = (1.0, DEFAULT_SHARE)
MAX_QUEUED = 8
# Whose interactive chats run under the flood: the flooding tenant's own (its batch job and its
# live traffic share a queue), and another tenant's (which the workers' reserved slots for
# tenants with nothing running already shield).
CHATTERS = {"A's own": "flood", "B's": "light"}


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str
) -> tuple[str, float]:
    """Send one chat; return how it was answered (`200` or `503 queue_full`) and its seconds."""
    started = time.perf_counter()
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        found = await resp.json(content_type=None)
    code = "" if resp.status == 200 else f" {(found.get('error') or {}).get('code', '?')}"
    return f"{resp.status}{code}", time.perf_counter() - started


async def _flooder(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    key: str,
    stop: asyncio.Event,
    answers: collections.Counter[str],
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Write on."}],
        "max_tokens": 32,
        "ignore_eos": True,
        "service_tier": "flex",
    }
    while not stop.is_set():
        answer, _ = await _post(session, url, body, key)
        answers[answer] += 1
        if answer != "200":
            await asyncio.sleep(0.01)  # a client that retries at once, as a batch runner may


async def _run(base_url: str, model: str, keys: dict[str, str], n: int, flooders: int) -> Any:
    """The interactive chats' answers and latencies under A's flood (by whose they are: A's
    own, B's), and A's flood's answers."""
    url = f"{base_url}/v1/chat/completions"
    stop = asyncio.Event()
    flood_answers: collections.Counter[str] = collections.Counter()
    answers = {who: collections.Counter[str]() for who in CHATTERS}
    latencies: dict[str, list[float]] = {who: [] for who in CHATTERS}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    connector = aiohttp.TCPConnector(limit=flooders + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        flood = [
            asyncio.create_task(_flooder(session, url, model, keys["flood"], stop, flood_answers))
            for _ in range(flooders)
        ]
        await asyncio.sleep(3.0)  # the queue is full before the chats start
        for _ in range(n):
            for who, tenant in CHATTERS.items():
                answer, seconds = await _post(session, url, body, keys[tenant])
                answers[who][answer] += 1
                if answer == "200":
                    latencies[who].append(seconds)
                await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*flood, return_exceptions=True)
    return answers, latencies, flood_answers


def _plot(results: dict[float, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(CHATTERS)
    for i, who in enumerate(CHATTERS):
        xs = [j + i * width for j in range(len(results))]
        left.bar(xs, [r["chats"][who]["refused_percent"] for r in results.values()], width,
                 label=f"{who} chats")  # fmt: skip
    left.set_xticks([j + width / 2 for j in range(len(results))])
    left.set_xticklabels([f"batch share {share:g}" for share in results])
    left.set_ylabel("interactive chats refused queue_full (%)")
    left.set_ylim(0, 100)
    left.legend()
    for share, r in results.items():
        for who in CHATTERS:
            ms = sorted(v * 1000 for v in r["chats"][who]["latencies"])
            if ms:
                right.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))],
                           label=f"{who}, share {share:g}")  # fmt: skip
    right.set_xlabel("interactive chat latency, answered chats (ms)")
    right.set_ylabel("fraction of chats")
    right.legend(fontsize="small")
    fig.suptitle("Interactive chats under a flood of batch-class chats")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="tenant B's chats per run")
    parser.add_argument("--flooders", type=int, default=24, help="tenant A's concurrent clients")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform = None
    results: dict[float, dict[str, Any]] = {}
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(
            model_dir,
            work,
            tenants={"flood": {}, "light": {}},
            max_num_seqs=4,
            max_queued=MAX_QUEUED,
        )
        os.sched_setaffinity(0, {1})  # the clients beside the frontend, the engine on core 0
        for step, share in enumerate(SHARES, 1):
            platform.env["ROUNDHOUSE_BATCH_QUEUE_SHARE"] = str(share)
            progress(f"[{step}/{len(SHARES)}] share {share:g}: starting a stack")
            with roundhouse_stack(
                platform, work / f"share-{share:g}", engine_cpus="0", platform_cpus="1"
            ) as target:
                progress(
                    f"[{step}/{len(SHARES)}] share {share:g}: {args.flooders} flex clients, "
                    f"{args.requests} interactive chats"
                )
                chats, latencies, flood = asyncio.run(
                    _run(target.base_url, target.model, target.api_keys, args.requests,
                         args.flooders)
                )  # fmt: skip
            results[share] = {"chats": {}, "flood_answers": dict(flood)}
            for who in CHATTERS:
                got, seconds = chats[who], latencies[who]
                refused = sum(n for answer, n in got.items() if answer != "200")
                results[share]["chats"][who] = {
                    "answers": dict(got),
                    "refused_percent": 100.0 * refused / max(sum(got.values()), 1),
                    "p50_ms": percentile(seconds, 0.5) * 1000 if seconds else None,
                    "p99_ms": percentile(seconds, 0.99) * 1000 if seconds else None,
                    "latencies": seconds,
                }
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)

    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value:.0f}"

    rows = []
    for share, r in results.items():
        flood = r["flood_answers"]
        flood_ok = flood.get("200", 0)
        flood_refused = sum(n for answer, n in flood.items() if answer != "200")
        for who in CHATTERS:
            c = r["chats"][who]
            rows.append(
                f"| {share:g} | {who} | {c['refused_percent']:.0f} % | {ms(c['p50_ms'])} | "
                f"{ms(c['p99_ms'])} | {flood_ok:,} | {flood_refused:,} |"
            )
    table = (
        "| batch share | interactive chats | refused queue_full | p50 (ms) | p99 (ms) | "
        "flood answered | flood refused |\n|---:|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
    )
    print("\n" + table)
    args.docs.mkdir(parents=True, exist_ok=True)
    _plot(results, plot_path(args.docs, "batch_shedding"))
    section_write(
        args.docs,
        "batch_shedding",
        "## Batch shedding\n\n"
        f"`bench/batch_shedding.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"tiny Llama demo model, 4 engine slots and `max_queued` {MAX_QUEUED}. Tenant A runs "
        f'{args.flooders} clients sending `service_tier: "flex"` chats (the batch class; 32 '
        "tokens each) in a loop, each retrying 10 ms after a refusal; meanwhile A's own "
        "interactive chats and tenant B's take turns, one at a time, "
        f"{args.requests} each. Each share runs on a fresh stack (the engine on one core; "
        "clients, frontend and ingester on the other). With share 1.0 batch work may fill the "
        "whole queue, as every class could before; with the default 0.5 it fills half. "
        "Target: no interactive chat is refused with the default share. B, a tenant with "
        "nothing running, gets a worker's reserved slot even at share 1.0; A's own "
        "interactive chats have no such shelter: the share is what keeps room for them.\n\n"
        + table
        + "\n\n![batch shedding](img/batch_shedding.png)\n",
    )
    results_write(
        args.docs,
        "batch_shedding",
        {
            "section": "batch_shedding",
            "summary": {
                f"share_{share:g}": {
                    "flood_answers": r["flood_answers"],
                    **{
                        who: {k: v for k, v in c.items() if k != "latencies"}
                        for who, c in r["chats"].items()
                    },
                }
                for share, r in results.items()
            },
            "headline": [
                {
                    "measure": f"Interactive chats refused under a batch-class flood, batch share "
                    f"{share:g}, {who} (%)",
                    "value": round(c["refused_percent"], 1),
                    **({"target": "≤ 0"} if share == DEFAULT_SHARE else {}),
                }
                for share, r in results.items()
                for who, c in r["chats"].items()
            ],
            "samples": {
                f"share_{share:g}": {who: c["latencies"] for who, c in r["chats"].items()}
                for share, r in results.items()
            },
        },
    )


if __name__ == "__main__":
    main()
