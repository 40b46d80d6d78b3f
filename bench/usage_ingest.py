"""Usage ingestion: rows per second into PostgreSQL, and the lag under a sustained stream.

The real ingester (`manage.py run_ingester`) reads usage events from the deployment's Redis
stream with its consumer group, writes them to the embedded PostgreSQL and acknowledges.
This benchmark feeds it events as workers would (XADD of encoded UsageEvents) and watches
the usage table:

- drain: N events already queued; rows per second until all are recorded;
- sustained: events arrive at fixed rates; lag (events produced but not yet recorded) over
  time, and whether the ingester keeps up.

Every event must end as exactly one row (checked at the end). Writes a table into
docs/benchmarks.md and a plot to docs/img/usage_ingest.png.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    section_write,
    spawn,
    stop,
)


@dataclass
class Run:
    name: str
    offered_per_s: float | None  # None: everything queued up front
    events: int
    seconds: float = 0.0
    samples: list[tuple[float, int]] = field(default_factory=list)  # (t, lag)

    @property
    def rows_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def max_lag(self) -> int:
        return max((lag for _, lag in self.samples), default=0)


def _events(tenant_id: int, digest: str, n: int) -> list[bytes]:
    from dataplane.types import Status, UsageEvent, encode

    now = time.time()
    return [
        encode(
            UsageEvent(
                request_id=uuid.uuid4().hex, tenant_id=tenant_id, api_key_id=0,
                deployment="tiny", model_version=digest, endpoint="chat.completions",
                status=Status.OK, prompt_tokens=120, completion_tokens=80,
                enqueued_at=now, started_at=now, first_token_at=now, finished_at=now,
                user=f"user-{i % 50}",
            )
        )
        for i in range(n)
    ]  # fmt: skip


def _produce(client: object, payloads: list[bytes]) -> None:
    from dataplane.keys import usage_key

    key = usage_key("tiny")
    for start in range(0, len(payloads), 2000):
        pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
        for payload in payloads[start : start + 2000]:
            pipe.xadd(key, {"u": payload})
        pipe.execute()


def _recorded() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM billing_usagerecord")
        return int(cursor.fetchone()[0])


def _lag(client: object) -> int:
    """Events not yet recorded: the ingester deletes an entry once its row is committed."""
    from dataplane.keys import usage_key

    return int(client.xlen(usage_key("tiny")))  # type: ignore[attr-defined]


def _drain(client: object, tenant_id: int, digest: str, n: int) -> Run:
    run = Run("drain", None, n)
    _produce(client, _events(tenant_id, digest, n))
    started = time.perf_counter()
    while True:
        lag = _lag(client)
        now = time.perf_counter() - started
        run.samples.append((now, lag))
        if lag == 0 or now > 600:
            break
        time.sleep(0.1)
    run.seconds = time.perf_counter() - started
    return run


def _sustained(client: object, tenant_id: int, digest: str, rate: int, seconds: float) -> Run:
    run = Run(f"{rate:,}/s", float(rate), int(rate * seconds))
    payloads = _events(tenant_id, digest, run.events)
    tick = 0.1
    per_tick = max(1, int(rate * tick))
    started = time.perf_counter()
    produced = 0
    while produced < run.events:
        _produce(client, payloads[produced : produced + per_tick])
        produced += per_tick
        now = time.perf_counter() - started
        run.samples.append((now, _lag(client)))
        sleep = produced / rate - (time.perf_counter() - started)
        if sleep > 0:
            time.sleep(sleep)
    while (lag := _lag(client)) > 0 and time.perf_counter() - started < 600:
        run.samples.append((time.perf_counter() - started, lag))
        time.sleep(0.1)
    run.samples.append((time.perf_counter() - started, 0))
    run.seconds = time.perf_counter() - started
    return run


def _table(runs: list[Run]) -> str:
    rows = [
        "| run | events | offered events/s | **rows/s** | max lag (events) | done after (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        offered = f"{run.offered_per_s:,.0f}" if run.offered_per_s else "all queued"
        rows.append(
            f"| {run.name} | {run.events:,} | {offered} | **{run.rows_per_s:,.0f}** | "
            f"{run.max_lag:,} | {run.seconds:.1f} |"
        )
    return "\n".join(rows)


def _plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for run in runs:
        ax.plot([t for t, _ in run.samples], [lag for _, lag in run.samples], label=run.name)
    ax.set_xlabel("seconds")
    ax.set_ylabel("events not yet recorded")
    ax.set_title("Usage ingestion lag")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drain-events", type=int, default=200_000)
    parser.add_argument("--rates", default="10000,20000,30000", help="sustained events/s")
    parser.add_argument("--seconds", type=float, default=15.0, help="per sustained rate")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform = None
    runs: list[Run] = []
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model (registered, never loaded)")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(model_dir, work, tenants={"bench": {}}, max_num_seqs=8)
        from dataplane.keys import INGEST_GROUP, usage_key
        from dataplane.redis_client import redis_sync_client
        from models_registry.models import ModelVersion
        from tenants.models import Tenant

        tenant_id = Tenant.objects.get(slug="bench").pk
        digest = ModelVersion.objects.get().digest
        client = redis_sync_client()
        client.xgroup_create(usage_key("tiny"), INGEST_GROUP, id="0", mkstream=True)
        log = work / "ingester.log"
        ingester = spawn([sys.executable, "manage.py", "run_ingester"], log, platform.env)
        try:
            time.sleep(3)
            progress(f"drain: {args.drain_events:,} events queued up front")
            runs.append(_drain(client, tenant_id, digest, args.drain_events))
            progress(f"drain: {runs[-1].rows_per_s:,.0f} rows/s")
            for rate in (int(r) for r in args.rates.split(",")):
                progress(f"sustained: {rate:,} events/s for {args.seconds:.0f}s")
                runs.append(_sustained(client, tenant_id, digest, rate, args.seconds))
                progress(f"  max lag {runs[-1].max_lag:,} events")
        finally:
            stop([ingester])
        expected = sum(run.events for run in runs)
        recorded = _recorded()
        progress(f"recorded {recorded:,} rows for {expected:,} events")
        if recorded != expected:
            raise SystemExit(f"lost or duplicated usage: {recorded} rows for {expected} events")
    finally:
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)
    table = _table(runs)
    print("\n" + table)
    _plot(runs, plot_path(args.docs, "usage_ingest"))
    section_write(
        args.docs,
        "usage_ingest",
        "## Usage ingestion\n\n"
        f"`bench/usage_ingest.py`, {time.strftime('%Y-%m-%d')}: the real ingester process "
        "reading the Redis usage stream of one deployment into the embedded PostgreSQL, on "
        "the same 2-core machine as the producer, Valkey and PostgreSQL. Every run ended with "
        f"exactly one row per event ({expected:,} rows).\n\n"
        + table
        + "\n\n![usage ingestion lag](img/usage_ingest.png)\n",
    )
    progress(f"wrote {args.docs / 'benchmarks.md'} and {args.docs / 'img' / 'usage_ingest.png'}")


if __name__ == "__main__":
    main()
