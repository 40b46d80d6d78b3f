"""Start embedded PostgreSQL and Valkey on free ports before Django is set up for the tests.

Loaded with `-p tests.services_plugin`. Set ROUNDHOUSE_TEST_EXTERNAL=1 to use the servers named
by DATABASE_URL and REDIS_URL instead (their data is changed by the tests).

With ROUNDHOUSE_TEST_CLUSTER=1 the data plane runs on an embedded Valkey Cluster (three primaries
with a replica each) and the plain Valkey carries the control plane only (CONTROL_REDIS_URL).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from embedded.servers import ServiceConfig, services_start, services_stop
from embedded.valkey_cluster import Cluster, cluster_start, cluster_stop

CHECKOUT = Path(__file__).resolve().parent.parent

SERVICES_HOST = "127.0.0.7"
CLUSTER_HOSTS = ("127.0.0.8", "127.0.0.9", "127.0.0.10")

_config: ServiceConfig | None = None
_root: Path | None = None
cluster: Cluster | None = None


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> Generator[None]:
    global _config, _root, cluster
    if os.environ.get("ROUNDHOUSE_TEST_EXTERNAL") != "1":
        _root = Path(tempfile.mkdtemp(prefix="roundhouse-test-"))
        # PostgreSQL and Valkey on a loopback address of their own, as on hosts of their own:
        # nothing may assume it shares 127.0.0.1 with them.
        _config = ServiceConfig(
            data_dir=_root / "services", pg_port=0, redis_port=0, fast=True, host=SERVICES_HOST
        )
        endpoints = services_start(_config)
        os.environ["DATABASE_URL"] = endpoints.database_url
        os.environ["REDIS_URL"] = endpoints.redis_url
        if os.environ.get("ROUNDHOUSE_TEST_CLUSTER") == "1":
            try:
                cluster = cluster_start(_root / "cluster", fast=True, hosts=CLUSTER_HOSTS)
            except BaseException:
                # pytest stops before it would unconfigure: leave no server running.
                cluster_stop(_root / "cluster")
                services_stop(_config)
                raise
            os.environ["CONTROL_REDIS_URL"] = endpoints.redis_url
            os.environ["REDIS_URL"] = cluster.url
            os.environ["REDIS_CLUSTER"] = "1"
        # The trained demo model outlives the session: keep it where `make demo` keeps it.
        kept = Path(os.environ.get("ROUNDHOUSE_DATA_DIR", CHECKOUT / ".data"))
        os.environ.setdefault("ROUNDHOUSE_DEMO_MODEL_CACHE", str(kept / "cache" / "demo-model"))
        os.environ["ROUNDHOUSE_DATA_DIR"] = str(_root)
        os.environ["ROUNDHOUSE_ARTIFACT_ROOT"] = str(_root / "artifacts")
    return (yield)


def pytest_unconfigure(config: Any) -> None:
    if cluster is not None:
        cluster_stop(cluster.root)
    if _config is not None:
        services_stop(_config)
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
