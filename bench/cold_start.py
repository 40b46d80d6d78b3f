"""Cold start: from a worker's start to its first token, with its weights cached and not.

A frontend and the usage ingester run on the tiny demo model's deployment; then, round after
round, a worker is started and a streamed chat sent to it the moment it serves (a deployment
with no worker alive refuses a request at once rather than queue it):

- cold: the worker's weights cache is an empty folder, so it fetches the version's files
  first (from the model store, checking every file's hash), then loads the engine;
- warm: the same cache again, the files already there and checked.

Each round records the seconds from the worker's start to its log's `ready: serving` and to
the waiting request's first token.

Then the container image (`make image-build`; skipped with --no-image): the whole demo started
inside it with platform/image/run.sh, as root on the host, round after round: first on an empty
/tmp (the database created and migrated, the demo model built, every process started), then
again on the /tmp that start left (a restarted pod with its volume). Each records the seconds
from the container's start to the frontend answering /healthz, to the whole demo ready (its
demo.env written) and to the first token of a streamed chat. Both parts write one section of
docs/benchmarks.md.

    .venv/bin/python bench/cold_start.py [--rounds 3] [--image-rounds 2] [--no-image] [--docs docs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    accelerator,
    chat_request,
    cpu_features,
    free_port,
    frontend_beside,
    machine_line,
    platform_stop,
    prepare_roundhouse,
    progress,
    results_write,
    section_write,
    spawn,
    stop,
    vllm_version,
    wait_for,
)

CACHES = ("cold", "warm")
IMAGE = "localhost/roundhouse:cpu"
RUN = ROOT / "platform" / "image" / "run.sh"
IMAGE_STARTS = ("empty /tmp", "the same /tmp again")


@dataclass
class Starts:
    model_bytes: int = 0
    ready: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CACHES})
    first_token: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CACHES})
    # The image: per kind of start, seconds to /healthz, to the demo ready, to the first token.
    image: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def _image_start(work: Path, scratch: Path, kind: str, starts: Starts) -> None:
    """Start the demo inside the image on SCRATCH and record its three times under KIND."""
    ports = {name: str(free_port()) for name in ("PORT", "PG_PORT", "REDIS_PORT")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUNDHOUSE_", "DJANGO_"))}
    env.update({f"ROUNDHOUSE_{name}": port for name, port in ports.items()})
    env["SCRATCH"] = str(scratch)
    base_url = f"http://127.0.0.1:{ports['PORT']}"
    env_file = scratch / "roundhouse" / "demo.env"
    env_file.unlink(missing_ok=True)
    log = work / f"image-{time.time_ns()}.log"
    started = time.monotonic()
    demo = spawn([str(RUN), "python", "manage.py", "demo"], log, env)
    try:
        wait_for(lambda: _answers(f"{base_url}/healthz"), demo, "the image's frontend", log)
        healthy = time.monotonic() - started
        wait_for(env_file.exists, demo, "the demo in the image", log)
        ready = time.monotonic() - started
        key = next(
            line.split("=", 1)[1]
            for line in env_file.read_text().splitlines()
            if line.startswith("export ROUNDHOUSE_API_KEY=")
        )
        firsts: list[float] = []
        _first_token(base_url, key, started, firsts, model="tiny-chat")
    finally:
        # run.sh passes SIGTERM to the demo, which stops its processes; then the container goes.
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=180)
    times = starts.image.setdefault(kind, {"healthy": [], "ready": [], "first_token": []})
    times["healthy"].append(healthy)
    times["ready"].append(ready)
    times["first_token"].append(firsts[0])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def run_image(args: argparse.Namespace, work: Path, starts: Starts) -> None:
    for round_ in range(args.image_rounds):
        scratch = work / f"image-tmp-{round_}"
        for kind in IMAGE_STARTS:
            progress(f"image round {round_ + 1}/{args.image_rounds}: the demo on {kind}")
            _image_start(work, scratch, kind, starts)


def _first_token(
    base_url: str, key: str, started: float, out: list[float], model: str = "tiny"
) -> None:
    """Send one streamed chat now; put the seconds from `started` to its first text in `out`."""
    request = chat_request(
        base_url, key, model=model, content="Say hello.", max_tokens=4, stream=True
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {") and b'"content":"' in line:
                out.append(time.monotonic() - started)
                break
        response.read()


def _round(
    base_url: str, key: str, env: dict[str, str], work: Path, cache: str
) -> tuple[float, float]:
    """Start one worker and return (seconds to ready, seconds to the first token)."""
    log = work / f"worker-{cache}-{time.time_ns()}.log"
    firsts: list[float] = []
    started = time.monotonic()
    worker = spawn([sys.executable, "manage.py", "run_worker", "--deployment", "tiny"], log, env)
    try:
        wait_for(lambda: b"ready: serving" in log.read_bytes(), worker, "worker", log)
        ready = time.monotonic() - started
        # Sent as soon as the worker serves (before, with no worker alive, it is refused).
        _first_token(base_url, key, started, firsts)
    finally:
        stop([worker])
    if not firsts:
        raise RuntimeError(f"no first token from the {cache} worker (log: {log})")
    return ready, firsts[0]


def run(args: argparse.Namespace, work: Path) -> Starts:
    from models_registry.demo_model import demo_model_build

    progress("building the tiny demo model")
    model_dir = demo_model_build(out_dir=work / "model")
    starts = Starts(model_bytes=sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file()))
    platform = None
    try:
        platform = prepare_roundhouse(model_dir, work, tenants={"bench": {}}, max_num_seqs=4)
        key = platform.tokens["bench"]
        env = dict(platform.env)
        ingester = spawn([sys.executable, "manage.py", "run_ingester"], work / "ingester.log", env)
        try:
            with frontend_beside(platform, work, env={}, name="frontend") as (base_url, _):
                for round_ in range(args.rounds):
                    cache_dir = work / f"weights-{round_}"
                    shutil.rmtree(cache_dir, ignore_errors=True)
                    worker_env = {**env, "ROUNDHOUSE_WEIGHTS_CACHE_DIR": str(cache_dir)}
                    for cache in CACHES:
                        progress(f"round {round_ + 1}/{args.rounds}: a {cache} worker")
                        ready, first = _round(base_url, key, worker_env, work, cache)
                        starts.ready[cache].append(ready)
                        starts.first_token[cache].append(first)
        finally:
            stop([ingester])
    finally:
        platform_stop(platform)
    return starts


def _machine() -> str:
    gpu = accelerator()
    return machine_line(gpu=gpu, vllm=vllm_version(), cores=os.cpu_count(), cpu=cpu_features())


def report(starts: Starts, docs: Path, rounds: int) -> None:
    rows = []
    for cache in CACHES:
        ready, first = starts.ready[cache], starts.first_token[cache]
        rows.append(
            f"| {cache} | {statistics.median(ready):.1f} ({min(ready):.1f}–{max(ready):.1f}) | "
            f"{statistics.median(first):.1f} ({min(first):.1f}–{max(first):.1f}) |"
        )
    cold, warm = (statistics.median(starts.first_token[c]) for c in CACHES)
    image_lines = _image_report(starts)
    text = "\n".join(
        [
            "## Cold start: a worker's start to its first token",
            "",
            f"`bench/cold_start.py`, {rounds} rounds on {_machine()}: "
            "a worker of the tiny demo model started, and a streamed chat sent the moment it "
            "serves; cold with an empty weights cache (the version's files fetched and their "
            "hashes checked first), warm with them cached. Seconds from the worker's start, "
            "median (min–max).",
            "",
            "| weights | to `ready: serving` | to the first token |",
            "| --- | --- | --- |",
            *rows,
            "",
            f"Warm ÷ cold, to the first token: {warm / cold:.2f}. The tiny model's files are "
            f"{starts.model_bytes / 2**20:.0f} MiB, so fetching them costs little here: for a "
            "model of many gigabytes the cold rows grow by its download and hash time, and the "
            "engine's load by its weights.",
            *image_lines,
        ]
    )
    print(text)
    section_write(docs, "cold_start", text)
    results_write(
        docs,
        "cold_start",
        {
            "section": "cold_start",
            "summary": {
                "cold_first_token_s": cold,
                "warm_first_token_s": warm,
                "cold_ready_s": statistics.median(starts.ready["cold"]),
                "warm_ready_s": statistics.median(starts.ready["warm"]),
                **{
                    f"image_{key}_ready_s": statistics.median(starts.image[kind]["ready"])
                    for key, kind in zip(("first_start", "restart"), IMAGE_STARTS, strict=True)
                    if kind in starts.image
                },
            },
            "rounds": {"ready": starts.ready, "first_token": starts.first_token},
            "image": starts.image,
        },
    )


def _image_report(starts: Starts) -> list[str]:
    if not starts.image:
        return []
    rounds = len(next(iter(starts.image.values()))["ready"])

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"

    rows = [
        f"| {kind} | {cell(t['healthy'])} | {cell(t['ready'])} | {cell(t['first_token'])} |"
        for kind, t in starts.image.items()
    ]
    return [
        "",
        "### The image's start",
        "",
        f"The CPU image (`make image-build`), {rounds} round(s): the whole demo started inside it "
        "(platform/image/run.sh: its own user, a read-only root, /tmp a host folder), first on "
        "an empty /tmp (PostgreSQL initialised and migrated, the demo model built, then the "
        "frontend, the chat and embedding workers, the ingester and Celery started), then on "
        "the /tmp that start left (a pod restarted on its volume). Seconds from the container's "
        "start, median (min–max).",
        "",
        "| start | to the frontend's /healthz | to the whole demo ready | to the first token |",
        "| --- | --- | --- | --- |",
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-rounds", type=int, default=2)
    parser.add_argument("--no-image", action="store_true", help="skip the container image")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        starts = run(args, Path(tmp))
        if not args.no_image:
            run_image(args, Path(tmp), starts)
    report(starts, args.docs, args.rounds)


if __name__ == "__main__":
    main()
