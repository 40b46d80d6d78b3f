"""A frontend's /metrics sums the series of all its processes (multi-process mode)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import RequestFactory
from prometheus_client.parser import text_string_to_metric_families

from inference.base import prometheus as scrape

_WRITE = """
from inference.base.metrics import requests_total
requests_total.labels(endpoint="probe", code="200").inc({n})
"""


@pytest.mark.django_db
def test_one_scrape_sums_every_frontend_process(tmp_path, monkeypatch):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for n in (3, 4):
        subprocess.run([sys.executable, "-c", _WRITE.format(n=n)], env=env, check=True)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    response = scrape.metrics(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    total = sum(
        sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name == "roundhouse_requests_total" and sample.labels.get("endpoint") == "probe"
    )
    assert total == 7
