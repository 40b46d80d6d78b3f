"""Breaker drill: a deployment's engine dies under two tenants' load, then comes back.

On this machine: one frontend, the usage ingester, and two workers of the demo model: the
alias `drill-chat`'s (its own version) and its fallback `tiny-chat`'s. Two tenants stream
64-token chats from `drill-chat`, `--rate` (1) a second each, whether or not earlier ones
ended (open loop: closed-loop clients would stop sending while theirs wait). After a warm-up
the engine core inside the alias's worker is killed (SIGKILL, as the kernel's OOM killer
would): the worker ends the streams it held `worker_lost`, claims nothing while it starts its
engine again, and the frontend's breakers (the product's defaults) and admission send the
tenants' requests elsewhere meanwhile. Measured, with the breaker and admission settings as
shipped:

- seconds from the kill to the first request answered by the fallback or refused fast (a
  503 in under a second), and what answered it;
- seconds from the worker's engine being up again to the first request the alias answers
  itself (the breaker closed, or never opened);
- requests per outcome, and whether every admitted request has exactly one usage record.

Writes its section of docs/benchmarks.md, docs/img/breaker.png and docs/bench-data/breaker.json.

    .venv/bin/python bench/breaker.py [--rate 1] [--warmup 15]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    KV_CACHE_BYTES,
    MAX_MODEL_LEN,
    engine_core,
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

ALIAS, FALLBACK = "drill-chat", "tiny-chat"
SENDING: list[threading.Thread] = []  # every request's thread


@dataclass
class Answer:
    tenant: str
    sent: float  # wall-clock seconds
    headers_at: float
    status: int
    fallback: str  # x-roundhouse-fallback-reason, "" when the alias answered
    outcome: str  # completed, worker_lost, refused:<code>, error:<code>
    request_id: str


def _one(base_url: str, tenant: str, key: str, answers: list[Answer]) -> None:
    """One streamed chat from the alias; its answer is appended to `answers`."""
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Tell me about the rail yard."}],
        "max_tokens": 64,
        "ignore_eos": True,
        "stream": True,
    }
    sent = time.time()
    try:
        with (
            httpx.Client(base_url=base_url, timeout=120) as client,
            client.stream(
                "POST", "/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as response,
        ):  # fmt: skip
            headers_at = time.time()
            outcome = "completed"
            if response.status_code != 200:
                response.read()
                outcome = f"refused:{response.json()['error']['code']}"
            else:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    error = json.loads(line[6:]).get("error")
                    if error:
                        code = error["code"]
                        outcome = code if code == "worker_lost" else f"error:{code}"
            answers.append(
                Answer(
                    tenant=tenant,
                    sent=sent,
                    headers_at=headers_at,
                    status=response.status_code,
                    fallback=response.headers.get("x-roundhouse-fallback-reason", ""),
                    outcome=outcome,
                    request_id=response.headers.get("x-request-id", ""),
                )
            )
    except httpx.HTTPError as exc:
        answers.append(Answer(tenant, sent, time.time(), 0, "", f"error:{exc}", ""))


def _arrivals(
    base_url: str, tenant: str, key: str, rate: float, answers: list[Answer],
    stopping: threading.Event,
) -> None:  # fmt: skip
    """Open-loop arrivals: a request every 1/rate s, whether or not the earlier ones ended
    (a closed loop would stop sending while its requests wait out an outage)."""
    next_at = time.monotonic()
    while not stopping.is_set():
        thread = threading.Thread(target=_one, args=(base_url, tenant, key, answers), daemon=True)
        thread.start()
        SENDING.append(thread)
        next_at += 1 / rate
        time.sleep(max(0.0, next_at - time.monotonic()))


def _engine_up_at(log: Path) -> float | None:
    """When the worker said its engine was up again (wall clock), from its JSON log."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and "the engine is up again" in line:
            stamp = json.loads(line)["ts"]
            return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1.0, help="requests a second per tenant")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before the kill")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform = None
    drill_worker = None
    answers: list[Answer] = []
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        platform = prepare_roundhouse(model_dir, work, tenants={"a": {}, "b": {}}, max_num_seqs=8)
        from models_registry.models import ModelVersion
        from models_registry.services import (
            alias_fallback_set,
            alias_set,
            deployment_create,
            model_version_register,
        )

        fallback = alias_set(
            name=FALLBACK, version=ModelVersion.objects.get(deployments__name="tiny")
        )
        version, _ = model_version_register(
            model_name="tiny",
            source_dir=model_dir,
            label="drill",
            price_input_per_1k=Decimal("0.93"),
        )
        deployment_create(
            name="drill", version=version, max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
            kv_cache_bytes=KV_CACHE_BYTES, enforce_eager=True, dtype="float32",
        )  # fmt: skip
        alias_fallback_set(alias=alias_set(name=ALIAS, version=version), fallback=fallback)
        log = work / "worker-drill.log"
        drill_worker = spawn(
            [sys.executable, "manage.py", "run_worker", "--deployment", "drill"], log, platform.env
        )
        with roundhouse_stack(platform, work / "stack") as target:
            wait_for(lambda: b"ready: serving" in log.read_bytes(), drill_worker, "drill", log)
            stopping = threading.Event()
            threads = [
                threading.Thread(
                    target=_arrivals,
                    args=(
                        target.base_url,
                        tenant,
                        platform.tokens[tenant],
                        args.rate,
                        answers,
                        stopping,
                    ),
                    daemon=True,
                )
                for tenant in ("a", "b")
            ]
            for thread in threads:
                thread.start()
            time.sleep(args.warmup)
            core = engine_core(drill_worker.pid, log)
            if core is None:
                raise SystemExit("the alias's worker has no engine process")
            killed_at = time.time()
            core.kill()
            progress("killed the alias's engine core")
            up_at = closed_at = None
            while time.time() - killed_at < 240:
                time.sleep(1)
                up_at = up_at or _engine_up_at(log)
                if up_at is not None:
                    back = [a for a in answers if a.sent > up_at and a.status == 200
                            and not a.fallback and a.outcome == "completed"]  # fmt: skip
                    if back and closed_at is None:
                        closed_at = min(a.headers_at for a in back)
                        progress("the alias answers again")
                    if closed_at is not None and time.time() - closed_at > 10:
                        break
            stopping.set()
            for thread in threads:
                thread.join(10)
            deadline = time.time() + 150
            while any(t.is_alive() for t in SENDING) and time.time() < deadline:
                time.sleep(0.5)  # the last requests end
            from billing.models import UsageRecord

            admitted = [a.request_id for a in answers if a.status == 200 and a.request_id]
            time.sleep(3)
            counts = collections.Counter(
                UsageRecord.objects.filter(request_id__in=admitted).values_list(
                    "request_id", flat=True
                )
            )
    finally:
        if drill_worker is not None:
            stop([drill_worker])
        platform_stop(platform)
    _report(args, answers, killed_at, up_at, closed_at, admitted, counts)


def _report(
    args: argparse.Namespace,
    answers: list[Answer],
    killed_at: float,
    up_at: float | None,
    closed_at: float | None,
    admitted: list[str],
    counts: collections.Counter[str],
) -> None:
    after = sorted((a for a in answers if a.sent >= killed_at), key=lambda a: a.headers_at)
    elsewhere = next(
        (a for a in after if a.fallback or (a.status != 200 and a.headers_at - a.sent < 1.0)),
        None,
    )
    to_elsewhere = None if elsewhere is None else round(elsewhere.headers_at - killed_at, 2)
    how = "" if elsewhere is None else (f"fallback ({elsewhere.fallback})" if elsewhere.fallback
                                        else elsewhere.outcome)  # fmt: skip
    to_up = None if up_at is None else round(up_at - killed_at, 1)
    to_closed = None if closed_at is None or up_at is None else round(closed_at - up_at, 2)
    outcomes = collections.Counter(
        ("fallback: " + a.fallback) if a.fallback else a.outcome for a in answers
    )
    missing = sum(1 for rid in admitted if counts[rid] == 0)
    twice = sum(1 for rid in admitted if counts[rid] > 1)
    progress(
        f"kill → elsewhere {to_elsewhere} s ({how}); engine up after {to_up} s; up → alias "
        f"answers {to_closed} s; {dict(outcomes)}; {missing} without a usage record, {twice} twice"
    )
    plot = plot_path(args.docs, "breaker")
    _plot(answers, killed_at, up_at, closed_at, plot)
    results_write(
        args.docs,
        "breaker",
        {
            "section": "breaker",
            "headline": [
                {
                    "measure": "Breaker: seconds from a deployment's engine dying to requests "
                    "falling back or failing fast",
                    "value": "never" if to_elsewhere is None else to_elsewhere,
                    "target": "≤ 5",
                },
                {
                    "measure": "Breaker: seconds from the engine's recovery to the alias "
                    "answering again (closed)",
                    "value": "never" if to_closed is None else to_closed,
                },
            ],
            "outcomes": dict(outcomes),
            "engine_up_after": to_up,
            "admitted": len(admitted),
            "without_usage": missing,
            "billed_twice": twice,
        },
    )
    section_write(
        args.docs,
        "breaker",
        _section(
            rate=args.rate,
            warmup=args.warmup,
            to_elsewhere=to_elsewhere,
            how=how,
            to_up=to_up,
            to_closed=to_closed,
            usage=f"{missing} / {twice} of {len(admitted)}",
            outcomes=dict(outcomes),
        ),
    )
    progress(f"wrote {args.docs / 'benchmarks.md'} and {plot}")


def _section(
    *,
    rate: float,
    warmup: float,
    to_elsewhere: float | None,
    how: str,
    to_up: float | None,
    to_closed: float | None,
    usage: str,
    outcomes: dict[str, int],
) -> str:
    """The drill's section of docs/benchmarks.md."""
    rows = "\n".join(f"| {name} | {n} |" for name, n in sorted(outcomes.items()))
    text = f"""
## Breaker drill

`bench/breaker.py`: one frontend, the usage ingester and two workers of the demo model on this
machine, the alias `drill-chat`'s and its fallback `tiny-chat`'s. Two tenants stream 64-token
chats from `drill-chat`, {rate:g} a second each (open loop); after
{warmup:g} s the engine core inside the alias's worker is killed (SIGKILL). Breakers and
admission as shipped (a tenant's breaker opens at half of at least 10 requests failed in 30 s,
for 15 s; two tenants' breakers holding send every tenant on).

| | |
|---|---|
| seconds from the kill to the first request answered elsewhere | {to_elsewhere} ({how}) |
| seconds from the kill to the worker's engine up again | {to_up} |
| seconds from the engine up again to the alias answering (closed) | {to_closed} |
| admitted requests without a usage record / with more than one | {usage} |

| outcome | requests |
|---|---|
{rows}

![Breaker drill timeline](img/breaker.png)

`worker_lost` are the streams the engine held when it died: each ends once, with an error
event, and is billed for what it made. While the worker starts its engine again it is out of
the live set, so admission refuses the alias's requests at once as it does for a deployment
with no live worker, and an alias with a fallback sends them there (`model_unavailable` or
`deadline_unattainable` above); the breakers open only where the alias's own workers keep
taking requests and failing them.
"""
    return text


def _plot(
    answers: list[Answer], killed_at: float, up_at: float | None, closed_at: float | None,
    path: Path,
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(a.sent for a in answers)
    per: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for a in answers:
        kind = "fallback" if a.fallback else "alias" if a.outcome == "completed" else "failed"
        per[kind][int(a.headers_at - start)] += 1
    seconds = range(int(max(a.headers_at for a in answers) - start) + 1)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for kind in ("alias", "fallback", "failed"):
        ax.plot(seconds, [per[kind][s] for s in seconds], label=kind, drawstyle="steps-mid")
    for at, label, style in ((killed_at, "engine killed", "r--"), (up_at, "engine up", "g--"),
                             (closed_at, "alias answers", "k--")):  # fmt: skip
        if at is not None:
            ax.axvline(at - start, linestyle=style[1:], color=style[0], label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("answers per second (by when their headers came)")
    ax.set_title("Breaker drill: the alias's engine dies and comes back")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
