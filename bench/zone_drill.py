"""Zone-loss drill: every host of zone A killed at once under streaming load.

Two zones on this machine, each host a loopback address of its own: zone A has a frontend
(127.0.0.2) and a worker (127.0.0.3), zone B a frontend (127.0.0.4), a worker (127.0.0.5) and
the usage ingester. PostgreSQL and Valkey stand for the regional services (a managed database
and a cluster with replicas in every zone), outside the drill. Clients stream chat completions
through the frontend of their own zone, as a zonal load balancer sends them, and fail over to
the other zone when theirs does not answer; a stream whose frontend dies is resumed on the
other one with Last-Event-ID, each token once.

After a warm-up the drill kills both hosts of zone A (their whole process groups) and reports,
second by second: streams completed, refused (503), broken and resumed, ended with an error,
and the autoscaling signal's desired replicas (dataplane.autoscale, from the queue). Recovery is
the time from the kill until completions are back to 80 % of their rate before it. At the end
every accepted request is looked up in PostgreSQL: each must have exactly one usage record.

Writes its section of docs/benchmarks.md, docs/img/zone_drill.png and
docs/bench-data/zone_drill.json.

    .venv/bin/python bench/zone_drill.py [--clients 6] [--before 20] [--after 30]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    free_port,
    http_ok,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    section_write,
    spawn,
    stop,
    wait_for,
)

ZONES = {"a": ("127.0.0.2", "127.0.0.3"), "b": ("127.0.0.4", "127.0.0.5")}
EVENTS = ("completed", "refused", "resumed", "failed")


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    desired: list[tuple[float, int]] = field(default_factory=list)
    accepted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, request_id: str | None = None) -> None:
        with self.lock:
            self.events.append((time.monotonic() - self.started, kind))
            if request_id:
                self.accepted.add(request_id)

    def per_second(self, seconds: int) -> list[dict[str, int]]:
        rows = [dict.fromkeys(EVENTS, 0) for _ in range(seconds)]
        for at, kind in self.events:
            if int(at) < seconds:
                rows[int(at)][kind] += 1
        return rows


def _events(lines: list[str]) -> tuple[str, dict[str, Any] | None, bool]:
    """The last event id, the last data object, and whether [DONE] came."""
    last_id, last, done = "", None, False
    for line in lines:
        if line.startswith("id: "):
            last_id = line[4:]
        elif line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            last = json.loads(line[6:])
    return last_id, last, done


def _ended(last: dict[str, Any] | None) -> str:
    if last is None:
        return "failed"
    return "failed" if "error" in last else "completed"


def _one(home: str, other: str, key: str, timeline: Timeline, n: int) -> None:
    """One streamed chat: through the home zone's frontend, else the other's; resumed there."""
    auth = {"Authorization": f"Bearer {key}"}
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"drill {n}"}],
        "max_tokens": 48,
        "ignore_eos": True,
        "stream": True,
    }
    for base in (home, other):
        lines: list[str] = []
        rid = None
        try:
            with (
                httpx.Client(base_url=base, timeout=httpx.Timeout(60, connect=1)) as client,
                client.stream("POST", "/v1/chat/completions", json=body, headers=auth) as r,
            ):
                rid = r.headers.get("x-request-id")
                if r.status_code != 200:
                    r.read()
                    timeline.add("refused")
                    time.sleep(0.2)
                    return
                for line in r.iter_lines():
                    lines.append(line)
        except httpx.ConnectError:
            continue  # that zone is gone: the load balancer sends the client to the other
        except httpx.HTTPError:
            pass  # the stream broke: resumed below
        last_id, last, done = _events(lines)
        if done:
            timeline.add(_ended(last), rid)
            return
        if rid is None:
            continue
        # Resume on the other zone's frontend from the last event seen.
        resume_base = other if base == home else home
        headers = {**auth, **({"Last-Event-ID": last_id} if last_id else {})}
        try:
            with httpx.Client(base_url=resume_base, timeout=60) as client:
                rest = client.get(f"/v1/requests/{rid}/stream", headers=headers)
            _, tail, done = _events(rest.text.splitlines())
        except httpx.HTTPError:
            tail, done = None, False
        timeline.add("resumed", rid)
        timeline.add(_ended(tail) if done else "failed", rid)
        return
    timeline.add("refused")
    time.sleep(0.2)


def _watch(timeline: Timeline, stop_at: float, stopping: threading.Event) -> None:
    """Sample the autoscaling signal's desired replicas once a second."""
    from dataplane.autoscale import ScalingPolicy, replicas_needed
    from dataplane.redis_client import redis_sync_client
    from dataplane.snapshots import queue_snapshot_sync

    client = redis_sync_client()
    policy = ScalingPolicy(target_wait_seconds=2.0, min_replicas=1, max_replicas=8)
    while not stopping.is_set() and time.monotonic() < stop_at:
        snapshot = queue_snapshot_sync(client, "tiny")
        timeline.desired.append(
            (time.monotonic() - timeline.started, replicas_needed(snapshot, policy))
        )
        time.sleep(1.0)


def _log_says(log: Path, text: bytes) -> Callable[[], bool]:
    return lambda: text in log.read_bytes()


def _answers(url: str) -> Callable[[], bool]:
    return lambda: http_ok(url)


def _usage_records(request_ids: set[str]) -> collections.Counter[str]:
    from billing.models import UsageRecord

    return collections.Counter(
        UsageRecord.objects.filter(request_id__in=request_ids).values_list("request_id", flat=True)
    )


def _table(rows: list[dict[str, int]], desired: dict[int, int], killed_at: int) -> str:
    lines = [
        "| second | completed | refused (503) | broken, resumed | ended with an error "
        "| desired replicas |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for second, row in enumerate(rows):
        if second < killed_at - 3:
            continue
        mark = " (zone A killed)" if second == killed_at else ""
        lines.append(
            f"| {second - killed_at:+d}{mark} | {row['completed']} | {row['refused']} | "
            f"{row['resumed']} | {row['failed']} | {desired.get(second, '')} |"
        )
    return "\n".join(lines)


def _plot(rows: list[dict[str, int]], desired: dict[int, int], killed_at: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = [s - killed_at for s in range(len(rows))]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for kind, label in (
        ("completed", "completed"),
        ("refused", "refused (503)"),
        ("resumed", "broken, resumed"),
        ("failed", "ended with an error"),
    ):
        ax.plot(seconds, [r[kind] for r in rows], label=label, drawstyle="steps-mid")
    ax.axvline(0, color="red", linestyle="--", label="zone A killed")
    ax.set_xlabel("seconds from the kill")
    ax.set_ylabel("streams per second")
    ax2 = ax.twinx()
    ax2.plot(
        [s - killed_at for s in sorted(desired)],
        [desired[s] for s in sorted(desired)],
        color="black",
        linestyle=":",
        label="desired replicas",
    )
    ax2.set_ylabel("desired replicas")
    ax2.set_ylim(0, max(desired.values(), default=1) + 1)
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], loc="upper right", fontsize=8)
    ax.set_title("Zone-loss drill: zone A's frontend and worker killed at once")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # More clients than both workers' slots (2 x 8): requests queue, so the autoscaling
    # signal sees the capacity lost.
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--before", type=int, default=20, help="seconds of load before the kill")
    parser.add_argument("--after", type=int, default=30, help="seconds of load after it")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform = None
    popens: dict[str, Any] = {}
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(model_dir, work, tenants={"drill": {}}, max_num_seqs=8)
        py = sys.executable
        ports: dict[str, int] = {}
        for core, (zone, (frontend, worker)) in enumerate(ZONES.items()):
            env = {**platform.env, "ROUNDHOUSE_ZONE": zone}
            ports[zone] = free_port()
            popens[f"frontend-{zone}"] = spawn(
                [py, "-m", "uvicorn", "config.asgi:application", "--host", frontend,
                 "--port", str(ports[zone]), "--no-access-log", "--log-level", "warning"],
                work / f"frontend-{zone}.log",
                {**env, "ROUNDHOUSE_BIND_ADDRESS": frontend, "ROUNDHOUSE_HOST_NAME": frontend},
            )  # fmt: skip
            # Each zone's engine on a core of its own (the rest share both cores).
            popens[f"worker-{zone}"] = spawn(
                [py, "manage.py", "run_worker", "--deployment", "tiny"],
                work / f"worker-{zone}.log",
                {
                    **env,
                    "ROUNDHOUSE_BIND_ADDRESS": worker,
                    "ROUNDHOUSE_HOST_NAME": worker,
                    "VLLM_CPU_OMP_THREADS_BIND": str(core % (os.cpu_count() or 1)),
                },
            )
        popens["ingester-b"] = spawn(
            [py, "manage.py", "run_ingester"], work / "ingester-b.log", platform.env
        )
        urls = {zone: f"http://{ZONES[zone][0]}:{ports[zone]}" for zone in ZONES}
        for zone in ZONES:
            log = work / f"worker-{zone}.log"
            progress(f"waiting for zone {zone}'s worker")
            wait_for(_log_says(log, b"ready: serving"), popens[f"worker-{zone}"],
                     f"worker-{zone}", log)  # fmt: skip
            wait_for(_answers(f"{urls[zone]}/healthz"), popens[f"frontend-{zone}"],
                     f"frontend-{zone}", work / f"frontend-{zone}.log")  # fmt: skip
        timeline = Timeline()
        stopping = threading.Event()
        total = args.before + args.after
        stop_at = timeline.started + total
        key = platform.tokens["drill"]

        def client(n: int) -> None:
            home, other = ("a", "b") if n % 2 == 0 else ("b", "a")
            i = 0
            while not stopping.is_set() and time.monotonic() < stop_at:
                _one(urls[home], urls[other], key, timeline, n * 100_000 + i)
                i += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
        threads.append(threading.Thread(target=_watch, args=(timeline, stop_at, stopping)))
        for thread in threads:
            thread.start()
        progress(f"load on both zones for {args.before} s")
        time.sleep(max(0.0, timeline.started + args.before - time.monotonic()))
        killed_at = int(time.monotonic() - timeline.started)
        progress("killing zone A: its frontend and its worker, whole process groups")
        for name in ("frontend-a", "worker-a"):
            os.killpg(popens[name].pid, signal.SIGKILL)
        for second in range(args.after):
            if second % 10 == 0:
                progress(f"{second} s after the kill")
            time.sleep(1.0)
        stopping.set()
        for thread in threads:
            thread.join(timeout=120)
        progress("checking every accepted request's usage record")
        deadline = time.monotonic() + 60
        while True:
            billed = _usage_records(timeline.accepted)
            if len(billed) >= len(timeline.accepted) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        stop(list(popens.values()))
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)

    rows = timeline.per_second(total)
    desired = {int(at): n for at, n in timeline.desired}
    before = rows[max(0, killed_at - 15) : killed_at]
    rate = sum(r["completed"] for r in before) / max(1, len(before))
    tail = sorted(r["completed"] for r in rows[-10:])
    steady = tail[len(tail) // 2]  # the surviving zone's rate: the median of the last 10 s
    # Recovered: from this second on, no refusal, break or error, and completions at 80 % of
    # the surviving zone's steady rate.
    recovered = next(
        (
            s - killed_at
            for s in range(killed_at, total)
            if rows[s]["completed"] >= 0.8 * steady
            and all(r["refused"] + r["resumed"] + r["failed"] == 0 for r in rows[s:])
        ),
        None,
    )
    desired_before = max((n for s, n in desired.items() if s < killed_at), default=0)
    desired_after = max((n for s, n in desired.items() if s >= killed_at), default=0)
    unaccounted = len(timeline.accepted - set(billed))
    twice = sum(1 for n in billed.values() if n > 1)
    counts = {kind: sum(r[kind] for r in rows[killed_at:]) for kind in EVENTS}
    progress(
        f"recovered after {recovered} s; {len(timeline.accepted)} accepted, "
        f"{unaccounted} without a usage record, {twice} billed twice; after the kill: {counts}"
    )
    plot = plot_path(args.docs, "zone_drill")
    _plot(rows, desired, killed_at, plot)
    results_write(
        args.docs,
        "zone_drill",
        {
            "section": "zone_drill",
            "headline": [
                {
                    "measure": "Zone-loss drill: seconds from the kill until the surviving "
                    "zone serves steadily (no refusal, break or error)",
                    "value": "not within the run" if recovered is None else recovered,
                },
                {
                    "measure": "Zone-loss drill: accepted requests without exactly one usage "
                    "record",
                    "value": unaccounted + twice,
                    "target": "≤ 0",
                },
            ],
            "per_second": rows,
            "desired_replicas": desired,
            "killed_at": killed_at,
            "accepted": len(timeline.accepted),
        },
    )
    text = f"""
## Zone-loss drill

`bench/zone_drill.py`: two zones on this machine, each host a loopback address of its own
(zone A: a frontend and a worker; zone B: a frontend, a worker and the usage ingester), and
{args.clients} clients streaming 48-token chat completions through the frontend of their own
zone, failing over to the other zone when theirs does not answer, and resuming a broken stream
there with `Last-Event-ID`. After {args.before} s both hosts of zone A are killed at once
(their whole process groups). Per second, from three seconds before the kill:

{_table(rows, desired, killed_at)}

![Zone-loss drill timeline](img/zone_drill.png)

The platform was serving steadily again, with no refusal, break or error from then on,
{"never within the run" if recovered is None else f"{recovered} s after the kill"}. After the
kill {counts["resumed"]} streams broke with zone A's frontend and were resumed on zone B's,
{counts["failed"]} ended with an error (the ones zone A's worker was running: `worker_lost`
once the reaper saw their leases lapse, billed for what they had made) and
{counts["refused"]} were refused. Of {len(timeline.accepted)} accepted requests,
{unaccounted} have no usage record and {twice} have more than one. The autoscaling signal
asked for at most {desired_before} replicas before the kill and {desired_after} after it.

What this machine cannot show is capacity: completions went from {rate:.1f} a second before
the kill to {steady} after it, because both zones' processes (and the 24 clients) share two
cores, and killing zone A freed the CPU its frontend and engine used. On machines of their own
the surviving zone would serve about half. See [scale-out.md](scale-out.md#losing-a-zone).
"""
    section_write(args.docs, "zone_drill", text)
    progress(f"wrote {args.docs / 'benchmarks.md'} and {plot}")


if __name__ == "__main__":
    main()
