"""A chat request's trip through the platform's code: which files it runs in, and how often
it comes back to one it had left.

A frontend is started with a profiler that records, while it is switched on, every call into
the platform's own code (the checkout's packages: not the libraries, not tests or bench) made
for one request: in the task that serves it and on the threads it hands work to (parsing,
templating, the database). One chat request is sent, whole and then streamed, on the tiny
demo model, after warm-up requests have filled the caches; the calls, in the order they
ran, give:

- files: how many of the platform's files the request runs in;
- stays: how many times it enters a file (calls within one file, one after another, are one
  stay);
- returns: the stays in a file it had been in before, the back and forth of the trip.

With `--base REV` the same is measured beside it on that commit's code (a git worktree, the
same engine, database and Valkey), so a change to the code's layout is measured as a ratio.
Writes its section of docs/benchmarks.md and a plot of both trips, file by file.

    .venv/bin/python bench/request_trip.py [--base REV] [--docs docs]
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    chat_request,
    free_port,
    http_ok,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    spawn,
    stop,
    wait_for,
    worktree_add,
    worktree_remove,
)

KINDS = ("whole", "streamed")
PROMPT = "Name three colours."
MAX_TOKENS = 8
SKIPPED = ("bench", "tests", ".venv", "node_modules")


# ------------------------------------------------------------------------- the traced frontend


_TRACED: contextvars.ContextVar[bool] = contextvars.ContextVar("traced", default=False)


class _Recorder:
    """Calls into the checkout's code while switched on (SIGUSR1 on, SIGUSR2 off and dump).

    The request is marked where the frontend's ASGI handler takes it: a context variable set
    in its task's context, which the tasks it starts inherit. On the event loop's thread only
    marked calls are kept (not the shared loops that run beside it); on other threads every
    call is, as only the request hands them work while the recorder is on.
    """

    def __init__(self, root: Path, out: Path) -> None:
        self.root = f"{root}{os.sep}"
        self.out = out
        self.on = False
        self.calls: list[tuple[int, str, str]] = []
        self._files: dict[str, str | None] = {}

    def _file(self, filename: str) -> str | None:
        """The checkout-relative path of a file of the platform's code, else None."""
        known = self._files.get(filename, "?")
        if known != "?":
            return known
        path = None
        if filename.startswith(self.root):
            relative = filename[len(self.root) :]
            if relative.endswith(".py") and not relative.startswith(SKIPPED):
                path = relative
        self._files[filename] = path
        return path

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        path = self._file(frame.f_code.co_filename)
        if path is None:
            return
        name = frame.f_code.co_qualname
        if threading.current_thread() is threading.main_thread():
            if name == "ApiHandler.__call__":
                _TRACED.set(True)
            elif not _TRACED.get():
                return
        self.calls.append((time.perf_counter_ns(), path, name))

    def start(self, *_: Any) -> None:
        self.calls, self.on = [], True

    def dump(self, *_: Any) -> None:
        self.on = False
        kept = [(path, name) for _, path, name in sorted(self.calls)]
        partial = self.out.with_suffix(".part")
        partial.write_text(json.dumps(kept))
        partial.rename(self.out)


def _serve(port: int, out: Path) -> None:
    """Run the platform's ASGI app under uvicorn with the recorder installed (this process)."""
    root = Path.cwd()  # the tree whose code is served: this checkout's, or a base commit's
    sys.path[:] = [str(root), *(p for p in sys.path if p != str(ROOT))]
    recorder = _Recorder(root, out)
    threading.setprofile(recorder.profile)
    sys.setprofile(recorder.profile)
    signal.signal(signal.SIGUSR1, recorder.start)
    signal.signal(signal.SIGUSR2, recorder.dump)
    import uvicorn

    uvicorn.run("config.asgi:application", host="127.0.0.1", port=port, log_level="warning",
                access_log=False)  # fmt: skip


# ------------------------------------------------------------------------------- measuring


@dataclass
class Trip:
    files: int
    stays: int
    returns: int
    path: list[str]  # the file of each stay, in order

    @classmethod
    def of(cls, calls: list[tuple[str, str]]) -> Trip:
        path: list[str] = []
        for file, _ in calls:
            if not path or path[-1] != file:
                path.append(file)
        seen: set[str] = set()
        returns = 0
        for file in path:
            returns += file in seen
            seen.add(file)
        return cls(files=len(seen), stays=len(path), returns=returns, path=path)


def _post(base_url: str, key: str, *, stream: bool) -> None:
    request = chat_request(
        base_url, key, model="tiny", content=PROMPT, max_tokens=MAX_TOKENS, stream=stream
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def _traced_frontend(
    tree: Path, env: dict[str, str], work: Path, name: str
) -> tuple[Any, str, Path]:
    port = free_port()
    out = work / f"{name}.trace.json"
    command = [sys.executable, str(ROOT / "bench" / "request_trip.py"), "--serve", str(port),
               "--trace", str(out)]  # fmt: skip
    log = work / f"{name}.log"
    process = spawn(command, log, {**env, "PYTHONPATH": str(tree)}, cwd=tree)
    base_url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_ok(f"{base_url}/healthz"), process, name, log)
    return process, base_url, out


def _measure(process: Any, base_url: str, out: Path, key: str, *, stream: bool) -> Trip:
    for _ in range(3):  # warm: keys, routes, the tokenizer, the reply reader
        _post(base_url, key, stream=stream)
    out.unlink(missing_ok=True)
    os.kill(process.pid, signal.SIGUSR1)
    time.sleep(0.2)
    _post(base_url, key, stream=stream)
    time.sleep(1.0)  # the request's end settles after its answer is sent
    os.kill(process.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no trace from {base_url}")
        time.sleep(0.1)
    return Trip.of([tuple(call) for call in json.loads(out.read_text())])


def run(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Trip]]:
    from models_registry.demo_model import demo_model_build

    progress("building the tiny demo model")
    model_dir = demo_model_build(out_dir=work / "model")
    trees = {"now": ROOT}
    if args.base:
        progress(f"checking out {args.base} beside the working tree")
        trees = {"base": worktree_add(args.base, work), **trees}
    trips: dict[str, dict[str, Trip]] = {}
    platform = None
    try:
        platform = prepare_roundhouse(model_dir, work, tenants={"bench": {}}, max_num_seqs=4)
        key = platform.tokens["bench"]
        with roundhouse_stack(platform, work / "stack"):
            for name, tree in trees.items():
                progress(f"starting a traced frontend on the {name} code")
                process, base_url, out = _traced_frontend(tree, platform.env, work, name)
                try:
                    trips[name] = {
                        kind: _measure(process, base_url, out, key, stream=kind == "streamed")
                        for kind in KINDS
                    }
                finally:
                    stop([process])
    finally:
        platform_stop(platform)
        if args.base:
            worktree_remove(work / "base")
    return trips


# --------------------------------------------------------------------------------- report


def _plot(trips: dict[str, dict[str, Trip]], docs: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(trips)
    figure, axes = plt.subplots(len(names), 1, figsize=(12, 4.2 * len(names)), squeeze=False)
    for axis, name in zip(axes[:, 0], names, strict=True):
        path = trips[name]["whole"].path
        files = list(dict.fromkeys(path))  # first entered first
        axis.step(range(len(path)), [files.index(f) for f in path], where="post", lw=1.2)
        axis.set_yticks(range(len(files)), files, fontsize=6)
        axis.invert_yaxis()
        trip = trips[name]["whole"]
        axis.set_title(f"{name}: {trip.files} files, {trip.stays} stays, {trip.returns} returns")
        axis.set_xlabel("stay (a run of calls in one file), in the order the request ran")
    figure.tight_layout()
    out = plot_path(docs, "request_trip")
    figure.savefig(out, dpi=110)
    return out


def report(trips: dict[str, dict[str, Trip]], docs: Path, base: str | None) -> None:
    rows = []
    for kind in KINDS:
        for name in trips:
            trip = trips[name][kind]
            rows.append(f"| {kind} | {name} | {trip.files} | {trip.stays} | {trip.returns} |")
    ratios = []
    if "base" in trips:
        for kind in KINDS:
            now, before = trips["now"][kind], trips["base"][kind]
            ratios.append(
                f"| {kind} | {now.files / before.files:.2f} | {now.stays / before.stays:.2f} | "
                f"{now.returns / before.returns:.2f} |"
            )
    plot = _plot(trips, docs)
    lines = [
        "## A chat request's trip through the code",
        "",
        "`bench/request_trip.py`: one chat request on the tiny demo model, after warm-up, with a "
        "profiler on in its frontend that records each call into the platform's own code made "
        "for it (its task and the threads it hands work to). files: the platform files it runs "
        "in; stays: entries into a file (calls within one file in a row are one stay); returns: "
        "stays in a file it had left before."
        + (f" `base` is commit `{base}`, measured beside the working tree." if base else ""),
        "",
        "| request | code | files | stays | returns |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ]
    if ratios:
        lines += ["", "| request | files now/base | stays now/base | returns now/base |",
                  "| --- | --- | --- | --- |", *ratios]  # fmt: skip
    lines += ["", f"![A whole chat request's stays, file by file](img/{plot.name})"]
    text = "\n".join(lines)
    print(text)
    section_write(docs, "request_trip", text)
    summary: dict[str, float] = {}
    for kind in KINDS:
        for k in ("files", "stays", "returns"):
            summary[f"{kind}_{k}"] = getattr(trips["now"][kind], k)
            if "base" in trips:
                summary[f"{kind}_{k}_now_over_base"] = getattr(trips["now"][kind], k) / getattr(
                    trips["base"][kind], k
                )
    results_write(
        docs,
        "request_trip",
        {
            "section": "request_trip",
            "summary": summary,
            "trips": {n: {k: vars(t) for k, t in v.items()} for n, v in trips.items()},
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="a commit to measure beside the working tree")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--trace", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.trace)
        return
    with tempfile.TemporaryDirectory(prefix="request-trip-") as tmp:
        trips = run(args, Path(tmp))
    report(trips, args.docs, args.base)


if __name__ == "__main__":
    main()
