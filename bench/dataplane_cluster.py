"""Data-plane scaling: one Valkey server against a three-primary Valkey Cluster.

Each cycle is what one request costs the data plane, through the platform's own classes:
admission (the tenant's quota script), enqueue (the deployment's queue script), a worker's
claim, the finish (reply events, the terminal event and the usage event) and the settling of
the reservation. Lanes run cycles back to back for a fixed time, over 4 and then 8 deployments
whose names are drawn at random (so their slots fall where they fall) and 16 tenants.

For each target it reports cycles per second, the commands each node served (INFO
commandstats, before and after) as a share of all, and the CPU seconds each node used. On a
two-core machine the cluster cannot be faster than one server (its nodes and this client share
the cores); what carries to a real cluster is the spread: with every primary within 20 % of the
mean, three primaries on three machines take three times the load of one.

Writes its section of docs/benchmarks.md, docs/img/dataplane_cluster.png and
docs/bench-data/dataplane_cluster.json.

    .venv/bin/python bench/dataplane_cluster.py [--seconds 20] [--lanes 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

import psutil  # noqa: E402
import redis  # noqa: E402
import redis.asyncio as aredis  # noqa: E402

from bench.common import plot_path, progress, results_write, section_write  # noqa: E402

TENANTS = 16


@dataclass(frozen=True)
class NodeRef:
    name: str
    host: str
    port: int
    pid: int


@dataclass
class Run:
    target: str  # "one server" or "cluster"
    deployments: int
    placed: bool = False  # deployments chosen to take turns on the primaries
    seconds: float = 0.0
    cycles: int = 0
    commands: dict[str, int] = field(default_factory=dict)  # node -> commands served
    cpu: dict[str, float] = field(default_factory=dict)  # node -> CPU seconds

    @property
    def label(self) -> str:
        how = ", placed" if self.placed else ""
        return f"{self.target}, {self.deployments} deployments{how}"

    @property
    def per_second(self) -> float:
        return self.cycles / self.seconds if self.seconds else 0.0

    @property
    def shares(self) -> dict[str, float]:
        total = sum(self.commands.values()) or 1
        return {node: n / total for node, n in self.commands.items()}

    @property
    def spread(self) -> float:
        """The largest distance of a node's commands from the mean, as a fraction of it."""
        values = list(self.commands.values())
        mean = sum(values) / len(values) if values else 0
        return max(abs(v - mean) for v in values) / mean if mean else 0.0


def _commands(node: NodeRef) -> int:
    client = redis.Redis(host=node.host, port=node.port)
    try:
        stats: Any = client.info("commandstats")
    finally:
        client.close()
    # Leave out what the measuring itself sends.
    return sum(
        int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_cluster")
    )


def _cpu(node: NodeRef) -> float:
    times = psutil.Process(node.pid).cpu_times()
    return float(times.user + times.system)


async def _lane(
    client: aredis.Redis, deployment: str, tenant: int, until: float, counter: list[int]
) -> None:
    from dataplane.finish import Finisher
    from dataplane.frontdoor import FrontDoor
    from dataplane.leases import Leases
    from dataplane.quotas import Limits, Quotas, Usage
    from dataplane.types import Delta, Finished, Job, Sampling, Started, Status, usage_for

    front, leases = FrontDoor(client, reply_ttl=60), Leases(client)
    finisher, quotas = Finisher(client, reply_ttl=60), Quotas(client)
    limits = Limits(
        requests_per_minute=10_000_000,
        tokens_per_minute=1_000_000_000,
        max_concurrency=100_000,
        monthly_budget=Decimal(1_000_000),
    )
    while time.monotonic() < until:
        now = time.time()
        job = Job(
            request_id=uuid.uuid4().hex, tenant_id=tenant, api_key_id=1, deployment=deployment,
            model_version="v", endpoint="chat.completions", prompt_token_ids=list(range(32)),
            sampling=Sampling(max_tokens=16), enqueued_at=now, deadline=now + 60,
        )  # fmt: skip
        decision = await quotas.admit(
            tenant_id=tenant,
            request_id=job.request_id,
            limits=limits,
            reserve=Usage(tokens=48, cost_micros=10),
            lease_seconds=60,
            spent_this_month=0,
            now=now,
        )
        assert decision is not None and decision.admitted, decision
        assert await front.enqueue(job) is None
        claimed = await leases.claim(deployment=deployment, count=1, lease_seconds=30)
        for run in claimed.run:
            await finisher.publish(job=run, events=[Started(at=time.time()), Delta("x" * 16, 16)])
            done = Finished(finish_reason="length", prompt_tokens=32, completion_tokens=16)
            usage = usage_for(run, status=Status.OK, finished_at=time.time(), completion_tokens=16)
            await finisher.finalize(job=run, terminal=done, usage=usage)
            await quotas.release(
                tenant_id=run.tenant_id,
                request_id=run.request_id,
                admitted_at=run.enqueued_at,
                used=Usage(tokens=48, cost_micros=10),
            )
            counter[0] += 1


def _owner(client: Any, key: str) -> int:
    """The port of the primary serving a key (cluster) or 0 (one server)."""
    return int(client.get_node_from_key(key).port) if hasattr(client, "get_node_from_key") else 0


def _drawn(client: Any, port: int, make: Any) -> Any:
    """Draw names (or ids) until one's keys live on the primary listening on `port`."""
    while True:
        candidate, key = make()
        if _owner(client, key) == port:
            return candidate


def _placement(
    client: Any, nodes: list[NodeRef], deployments: int, args: Any, weights: tuple[float, float]
) -> tuple[list[str], list[int]]:
    """Deployments and tenants placed by load, as an operator moves the busiest slots.

    Every deployment and tenant weighs the commands a cycle costs its keys (measured) times
    its share of the lanes; the heaviest goes first, each to the primary with the least so far
    (longest processing time first). A name or id is then drawn whose slot is on that primary:
    what moving its slot there would do.
    """
    from dataplane.keys import quota_keys, tag

    per_deployment, per_tenant = weights
    items = [("d", i, per_deployment * args.lanes / deployments) for i in range(deployments)]
    items += [("t", i, per_tenant * args.lanes / TENANTS) for i in range(TENANTS)]
    load = {n.port: 0.0 for n in nodes}
    names: list[str] = []
    tenants: list[int] = []
    used: set[int] = set()
    for kind, _, weight in sorted(items, key=lambda item: -item[2]):
        port = min(load, key=lambda p: load[p])
        load[port] += weight
        if kind == "d":
            names.append(_drawn(client, port, lambda: _deployment_name(tag)))
        else:
            tenant = _drawn(
                client,
                port,
                lambda: (t := random.randrange(1, 1 << 30), quota_keys(t, "", "").rpm),
            )
            if tenant not in used:
                used.add(tenant)
                tenants.append(tenant)
    return names, tenants


def _deployment_name(tag: Any) -> tuple[str, str]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    return name, f"{tag(name)}:jobs"


async def _calibrate(client: Any, nodes: list[NodeRef], args: Any) -> tuple[float, float]:
    """Commands a cycle costs its deployment's primary and its tenant's, measured apart."""
    from dataplane.keys import quota_keys, tag
    from dataplane.leases import Leases

    ports = [n.port for n in nodes]
    name = _drawn(client, ports[0], lambda: _deployment_name(tag))
    tenant = _drawn(
        client, ports[1], lambda: (t := random.randrange(1, 1 << 30), quota_keys(t, "", "").rpm)
    )
    await Leases(client).heartbeat(deployment=name, worker="w", ttl=600, slots=(10_000, 0))
    before = {n.port: _commands(n) for n in nodes}
    counter = [0]
    until = time.monotonic() + 2.0
    await asyncio.gather(*(_lane(client, name, tenant, until, counter) for _ in range(4)))
    after = {n.port: _commands(n) for n in nodes}
    cycles = max(counter[0], 1)
    return (after[ports[0]] - before[ports[0]]) / cycles, (
        after[ports[1]] - before[ports[1]]
    ) / cycles


async def _measure(
    client: aredis.Redis,
    nodes: list[NodeRef],
    target: str,
    deployments: int,
    args: Any,
    *,
    placed: bool = False,
) -> Run:
    from dataplane.leases import Leases

    if placed:
        names, tenants = _placement(client, nodes, deployments, args, args.weights)
    else:
        names = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(deployments)]
        tenants = list(range(1, TENANTS + 1))
    for name in names:
        await Leases(client).heartbeat(deployment=name, worker="w", ttl=600, slots=(10_000, 0))
    run = Run(target=target, deployments=deployments, placed=placed)
    before = {n.name: _commands(n) for n in nodes}
    cpu_before = {n.name: _cpu(n) for n in nodes}
    counter = [0]
    started = time.monotonic()
    until = started + args.seconds
    lanes = [
        _lane(client, names[i % deployments], tenants[i % len(tenants)], until, counter)
        for i in range(args.lanes)
    ]
    await asyncio.gather(*lanes)
    run.seconds = time.monotonic() - started
    run.cycles = counter[0]
    run.commands = {n.name: _commands(n) - before[n.name] for n in nodes}
    run.cpu = {n.name: _cpu(n) - cpu_before[n.name] for n in nodes}
    progress(f"{run.label}: {run.per_second:,.0f} cycles/s, spread {run.spread:.0%}")
    return run


def _table(runs: list[Run]) -> str:
    rows = [
        "| target | deployments | names | **cycles/s** | commands/s "
        "| each primary's share of the commands | furthest from the mean | CPU s per node |",
        "| --- | ---: | --- | ---: | ---: | --- | ---: | --- |",
    ]
    for run in runs:
        shares = ", ".join(f"{node} {share:.0%}" for node, share in sorted(run.shares.items()))
        cpu = ", ".join(f"{node} {s:.1f}" for node, s in sorted(run.cpu.items()))
        commands = sum(run.commands.values()) / run.seconds if run.seconds else 0.0
        rows.append(
            f"| {run.target} | {run.deployments} | {'placed' if run.placed else 'random'} | "
            f"**{run.per_second:,.0f}** | {commands:,.0f} | "
            f"{shares} | {run.spread:.0%} | {cpu} |"
        )
    return "\n".join(rows)


def _plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clustered = [r for r in runs if r.target == "cluster"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(clustered))
    nodes = sorted(clustered[0].commands) if clustered else []
    for i, run in enumerate(clustered):
        xs = [j + i * width for j in range(len(nodes))]
        ax.bar(xs, [run.shares[n] for n in nodes], width, label=run.label.split(", ", 1)[1])
    if nodes:
        ax.axhline(1 / len(nodes), color="grey", linestyle="--", label="even share")
        ax.set_xticks([j + width * (len(clustered) - 1) / 2 for j in range(len(nodes))], nodes)
    ax.set_ylabel("share of the commands served")
    ax.set_title("Data plane on a three-primary Valkey Cluster: each primary's share")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def _run_target(target: str, url: str, nodes: list[NodeRef], args: Any) -> list[Run]:
    client: Any
    if target == "cluster":
        client = aredis.RedisCluster.from_url(url, max_connections=1024)
        await client.initialize()  # the slot map first, or the first lanes go anywhere
    else:
        client = aredis.Redis.from_url(url, max_connections=1024)
    try:
        runs = [await _measure(client, nodes, target, d, args) for d in args.deployments]
        if target == "cluster":
            args.weights = await _calibrate(client, nodes, args)
            progress(
                f"a cycle costs its deployment's primary {args.weights[0]:.1f} commands and its "
                f"tenant's {args.weights[1]:.1f}"
            )
            runs += [
                await _measure(client, nodes, target, d, args, placed=True)
                for d in args.deployments
            ]
        return runs
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per run")
    parser.add_argument("--lanes", type=int, default=32, help="cycles in flight at once")
    parser.add_argument("--deployments", default="4,8")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    args.deployments = [int(d) for d in args.deployments.split(",")]

    import django

    django.setup()
    from embedded import valkey
    from embedded.service import Layout, ServiceConfig
    from embedded.valkey_cluster import cluster_start, cluster_stop

    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    layout = Layout(work / "single")
    layout.root.mkdir(parents=True)
    runs: list[Run] = []
    try:
        progress("starting one Valkey server")
        port = valkey.start(layout, ServiceConfig(data_dir=layout.root, redis_port=0), None)
        pid = int(layout.valkey_pidfile.read_text().split()[0])
        single = [NodeRef("server", "127.0.0.1", port, pid)]
        runs += asyncio.run(
            _run_target("one server", valkey.redis_url("127.0.0.1", port), single, args)
        )
        valkey.stop(layout)
        progress("starting a Valkey Cluster: 3 primaries with a replica each")
        cluster = cluster_start(work / "cluster")
        primaries = [
            NodeRef(n.name, n.host, n.port, cluster.pid(n.name) or 0)
            for n in cluster.nodes
            if not n.primary
        ]
        try:
            runs += asyncio.run(_run_target("cluster", cluster.url, primaries, args))
        finally:
            cluster_stop(cluster.root)
    finally:
        valkey.stop(layout)
        shutil.rmtree(work, ignore_errors=True)

    plot = plot_path(args.docs, "dataplane_cluster")
    _plot(runs, plot)
    clustered = {r.deployments: r for r in runs if r.target == "cluster" and not r.placed}
    placed = {r.deployments: r for r in runs if r.target == "cluster" and r.placed}
    one = {r.deployments: r for r in runs if r.target == "one server"}
    results_write(
        args.docs,
        "dataplane_cluster",
        {
            "section": "dataplane_cluster",
            "headline": [
                {
                    "measure": f"Data plane on a 3-primary cluster, {d} deployments: "
                    "furthest primary from the mean share (%)",
                    "value": round(clustered[d].spread * 100, 1),
                    "target": "≤ 20",
                }
                for d in sorted(clustered)
            ]
            + [
                {
                    "measure": f"Data plane on a 3-primary cluster, {d} deployments placed by "
                    "load: furthest primary from the mean share (%)",
                    "value": round(placed[d].spread * 100, 1),
                    "target": "≤ 20",
                }
                for d in sorted(placed)
            ]
            + [
                {
                    "measure": f"Data plane cycles/s, cluster ÷ one server, {d} deployments "
                    "(two cores shared by every node)",
                    "value": round(clustered[d].per_second / one[d].per_second, 2),
                }
                for d in sorted(clustered)
                if d in one and one[d].per_second
            ],
            "runs": [
                {
                    "target": r.target,
                    "deployments": r.deployments,
                    "placed": r.placed,
                    "seconds": r.seconds,
                    "cycles": r.cycles,
                    "commands": r.commands,
                    "cpu_seconds": r.cpu,
                }
                for r in runs
            ],
        },
    )
    text = f"""
## Data-plane scaling: one Valkey vs a three-primary cluster

`bench/dataplane_cluster.py`: {args.lanes} lanes each run request cycles back to back for
{args.seconds:.0f} s (admission, enqueue, a worker's claim, reply events, the finish with its
usage event, the settling of the reservation: what one request costs the data plane, through
the platform's own classes) over deployments (random names, or placed: below) and {TENANTS}
tenants; first against one Valkey server, then against an embedded cluster of three primaries
with a replica each (append-only files synced every second on both). The commands are each
node's own count (INFO commandstats, which counts the commands inside scripts too: a measure of
the work); the target for the spread is every primary within 20 % of the mean.

{_table(runs)}

![Each primary's share of the commands](img/dataplane_cluster.png)

On this machine every node, the replicas and this client share two cores, so the cluster
cannot serve more cycles than one server; the spread is what carries to a cluster whose
primaries have machines of their own.

A deployment's queue is one slot (its scripts are atomic over it), so a primary serves whole
deployments, and a tenant's limits are one slot too: with random names and ids, where their
hash tags fall decides the spread. "Placed" is what an operator does by moving slots
(`CLUSTER SETSLOT`, `valkey-cli --cluster reshard`): each deployment and tenant weighs the
commands a cycle costs its slot (measured first: a deployment's queue costs several times what a
tenant's limits do) times its share of the traffic, and the heaviest go first, each to the
primary with the least load so far; the drawn names and ids are ones whose slots fall there.
Four equally busy deployments cannot be split evenly over three primaries whatever the
tenants do (one primary holds two); eight can. See [scale-out.md](scale-out.md).
"""
    section_write(args.docs, "dataplane_cluster", text)
    progress(f"wrote {args.docs / 'benchmarks.md'} and {plot}")


if __name__ == "__main__":
    main()
