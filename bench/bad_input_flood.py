"""Bad input flood: a tenant posting 4 MB chat bodies must not slow another tenant down.

Tenant A runs four clients that each post a 4 MB chat body (a prompt far over the context) in
a loop; tenant B sends short chats one after another, first alone, then under A's flood. We
report B's p50 latency under the flood ÷ alone (target ≤ 1.5), /healthz's p50 the same way,
and how A's requests were answered (400 context_length_exceeded until its requests-per-minute
bucket runs out, then 429).

    .venv/bin/python bench/bad_input_flood.py [--requests 100] [--flooders 4]

Writes its section of docs/benchmarks.md, docs/img/bad_input_flood.png and the raw results to
docs/bench-data/bad_input_flood.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
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

BODY_BYTES = 4 * 1024 * 1024 - 4096  # just under the platform's default body limit
TARGET = 1.5


async def _timed(session: aiohttp.ClientSession, method: str, url: str, **kw: object) -> float:
    started = time.perf_counter()
    async with session.request(method, url, **kw) as response:  # type: ignore[arg-type]
        await response.read()
    return time.perf_counter() - started


async def _light(base_url: str, model: str, key: str, n: int) -> tuple[list[float], list[float]]:
    """B's chat latencies and /healthz latencies, one request after another."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    auth = {"Authorization": f"Bearer {key}"}
    chats, health = [], []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            chats.append(
                await _timed(
                    session, "POST", f"{base_url}/v1/chat/completions", json=body, headers=auth
                )
            )
            health.append(await _timed(session, "GET", f"{base_url}/healthz"))
    return chats, health


async def _flooder(
    base_url: str, model: str, key: str, stop: asyncio.Event, codes: collections.Counter[str]
) -> None:
    content = "hello world " * (BODY_BYTES // 12)
    message = {"role": "user", "content": content}
    payload = json.dumps({"model": model, "messages": [message]})
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.post(
                f"{base_url}/v1/chat/completions", data=payload.encode(), headers=auth
            ) as response:
                found = await response.json(content_type=None)
                code = (found.get("error") or {}).get("code", "ok")
                codes[f"{response.status} {code}"] += 1


async def _flood(base_url: str, model: str, key: str, flooders: int, stop: Any) -> Any:
    """Run A's clients until `stop` (a process event) is set; return how A was answered."""
    done = asyncio.Event()
    codes: collections.Counter[str] = collections.Counter()
    tasks = [
        asyncio.create_task(_flooder(base_url, model, key, done, codes)) for _ in range(flooders)
    ]
    while not stop.is_set():
        await asyncio.sleep(0.1)
    done.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return dict(codes)


def _flood_process(base_url: str, model: str, key: str, flooders: int, stop: Any, out: Any) -> None:
    out.put(asyncio.run(_flood(base_url, model, key, flooders, stop)))


def _flooded(
    base_url: str, model: str, keys: dict[str, str], n: int, flooders: int
) -> tuple[list[float], list[float], collections.Counter[str]]:
    """B's latencies under A's flood. A floods from a process of its own, so B's timings never
    wait behind the flood's client work (writing 4 MB bodies) in one event loop."""
    spawn = multiprocessing.get_context("spawn")
    stop, out = spawn.Event(), spawn.Queue()
    flood = spawn.Process(
        target=_flood_process, args=(base_url, model, keys["flood"], flooders, stop, out)
    )
    flood.start()
    try:
        time.sleep(2.0)  # the flood is under way before B measures
        chats, health = asyncio.run(_light(base_url, model, keys["light"], n))
    finally:
        stop.set()
    codes = collections.Counter(out.get(timeout=120))
    flood.join(timeout=30)
    return chats, health, codes


def _plot(alone: list[float], flooded: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, values in (("B alone", alone), ("B under A's 4 MB flood", flooded)):
        xs = sorted(v * 1000 for v in values)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
    ax.set_xlabel("B's chat latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100, help="tenant B's requests per phase")
    parser.add_argument("--flooders", type=int, default=4, help="tenant A's concurrent clients")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform = None
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        # A keeps the default 600 requests a minute: what a tenant gets unless told otherwise.
        platform = prepare_roundhouse(
            model_dir,
            work,
            tenants={"flood": {"requests_per_minute": 600}, "light": {}},
            max_num_seqs=8,
        )
        # The engine on core 0; the load generators, the frontend and the ingester on core 1,
        # as separate machines would be (as bench/admission.py does): otherwise the flood's own
        # client steals the engine's CPU and the figure is of the machine, not of the frontend.
        os.sched_setaffinity(0, {1})
        with roundhouse_stack(platform, work / "sy", engine_cpus="0", platform_cpus="1") as target:
            url, model = target.base_url, target.model
            progress(f"B alone: {args.requests} chats")
            alone, health_alone = asyncio.run(
                _light(url, model, target.api_keys["light"], args.requests)
            )
            progress(f"B under A's flood of {args.flooders} clients posting 4 MB chats")
            flooded, health_flooded, codes = _flooded(
                url, model, target.api_keys, args.requests, args.flooders
            )
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)
    p50 = {
        "chat_alone_ms": percentile(alone, 0.5) * 1000,
        "chat_flooded_ms": percentile(flooded, 0.5) * 1000,
        "healthz_alone_ms": percentile(health_alone, 0.5) * 1000,
        "healthz_flooded_ms": percentile(health_flooded, 0.5) * 1000,
    }
    ratio = p50["chat_flooded_ms"] / p50["chat_alone_ms"]
    health_ratio = p50["healthz_flooded_ms"] / p50["healthz_alone_ms"]
    answers = ", ".join(f"{code}: {n}" for code, n in codes.most_common())
    table = (
        "| measure | alone p50 | under the flood p50 | ratio |\n|---|---|---|---|\n"
        f"| B's chat | {p50['chat_alone_ms']:.0f} ms | {p50['chat_flooded_ms']:.0f} ms | "
        f"{ratio:.2f} |\n"
        f"| /healthz | {p50['healthz_alone_ms']:.1f} ms | {p50['healthz_flooded_ms']:.1f} ms | "
        f"{health_ratio:.2f} |\n\nA's answers: {answers}."
    )
    print("\n" + table)
    args.docs.mkdir(parents=True, exist_ok=True)
    _plot(alone, flooded, plot_path(args.docs, "bad_input_flood"))
    section_write(
        args.docs,
        "bad_input_flood",
        "## Bad input flood\n\n"
        f"`bench/bad_input_flood.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"tiny Llama demo model. Tenant A runs {args.flooders} clients posting 4 MB chat bodies "
        "(far over the 2,048-token context) in a loop at 600 requests a minute, from a process "
        "of its own (the engine on one core; clients, frontend and ingester on the other); "
        "tenant B sends "
        f"{args.requests} short chats one after another, alone, then under A's flood. Ratio = "
        f"p50 under the flood ÷ p50 alone (target ≤ {TARGET}).\n\n"
        + table
        + "\n\n![bad input flood](img/bad_input_flood.png)\n",
    )
    results_write(
        args.docs,
        "bad_input_flood",
        {
            "section": "bad_input_flood",
            "summary": {"chat_p50_ratio": ratio, "healthz_p50_ratio": health_ratio, **p50},
            "targets": {"chat_p50_ratio": f"≤ {TARGET}"},
            "flood_answers": dict(codes),
            "samples": {"alone": alone, "flooded": flooded},
        },
    )


if __name__ == "__main__":
    main()
