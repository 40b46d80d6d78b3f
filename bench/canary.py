"""Canary drill: a healthy canary left running, then a real breach and its rollback.

On this machine: one frontend, the usage ingester, and two workers of the demo model, the
baseline's (8 sequences at a time) and a canary version's registered with one sequence at a
time. A rollout sends half of an alias's users to the canary with the default policy (an SLO
burning 6 times its budget and twice as fast as the baseline's over a 10 s window in three
analyses in a row, and over a 60 s window at the last) and a step that never ends; this
script analyses every 10 s as Celery beat does.

- Healthy: `--clients` clients (1) send 32-token chats one after another for `--minutes`
  (20). The canary keeps up; every rollback here would be a false one.
- Breach: then `--breach-clients` (24) at once. The canary, one sequence at a time, queues
  its half and its first tokens come later than the TTFT objective (2 s), while the
  baseline's engine batches its half. Measured: seconds from the load rising to the rollback
  decision, and to rollback complete (every frontend routes the canary's users to the
  baseline again); requests that failed meanwhile (a rollback must drop none).

Writes its section of docs/benchmarks.md, docs/img/canary.png and docs/bench-data/canary.json.

    .venv/bin/python bench/canary.py [--minutes 20] [--clients 1] [--breach-clients 24]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    KV_CACHE_BYTES,
    MAX_MODEL_LEN,
    percentile,
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

ALIAS = "drill-chat"
ANALYSIS_SECONDS = 10.0


class Load:
    """Closed-loop clients on the alias; each answer's version, status and time are kept."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url, self.key = base_url, key
        self.clients = 0
        self.wanted = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.started = time.monotonic()
        # (seconds since the start, version, status, request seconds)
        self.answers: list[tuple[float, str, int, float]] = []
        self.users = itertools.count()

    def grow(self, clients: int) -> None:
        self.wanted = clients
        while self.clients < clients:
            threading.Thread(target=self._client, args=(self.clients,), daemon=True).start()
            self.clients += 1

    def _client(self, n: int) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120) as client:
            while not self.stopping.is_set():
                if n >= self.wanted:
                    time.sleep(0.2)
                    continue
                body = {
                    "model": ALIAS,
                    "messages": [{"role": "user", "content": "Tell me about the rail yard."}],
                    "max_tokens": 32,
                    "ignore_eos": True,
                    "user": f"u{next(self.users) % 200}",
                }
                sent = time.monotonic()
                try:
                    response = client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {self.key}"},
                    )
                    status = response.status_code
                    version = response.headers.get("x-roundhouse-model-version", "")
                except httpx.HTTPError:
                    status, version = 0, ""
                with self.lock:
                    done = time.monotonic()
                    self.answers.append((done - self.started, version, status, done - sent))


def _plot(
    analyses: list[dict[str, Any]], breach_at: float, rolled_at: float | None, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = [a["t"] / 60 for a in analyses]
    lines = (
        ("canary_short", "canary, 10 s window"),
        ("canary_long", "canary, 60 s window"),
        ("baseline_long", "baseline, 60 s window"),
    )
    for key, label in lines:
        ax.plot(t, [a[key] for a in analyses], label=label, drawstyle="steps-post")
    ax.axhline(6, color="grey", linestyle=":", label="burn-rate limit (6×)")
    ax.axvline(breach_at / 60, color="red", linestyle="--", label="load rises")
    if rolled_at is not None:
        ax.axvline(rolled_at / 60, color="black", linestyle="--", label="rolled back")
    ax.set_xlabel("minutes")
    ax.set_ylabel("TTFT error-budget burn rate (×)")
    ax.set_title("Canary analysis every 10 s: healthy, then a real breach")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="healthy canary, minutes")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--breach-clients", type=int, default=24)
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform = None
    canary_worker = None
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(model_dir, work, tenants={"drill": {}}, max_num_seqs=8)
        from models_registry.models import Deployment, ModelVersion
        from models_registry.services import alias_set, deployment_create, model_version_register
        from rollouts.services import rollout_analyze, rollout_start

        logging.getLogger("rollouts").setLevel(logging.WARNING)  # this script prints its own

        baseline = ModelVersion.objects.get(deployments__name="tiny")
        canary, _ = model_version_register(
            model_name="tiny", source_dir=model_dir, label="canary",
            engine_args={"max_num_seqs": 1},
        )  # fmt: skip
        deployment_create(
            name="tiny-canary", version=canary, max_model_len=MAX_MODEL_LEN,
            kv_cache_bytes=KV_CACHE_BYTES, enforce_eager=True, dtype="float32",
        )  # fmt: skip
        objective = Deployment.objects.get(name="tiny-canary").slo_ttft_p95_ms
        alias = alias_set(name=ALIAS, version=baseline)
        log = work / "worker-canary.log"
        canary_worker = spawn(
            [sys.executable, "manage.py", "run_worker", "--deployment", "tiny-canary"],
            log,
            platform.env,
        )
        with roundhouse_stack(platform, work / "stack") as target:
            wait_for(lambda: b"ready: serving" in log.read_bytes(), canary_worker, "canary", log)
            key = platform.tokens["drill"]
            rollout = rollout_start(
                alias=alias, canary=canary, steps=[50, 100], min_samples=10**9,
                min_step_seconds=10**9,
            )  # fmt: skip
            time.sleep(2)  # the route change reaches the frontend
            load = Load(target.base_url, key)
            load.grow(args.clients)
            started = load.started
            healthy_until = started + args.minutes * 60
            analyses: list[dict[str, Any]] = []
            breach_at: float | None = None
            rolled_at: float | None = None
            next_at = started + ANALYSIS_SECONDS
            while True:
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at += ANALYSIS_SECONDS
                now = time.monotonic()
                if breach_at is None and now >= healthy_until:
                    breach_at = now - started
                    load.grow(args.breach_clients)
                    progress(f"healthy for {args.minutes:g} min; {args.breach_clients} clients")
                verdict = rollout_analyze(rollout)  # what Celery beat's task runs per rollout
                if verdict is None:
                    break
                ttft = verdict.evidence["burn"]["slos"]["ttft"]
                row = {
                    "t": round(now - started, 1),
                    "action": verdict.action,
                    "breached": list(verdict.breached),
                    "canary_short": ttft["short"]["canary"]["burn"],
                    "canary_long": ttft["long"]["canary"]["burn"],
                    "baseline_long": ttft["long"]["baseline"]["burn"],
                }
                analyses.append(row)
                if breach_at is not None or len(analyses) % 6 == 0:
                    progress(
                        f"{row['t']:.0f} s: {row['action']}, TTFT burn canary "
                        f"{row['canary_short']:g} (10 s) {row['canary_long']:g} (60 s), "
                        f"baseline {row['baseline_long']:g} (60 s)"
                    )
                if verdict.action == "rollback":
                    rolled_at = now - started
                    break
                if breach_at is not None and now - started - breach_at > 300:
                    break
            time.sleep(10)  # requests admitted to the canary before the switch finish
            load.stopping.set()
            time.sleep(1)
    finally:
        if canary_worker is not None:
            stop([canary_worker])
        platform_stop(platform)
    versions = {"baseline": baseline.version, "canary": canary.version}
    _report(args, analyses, load, breach_at, rolled_at, objective, versions)


def _report(
    args: argparse.Namespace,
    analyses: list[dict[str, Any]],
    load: Load,
    breach_at: float | None,
    rolled_at: float | None,
    objective: int,
    versions: dict[str, str],
) -> None:
    if breach_at is None:  # rolled back while healthy: a false rollback, and no breach run
        breach_at = analyses[-1]["t"] + 1 if analyses else 0.0
        rolled_at = None
    healthy = [a for a in analyses if a["t"] < breach_at]
    false_rollbacks = sum(a["action"] == "rollback" for a in healthy)
    breached_healthy = sum(bool(a["breached"]) for a in healthy)
    to_rollback = None if rolled_at is None else round(rolled_at - breach_at, 1)
    # Complete: the last request the frontend sent to the canary (answered there in full:
    # the canary drains) was sent then; none after it went there.
    last_sent = max((t - s for t, v, _, s in load.answers if v == versions["canary"]), default=0.0)
    complete_at = None if rolled_at is None else max(rolled_at, last_sent)
    to_complete = None if complete_at is None else round(complete_at - breach_at, 1)

    def latency(version: str, after: bool) -> float:
        seconds = [s for t, v, status, s in load.answers
                   if v == versions[version] and status == 200
                   and (t >= breach_at) == after]  # fmt: skip
        return round(percentile(seconds, 0.5), 2) if seconds else float("nan")

    failed = sum(1 for _, _, status, _ in load.answers if status != 200)
    progress(
        f"healthy {args.minutes:g} min: {false_rollbacks} false rollbacks, {breached_healthy} "
        f"breached analyses; breach → rollback {to_rollback} s, → complete {to_complete} s; "
        f"{failed} of {len(load.answers)} requests failed"
    )
    plot = plot_path(args.docs, "canary")
    _plot(analyses, breach_at, rolled_at, plot)
    results_write(
        args.docs,
        "canary",
        {
            "section": "canary",
            "headline": [
                {
                    "measure": "Canary: seconds from a real breach to rollback complete",
                    "value": "not within 300 s" if to_complete is None else to_complete,
                    "target": "≤ 60",
                },
                {
                    "measure": f"Canary: false rollbacks during a healthy {args.minutes:g}-minute "
                    "canary",
                    "value": false_rollbacks,
                    "target": "≤ 0",
                },
            ],
            "analyses": analyses,
            "breach_at": breach_at,
            "rolled_back_at": rolled_at,
            "complete_at": complete_at,
            "requests": len(load.answers),
            "failed": failed,
        },
    )
    before = f"{latency('baseline', False)} / {latency('canary', False)}"
    after = f"{latency('baseline', True)} / {latency('canary', True)}"
    text = f"""
## Canary rollback

`bench/canary.py`: one frontend, the usage ingester and two workers of the demo model on this
machine, the baseline's (8 sequences at a time) and a canary version's registered with one
sequence at a time; a rollout sends half of an alias's users to the canary with the default
policy (an SLO burning at least 6× its budget and 2× the baseline's over the 10 s window in
three analyses in a row, and over the 60 s window at the last), and the script analyses every
10 s as Celery beat does.
For {args.minutes:g} minutes, {args.clients} clients send 32-token chats one after another; then
{args.breach_clients} clients at once, and the canary, one sequence at a time, queues its half
while the baseline's engine batches its own. The TTFT objective of both is {objective} ms.

| | |
|---|---|
| analyses during the healthy {args.minutes:g} minutes | {len(healthy)} |
| false rollbacks during them | {false_rollbacks} |
| analyses during them whose short window burned | {breached_healthy} |
| median request seconds, healthy: baseline / canary | {before} |
| median request seconds, after the load rose: baseline / canary | {after} |
| seconds from the load rising to the rollback decision | {to_rollback} |
| seconds from the load rising to rollback complete (its users on the baseline) | {to_complete} |
| requests that failed, of all sent | {failed} of {len(load.answers)} |

![Canary analysis: TTFT burn rates](img/canary.png)

The breach is counted from the moment the load rose, before the canary was late at all: its
first late answers need its queue to fill, and then their usage records the ingester. A
rollback is complete when the frontend sends the canary nothing more: the time the last
request answered by the canary was sent. Requests already on the canary finish there (its
worker drains); the failed count above includes any that did not.
"""
    section_write(args.docs, "canary", text)
    progress(f"wrote {args.docs / 'benchmarks.md'} and {plot}")


if __name__ == "__main__":
    main()
