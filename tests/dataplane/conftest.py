"""A Valkey Cluster for the data plane's tests that need one, whatever the session runs on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from embedded.valkey_cluster import Cluster, cluster_start, cluster_stop
from tests import services_plugin


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if services_plugin.cluster is not None:  # the whole session runs on one
        yield services_plugin.cluster
        return
    started = cluster_start(Path(tmp_path_factory.mktemp("cluster")), fast=True)
    try:
        yield started
    finally:
        cluster_stop(started.root)
