"""Where each process's time goes under a streaming load: sampled profiles of both servers.

vLLM's own OpenAI server and Roundhouse (frontend, worker, usage ingester) run side by side on
the tiny demo model with the same engine settings. For each scenario (a plain completions
chat stream; the same with a `response_format` json_schema) and each level (concurrent
streams), a closed-loop load runs against one server at a time while py-spy samples the Python
stacks of its processes without pausing them: vLLM's API server and its engine core;
Roundhouse's frontend, worker and engine core. Only threads that are not waiting for I/O or
a lock are sampled, so a process's samples are its time on a CPU, or ready for one where the
cores are all taken (on a small machine, an upper bound of its CPU time). Over the load's
output tokens they are its time per token; the frames are where that time goes: "self" the
function that was running, "within" everything it called.

    .venv/bin/python bench/profiles.py [--levels 1,8,32] [--scenarios plain,json_schema]
        [--seconds 20] [--rate 100] [--stream-interval-ms 0]

Writes the `profile` section of docs/benchmarks.md and docs/bench-data/profile.json (every
process's 40 heaviest frames, self and within); on a machine with an NVIDIA GPU, `profile_gpu`.
Needs py-spy (a development dependency) and permission to read the processes' memory (the
same user). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    Target,
    accelerator,
    cpu_features,
    machine_line,
    platform_stop,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    vllm_server,
    vllm_version,
)
from bench.structured import OUTPUT_TOKENS, request_body, whitespace_ids  # noqa: E402

MAX_NUM_SEQS = 64
SCENARIOS = ("plain", "json_schema")
KEPT_FRAMES = 40  # per process and kind, in the JSON
SHOWN_FRAMES = 5  # per process, in the section


@dataclass
class Sampled:
    """One process's samples during one load: how many, and by frame."""

    process: str
    samples: int
    seconds: float
    rate: int
    self_frames: list[tuple[str, int]] = field(default_factory=list)
    within_frames: list[tuple[str, int]] = field(default_factory=list)
    error: str = ""

    def ms_per_1k_tokens(self, tokens_per_s: float) -> float:
        """CPU milliseconds per 1,000 output tokens: the samples' CPU seconds over the tokens
        the load produced while they were taken."""
        tokens = tokens_per_s * self.seconds
        return self.samples / self.rate * 1e6 / tokens if tokens else float("nan")


@dataclass
class Load:
    target: str
    scenario: str
    concurrency: int
    seconds: float
    tokens: int
    requests: int
    errors: int
    processes: list[Sampled] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


# --- reading py-spy's raw output ----------------------------------------------------------------

_LINE = re.compile(r":\d+\)$")
_PATH = re.compile(r"\((?:.*/site-packages/|.*/lib/python3\.\d+/|" + re.escape(str(ROOT)) + "/)?")


def frame_name(frame: str) -> str:
    """A py-spy frame without its line number and with its file relative to its package:
    `send (uvicorn/protocols/http/h11_impl.py)`."""
    return _PATH.sub("(", _LINE.sub(")", frame.strip()), count=1)


def frames_counted(raw: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """From py-spy's raw (collapsed) output, the samples, and the samples per frame: where
    the frame was the one running (self), and where it was on the stack at all (within)."""
    total = 0
    running: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += samples
        running[frames[-1]] += samples
        for name in set(frames):
            within[name] += samples
    return total, running, within


def _sample(pids: dict[str, int], seconds: float, rate: int, work: Path) -> list[Sampled]:
    """Sample each process for `seconds` at `rate` per second, all at once."""
    beside = Path(sys.executable).parent / "py-spy"
    spy = str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"
    running = {}
    for name, pid in pids.items():
        out = work / f"{name.replace(' ', '-')}-{time.monotonic_ns()}.txt"
        command = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration",
                   str(max(1, round(seconds))), "--format", "raw", "--output", str(out),
                   "--nonblocking"]  # fmt: skip
        running[name] = (
            out,
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        )
    sampled = []
    for name, (out, popen) in running.items():
        said, _ = popen.communicate(timeout=seconds + 60)
        if popen.returncode != 0 or not out.exists():
            error = said.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            sampled.append(Sampled(name, 0, seconds, rate, error=error[0][:200]))
            continue
        total, running_frames, within = frames_counted(out.read_text(errors="replace"))
        sampled.append(
            Sampled(
                name,
                total,
                seconds,
                rate,
                self_frames=running_frames.most_common(KEPT_FRAMES),
                within_frames=within.most_common(KEPT_FRAMES),
            )
        )
    return sampled


# --- the load ----------------------------------------------------------------------------------


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str) -> int:
    """One streamed request; the output tokens its usage chunk reports."""
    headers = {"Authorization": f"Bearer {key}"}
    tokens = 0
    async with session.post(url, json=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {(await response.text())[:200]}")
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = int(usage["completion_tokens"])
    return tokens


async def _closed_loop(
    target: Target, body: dict[str, Any], concurrency: int, seconds: float, warm: asyncio.Event
) -> tuple[int, int, int, float]:
    """`concurrency` clients, each sending its next request when the last ends, for `seconds`
    after a warm-up round (`warm` is set then): (output tokens, requests, errors, seconds)."""
    url = target.base_url + "/v1/chat/completions"
    key = target.api_keys.get("bench", "none")
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm the path (connections, grammars, the engine's first-use code) before timing.
        await asyncio.gather(*(_stream(session, url, body, key) for _ in range(concurrency)))
        warm.set()
        tokens = requests = errors = 0
        started = time.perf_counter()
        until = started + seconds

        async def client() -> None:
            nonlocal tokens, requests, errors
            while time.perf_counter() < until:
                try:
                    made = await _stream(session, url, body, key)
                except Exception as exc:
                    errors += 1
                    progress(f"request failed: {exc}")
                    continue
                # Added after the await: `tokens += await ...` reads the total before it, and
                # the clients' streams that end meanwhile would be lost.
                tokens += made
                requests += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return tokens, requests, errors, time.perf_counter() - started


def _pids(target: Target) -> dict[str, int]:
    """The processes to sample: the server's (or frontend and worker) and each engine core."""
    if target.name == "vllm":
        server = target.processes["vllm server"]
        pids = {"vLLM API server": server.pid}
        owner = server
    else:
        pids = {
            "frontend": target.processes["frontend"].pid,
            "worker": target.processes["worker+engine"].pid,
        }
        owner = target.processes["worker+engine"]
    for child in owner.children(recursive=True):
        try:
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                pids[f"{'vLLM' if target.name == 'vllm' else 'worker'} engine core"] = child.pid
        except psutil.Error:
            continue
    return pids


def _profile(
    target: Target,
    scenario: str,
    concurrency: int,
    args: argparse.Namespace,
    no_whitespace: dict[str, float],
) -> Load:
    # The chat bench/structured.py sends: whitespace tokens pushed away in both scenarios.
    body = request_body(scenario, target.model, no_whitespace)
    with tempfile.TemporaryDirectory(prefix="profile-") as work:

        async def both() -> tuple[tuple[int, int, int, float], list[Sampled]]:
            warm = asyncio.Event()
            # The load outlasts the samples by a second: they see it running throughout.
            load = asyncio.create_task(
                _closed_loop(target, body, concurrency, args.seconds + 1, warm)
            )
            await warm.wait()
            sampled = await asyncio.to_thread(
                _sample, _pids(target), args.seconds, args.rate, Path(work)
            )
            return await load, sampled

        (tokens, requests, errors, ran), sampled = asyncio.run(both())
    load = Load(target.name, scenario, concurrency, ran, tokens, requests, errors, sampled)
    progress(
        f"{target.name} {scenario} c={concurrency}: {load.tokens_per_s:,.0f} tok/s; "
        + ", ".join(
            f"{s.process} {s.ms_per_1k_tokens(load.tokens_per_s):.0f} ms/1k tok"
            for s in load.processes
        )
    )
    return load


# --- the report --------------------------------------------------------------------------------

COLUMNS = ("vLLM API server", "vLLM engine core", "frontend", "worker", "worker engine core")


def _cpu_table(loads: list[Load]) -> str:
    rows = [
        "| scenario | streams | vLLM tok/s | Roundhouse tok/s | "
        + " | ".join(COLUMNS)
        + " | Roundhouse outside its engine ÷ vLLM's API server |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in COLUMNS) + " | ---: |",
    ]
    keys = sorted({(load.scenario, load.concurrency) for load in loads}, key=_order)
    for scenario, concurrency in keys:
        pair = {
            load.target: load
            for load in loads
            if (load.scenario, load.concurrency) == (scenario, concurrency)
        }
        figures: dict[str, float] = {}
        for load in pair.values():
            for sampled in load.processes:
                figures[sampled.process] = sampled.ms_per_1k_tokens(load.tokens_per_s)
        outside = figures.get("frontend", 0) + figures.get("worker", 0)
        api = figures.get("vLLM API server", float("nan"))
        cells = [f"{figures[c]:,.0f}" if c in figures else "–" for c in COLUMNS]
        vllm, ours = pair.get("vllm"), pair.get("roundhouse")
        rows.append(
            f"| {scenario} | {concurrency} | "
            f"{f'{vllm.tokens_per_s:,.0f}' if vllm else '–'} | "
            f"{f'{ours.tokens_per_s:,.0f}' if ours else '–'} | "
            + " | ".join(cells)
            + f" | {outside / api:.2f} |"
        )
    return "\n".join(rows)


def _order(key: tuple[str, int]) -> tuple[int, int]:
    scenario, concurrency = key
    return (SCENARIOS.index(scenario) if scenario in SCENARIOS else 99, concurrency)


def _frames_table(loads: list[Load]) -> str:
    rows = [
        "| scenario | streams | process | busy | the functions it was running most |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for load in sorted(loads, key=lambda x: (_order((x.scenario, x.concurrency)), x.target)):
        for sampled in load.processes:
            if sampled.error:
                rows.append(
                    f"| {load.scenario} | {load.concurrency} | {sampled.process} | – | "
                    f"not sampled: {sampled.error} |"
                )
                continue
            busy = sampled.samples / (sampled.rate * sampled.seconds)
            top = " · ".join(
                f"`{name}` {count / sampled.samples:.0%}"
                for name, count in sampled.self_frames[:SHOWN_FRAMES]
            )
            rows.append(
                f"| {load.scenario} | {load.concurrency} | {sampled.process} | {busy:.0%} | {top} |"
            )
    return "\n".join(rows)


def _publish(args: argparse.Namespace, loads: list[Load]) -> None:
    machine = machine_line(gpu=args.gpu, vllm=args.vllm, cores=args.cores, cpu=args.cpu)
    levels = ", ".join(str(c) for c in args.levels)
    text = f"""## Where the time goes: sampled profiles of both servers

`bench/profiles.py`, {time.strftime("%Y-%m-%d")}, {machine}, tiny Llama demo model, eager mode,
`ROUNDHOUSE_STREAM_INTERVAL_MS={args.interval}`. For each scenario and level ({levels}
concurrent streams of {OUTPUT_TOKENS} output tokens), a closed-loop load runs against one
server at a time while py-spy samples every process of that server {args.rate} times a second
for {args.seconds:g} s without pausing it (`plain` is a chat stream, `json_schema` the same
with a three-field schema). Only threads not waiting for I/O or a lock are sampled: a
process's samples are its time on a CPU, or ready for one when every core is taken, so on a
small machine they are an upper bound of its CPU time. Over the load's output tokens they give
its time per token; the last column is the platform's processes outside its engine (frontend
and worker) over vLLM's API server, which does their work in one process. `Runner.run` is the
event loop's own code (uvloop, in C: polling, socket reads and writes); an engine core's
`OpOverloadPacket.__call__` is the model's torch operators, its main thread only.

Milliseconds per 1,000 output tokens, by process:

{_cpu_table(loads)}

Where each process was when sampled: its samples as a share of the wall time (over 100 %:
more than one thread at once), and the five functions it was most often running, with their
share of its samples (every process's 40 heaviest
frames, running and on the stack, are in `bench-data/{args.section}.json`):

{_frames_table(loads)}
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
                "scenarios": args.scenarios,
                "seconds": args.seconds,
                "rate": args.rate,
                "stream_interval_ms": args.interval,
            },
            "loads": [asdict(load) for load in loads],
            "summary": {},
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,8,32", help="comma-separated concurrency levels")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="plain, json_schema")
    parser.add_argument("--seconds", type=float, default=20.0, help="sampled seconds per load")
    parser.add_argument("--rate", type=int, default=100, help="samples per second")
    parser.add_argument(
        "--stream-interval-ms",
        dest="interval",
        default="0",
        help="the worker's ROUNDHOUSE_STREAM_INTERVAL_MS (default 0: every engine step)",
    )
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    args.gpu, args.vllm = accelerator(), vllm_version()
    args.cpu, args.cores = cpu_features(), os.cpu_count()
    args.section = "profile_gpu" if args.gpu else "profile"
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform: Platform | None = None
    loads: list[Load] = []
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        no_whitespace = {str(t): -100.0 for t in whitespace_ids(model_dir)}
        platform = prepare_roundhouse(
            model_dir, work, tenants={"bench": {}}, max_num_seqs=MAX_NUM_SEQS
        )
        platform.env["ROUNDHOUSE_STREAM_INTERVAL_MS"] = str(args.interval)
        with (
            vllm_server(model_dir, work, max_num_seqs=MAX_NUM_SEQS) as vllm_target,
            roundhouse_stack(platform, work / "roundhouse") as roundhouse_target,
        ):
            for scenario in args.scenarios:
                for concurrency in args.levels:
                    for target in (vllm_target, roundhouse_target):
                        loads.append(_profile(target, scenario, concurrency, args, no_whitespace))
                    # Written after every pair: a run cut short keeps what it measured.
                    _publish(args, loads)
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
