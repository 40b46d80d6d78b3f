"""Load: the locust scenario (bench/locustfile.py) against a platform started here.

Starts what bench/admission.py starts (embedded PostgreSQL and Valkey, the tiny demo model
deployed with 32 engine slots, a frontend, a worker and the usage ingester), creates three
tenants with different shares of the users and different quotas, and runs locust headless
against it:

- acme: half the users, priority weight 2, generous limits;
- globex: a third of the users, priority weight 1, generous limits;
- initech: a sixth of the users, 20 requests a minute and 2 concurrent requests, so some of
  its requests are refused with 429s (reported by the scenario as REFUSED, not failures).

With --embeddings, all-MiniLM-L6-v2 is deployed too (its own worker) and users also embed.

    .venv/bin/python bench/load.py [--users 30] [--spawn-rate 5] [--seconds 120] [--embeddings]
    .venv/bin/python bench/load.py --url https://roundhouse.example.com   # ROUNDHOUSE_KEYS set

With --url nothing is started: the scenario runs against that deployment with the keys in
ROUNDHOUSE_KEYS (and ROUNDHOUSE_MODEL, ROUNDHOUSE_EMBEDDING_MODEL), and the summary is printed
only. Otherwise writes its section of docs/benchmarks.md, docs/img/load.png and
docs/bench-data/load.json. Exits 1 when a request failed (a refusal is not a failure).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Platform,
    cpu_seconds,
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
)

MAX_NUM_SEQS = 32
EMBEDDING_MODEL = "minilm"
# Tenant: (share of the users, quota fields over the unlimited defaults).
TENANTS: dict[str, tuple[int, dict[str, Any]]] = {
    "acme": (3, {"priority_weight": 2}),
    "globex": (2, {"priority_weight": 1}),
    "initech": (1, {"requests_per_minute": 20, "max_concurrency": 2, "priority_weight": 1}),
}


@dataclass
class Row:
    """One line of locust's statistics."""

    type: str
    name: str
    count: int
    failures: int
    rps: float
    fps: float  # failures per second
    p50: float
    p95: float
    p99: float

    @property
    def tenant(self) -> str:
        return self.name.split(" ", 1)[0]


def _rows(stats_csv: Path) -> list[Row]:
    rows = []
    with stats_csv.open() as f:
        for r in csv.DictReader(f):
            rows.append(
                Row(
                    type=r["Type"],
                    name=r["Name"],
                    count=int(r["Request Count"]),
                    failures=int(r["Failure Count"]),
                    rps=float(r["Requests/s"]),
                    fps=float(r["Failures/s"]),
                    p50=_ms(r["50%"]),
                    p95=_ms(r["95%"]),
                    p99=_ms(r["99%"]),
                )
            )
    return rows


def _ms(value: str) -> float:
    return float(value) if value not in ("", "N/A") else float("nan")


def _locust(
    url: str,
    keys: str,
    model: str,
    embedding_model: str,
    args: argparse.Namespace,
    out: Path,
    cpus: str | None = None,
) -> tuple[int, list[Row]]:
    """Run the scenario headless; return locust's exit status and its final statistics."""
    env = {
        **os.environ,
        "ROUNDHOUSE_URL": url,
        "ROUNDHOUSE_KEYS": keys,
        "ROUNDHOUSE_MODEL": model,
        "ROUNDHOUSE_EMBEDDING_MODEL": embedding_model,
        "ROUNDHOUSE_THINK_SECONDS": args.think,
    }
    prefix = out / "locust"
    command = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py"),
        "--headless", "--only-summary", "--host", url,
        "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{args.seconds}s",
        "--stop-timeout", "30", "--csv", str(prefix), "--csv-full-history",
    ]  # fmt: skip
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    log = out / "locust.log"
    popen = spawn(command, log, env)
    started = time.monotonic()
    next_report = started + args.progress_every
    try:
        while popen.poll() is None:
            time.sleep(1)
            if time.monotonic() >= next_report:
                next_report += args.progress_every
                _progress(prefix, time.monotonic() - started)
    finally:
        stop([popen])
    if not Path(f"{prefix}_stats.csv").exists():
        raise SystemExit(f"locust wrote no statistics:\n{log.read_text(errors='replace')[-3000:]}")
    return popen.returncode, _rows(Path(f"{prefix}_stats.csv"))


def _progress(prefix: Path, elapsed: float) -> None:
    path = Path(f"{prefix}_stats.csv")
    if not path.exists():
        return
    rows = [r for r in _rows(path) if r.name != "Aggregated"]
    failed = sum(r.failures for r in rows if r.type != "TTFT")
    served = sum(r.count for r in rows if r.type == "POST") - failed
    refused = sum(r.count for r in rows if r.type == "REFUSED")
    ttft = ", ".join(f"{r.tenant} {r.p50:.0f}" for r in rows if r.type == "TTFT")
    progress(
        f"t={elapsed:4.0f}s requests {served + refused + failed:,} (served {served:,}, refused "
        f"{refused:,}, failed {failed:,}); chat TTFT p50 ms: {ttft or '-'}"
    )


def _tenant_table(rows: list[Row], users: dict[str, int], quotas: dict[str, str]) -> str:
    by_tenant: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.name != "Aggregated":
            by_tenant[r.tenant].append(r)
    lines = [
        "| tenant | users | quota | served req/s | refused req/s (codes) | failures "
        "| chat TTFT p50 / p95 / p99 (ms) | chat stream p50 / p99 (ms) "
        "| completion p50 / p99 (ms) |",
        "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for tenant, tenant_rows in sorted(by_tenant.items()):
        served = [r for r in tenant_rows if r.type == "POST"]
        refused = [r for r in tenant_rows if r.type == "REFUSED"]
        codes = ", ".join(f"{r.name.split(' ', 1)[1]}: {r.count}" for r in refused)
        ttft = _named(tenant_rows, "TTFT", f"{tenant} chat stream")
        stream = _named(tenant_rows, "POST", f"{tenant} chat stream")
        completion = _named(tenant_rows, "POST", f"{tenant} completion")
        lines.append(
            f"| {tenant} | {users.get(tenant, '?')} | {quotas.get(tenant, '')} "
            f"| {sum(r.rps - r.fps for r in served):.2f} "
            f"| {sum(r.rps for r in refused):.2f}{f' ({codes})' if codes else ''} "
            f"| {sum(r.failures for r in tenant_rows if r.type != 'TTFT')} "
            f"| {ttft.p50:.0f} / {ttft.p95:.0f} / {ttft.p99:.0f} "
            f"| {stream.p50:.0f} / {stream.p99:.0f} | {completion.p50:.0f} / {completion.p99:.0f} |"
        )
    return "\n".join(lines)


def _named(rows: list[Row], type_: str, name: str) -> Row:
    nan = float("nan")
    return next(
        (r for r in rows if r.type == type_ and r.name == name),
        Row(type_, name, 0, 0, 0.0, 0.0, nan, nan, nan),
    )


def _stats_table(rows: list[Row]) -> str:
    lines = [
        "| type | name | requests | failures | req/s | p50 (ms) | p95 (ms) | p99 (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    # Locust's "Aggregated" line would add the TTFT entries to the requests: left out.
    for r in rows:
        if r.name == "Aggregated":
            continue
        lines.append(
            f"| {r.type} | {r.name} | {r.count:,} | {r.failures:,} | {r.rps:.2f} "
            f"| {r.p50:.0f} | {r.p95:.0f} | {r.p99:.0f} |"
        )
    return "\n".join(lines)


def _cpu_table(used: dict[str, float], seconds: float) -> str:
    lines = ["| process | CPU (% of one core) |", "| --- | ---: |"]
    lines += [f"| {name} | {100 * s / seconds:.0f} |" for name, s in used.items()]
    return "\n".join(lines)


def _plot(history_csv: Path, path: Path) -> None:
    """Requests/s by outcome and each tenant's TTFT over the run, from locust's history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with history_csv.open() as f:
        history = list(csv.DictReader(f))
    if not history:
        return
    t0 = int(history[0]["Timestamp"])
    served: dict[int, float] = defaultdict(float)
    refused: dict[int, float] = defaultdict(float)
    failed: dict[int, float] = defaultdict(float)
    users: dict[int, int] = {}
    ttft: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in history:
        t = int(r["Timestamp"]) - t0
        users[t] = int(r["User Count"])
        if r["Name"] == "Aggregated":
            continue
        rps, fps = float(r["Requests/s"]), float(r["Failures/s"])
        if r["Type"] == "POST":
            served[t] += rps - fps
            failed[t] += fps
        elif r["Type"] == "REFUSED":
            refused[t] += rps
        elif r["Type"] == "TTFT" and r["50%"] not in ("", "N/A"):
            ttft[r["Name"].split(" ", 1)[0]].append((t, float(r["50%"]), float(r["95%"])))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    ts = sorted(users)
    for label, series in (("served", served), ("refused", refused), ("failed", failed)):
        left.plot(ts, [series.get(t, 0.0) for t in ts], label=label)
    left.set(xlabel="s", ylabel="requests/s", title="Requests by outcome")
    twin = left.twinx()
    twin.plot(ts, [users[t] for t in ts], color="grey", linestyle=":", label="users")
    twin.set(ylabel="users")
    left.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    for tenant, points in sorted(ttft.items()):
        line = right.plot([p[0] for p in points], [p[1] for p in points], label=f"{tenant} p50")
        right.plot(
            [p[0] for p in points],
            [p[2] for p in points],
            color=line[0].get_color(),
            linestyle="--",
            label=f"{tenant} p95",
        )
    right.set_yscale("log")
    right.set(xlabel="s", ylabel="ms (log)", title="Chat stream time to first token")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _results(
    rows: list[Row],
    users: dict[str, int],
    used: dict[str, float],
    elapsed: float,
    args: argparse.Namespace,
) -> dict[str, object]:
    """Return what docs/bench-data/load.json keeps: headline figures and locust's statistics."""
    rows = [r for r in rows if r.name != "Aggregated"]
    served = [r for r in rows if r.type == "POST"]
    ttft = {r.tenant: r for r in rows if r.type == "TTFT"}
    scenario = f"{args.users} users of {len(TENANTS)} tenants, {args.seconds} s"
    headline = [
        {
            "measure": f"Load: failed requests ({scenario})",
            "value": sum(r.failures for r in rows),
            "target": "≤ 0",
        },
        {"measure": "Load: requests/s served", "value": sum(r.rps - r.fps for r in served)},
        {
            "measure": "Load: requests/s refused by tenants' quotas",
            "value": sum(r.rps for r in rows if r.type == "REFUSED"),
        },
        {
            "measure": "Load: chat TTFT p50 / p99 by tenant (ms)",
            "value": ", ".join(f"{t} {r.p50:.0f} / {r.p99:.0f}" for t, r in sorted(ttft.items())),
        },
    ]
    return {
        "section": "load",
        "settings": {
            "cpu_count": os.cpu_count(),
            "max_num_seqs": MAX_NUM_SEQS,
            "users": users,
            "spawn_rate": args.spawn_rate,
            "seconds": args.seconds,
            "think_seconds": args.think,
            "embeddings": args.embeddings,
            "tenants": {slug: quota for slug, (_share, quota) in TENANTS.items()},
        },
        "headline": headline,
        "cores": {name: seconds / elapsed for name, seconds in used.items()},
        "stats": [
            {
                "type": r.type,
                "name": r.name,
                "requests": r.count,
                "failures": r.failures,
                "rps": r.rps,
                "p50_ms": r.p50,
                "p95_ms": r.p95,
                "p99_ms": r.p99,
            }
            for r in rows
        ],
    }


def _warm_up(base_url: str, model: str, tokens: dict[str, str]) -> None:
    """Send each tenant's first request before the clock starts.

    A tenant's first request loads its key, quota and month's spend into the frontend's caches
    and Redis; it should not stand for the steady state in the percentiles.
    """
    for token in tokens.values():
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        request = urllib.request.Request(
            f"{base_url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()


def _deploy_encoder(platform: Platform, work: Path) -> subprocess.Popen[bytes]:
    """Register all-MiniLM-L6-v2 behind an alias, deploy it and start its worker on core 0."""
    from models_registry.packaged import minilm_dir
    from models_registry.services import alias_set, deployment_create, model_version_register

    version, _ = model_version_register(
        model_name="all-minilm-l6-v2", source_dir=minilm_dir(), task="embedding"
    )
    alias_set(name=EMBEDDING_MODEL, version=version)
    deployment_create(name=EMBEDDING_MODEL, version=version, dtype="auto", max_queued=1024)
    log = work / "encoder.log"
    worker = spawn(
        ["taskset", "-c", "0", sys.executable, "manage.py", "run_worker",
         "--deployment", EMBEDDING_MODEL],
        log,
        platform.env,
    )  # fmt: skip
    wait_for(lambda: b"ready: serving" in log.read_bytes(), worker, "encoder worker", log)
    return worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--spawn-rate", type=float, default=5.0, help="users started per second")
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--think", default="1-5", help="seconds a user pauses, low-high")
    parser.add_argument("--embeddings", action="store_true", help="deploy an encoder too")
    parser.add_argument("--url", help="an existing deployment: start nothing here")
    parser.add_argument("--progress-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-load-"))
    try:
        if args.url:
            status, rows = _locust(
                args.url,
                os.environ.get("ROUNDHOUSE_KEYS", ""),
                os.environ.get("ROUNDHOUSE_MODEL", "tiny-chat"),
                os.environ.get("ROUNDHOUSE_EMBEDDING_MODEL", ""),
                args,
                work,
            )
            print("\n" + _tenant_table(rows, {}, {}) + "\n\n" + _stats_table(rows))
        else:
            status, rows = _local(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failures = sum(r.failures for r in rows if r.name == "Aggregated")
    if status != 0 or failures:
        progress(f"locust exited with {status}; {failures} failed requests")
        raise SystemExit(1)


def _local(args: argparse.Namespace, work: Path) -> tuple[int, list[Row]]:
    from models_registry.demo_model import demo_model_build

    progress("building the tiny demo model")
    model_dir = demo_model_build(out_dir=work / "model")
    platform: Platform | None = None
    encoder: subprocess.Popen[bytes] | None = None
    try:
        platform = prepare_roundhouse(
            model_dir,
            work,
            tenants={slug: quota for slug, (_share, quota) in TENANTS.items()},
            max_num_seqs=MAX_NUM_SEQS,
        )
        if args.embeddings:
            encoder = _deploy_encoder(platform, work)
        shares = sum(share for share, _ in TENANTS.values())
        users = {t: round(args.users * share / shares) for t, (share, _) in TENANTS.items()}
        keys = ",".join(
            f"{slug}:{platform.tokens[slug]}:{share}" for slug, (share, _) in TENANTS.items()
        )
        with roundhouse_stack(platform, work / "sy", engine_cpus="0", platform_cpus="1") as target:
            processes = dict(target.processes)
            if encoder is not None:
                processes["encoder worker"] = psutil.Process(encoder.pid)
            _warm_up(target.base_url, target.model, platform.tokens)
            before = cpu_seconds(processes)
            started = time.monotonic()
            progress(
                f"locust: {args.users} users ({', '.join(f'{t} {n}' for t, n in users.items())}),"
                f" {args.spawn_rate:g}/s spawn rate, {args.seconds}s"
            )
            status, rows = _locust(
                target.base_url,
                keys,
                target.model,
                EMBEDDING_MODEL if encoder is not None else "",
                args,
                work,
                # The engines on core 0; the frontend, ingester and locust on core 1.
                cpus="1",
            )
            elapsed = time.monotonic() - started
            after = cpu_seconds(processes)
            history = work / "locust_stats_history.csv"
            args.docs.mkdir(parents=True, exist_ok=True)
            _plot(history, plot_path(args.docs, "load"))
    finally:
        if encoder is not None:
            stop([encoder])
        platform_stop(platform)
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    quotas = {
        slug: ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in quota.items())
        for slug, (_share, quota) in TENANTS.items()
    }
    tenants = _tenant_table(rows, users, quotas)
    tasks = 11 if args.embeddings else 9
    stats, cpu = _stats_table(rows), _cpu_table(used, elapsed)
    print("\n".join(["", tenants, "", stats, "", cpu]))
    section_write(
        args.docs,
        "load",
        "## Load: mixed tenants, streaming (locust)\n\n"
        f"`bench/load.py --users {args.users} --seconds {args.seconds}"
        f"{' --embeddings' if args.embeddings else ''}`, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores, tiny Llama demo model ({MAX_NUM_SEQS} engine slots, "
        "eager mode). The scenario is `bench/locustfile.py`: each user streams a chat turn "
        f"(6 in {tasks} tasks, 16–128 tokens, sometimes a follow-up in the same conversation), "
        f"asks for a non-streamed completion (3 in {tasks}, 16–64 tokens)"
        + (" or embeds three sentences (2 in 11)" if args.embeddings else "")
        + f", and pauses {args.think} s between requests. Users start at {args.spawn_rate:g}/s. "
        "Refusals (429 and 503 with the platform's codes) are counted apart from failures. "
        "The engine runs on core 0; the frontend, ingester and locust on core 1. Locust's "
        "percentiles are rounded to two significant digits.\n\n"
        + tenants
        + "\n\n"
        + stats
        + "\n\nCPU used by each platform process over the run:\n\n"
        + cpu
        + "\n\n![load](img/load.png)\n",
    )
    results_write(args.docs, "load", _results(rows, users, used, elapsed, args))
    progress(f"wrote {args.docs / 'benchmarks.md'} and {args.docs / 'img' / 'load.png'}")
    return status, rows


if __name__ == "__main__":
    main()
