"""The Grafana dashboard of platform/grafana."""

from __future__ import annotations

import json
import re
from itertools import combinations
from typing import Any

import pytest

from tests.platform.contract import (
    ROOT,
    contract_load,
    problems,
    recorded_labels,
    rules_load,
    selectors,
)

DASHBOARD = ROOT / "platform" / "grafana" / "roundhouse.json"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def test_it_is_a_current_grafana_dashboard(dashboard):
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"] == "Roundhouse"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    deployment = variables["deployment"]
    assert deployment["query"]["query"] == "label_values(roundhouse_queue_depth, deployment)"
    assert deployment["datasource"]["uid"] == "${datasource}"
    assert deployment["multi"] and deployment["includeAll"]


def test_panel_ids_are_unique(dashboard):
    ids = [panel["id"] for panel in all_panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_every_query_panel_reads_the_chosen_datasource(dashboard):
    for panel in all_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def test_panels_fit_the_grid_without_overlapping(dashboard):
    boxes = []
    for panel in all_panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        boxes.append((panel["title"], pos))
    for (a, p), (b, q) in combinations(boxes, 2):
        apart = (
            p["x"] + p["w"] <= q["x"]
            or q["x"] + q["w"] <= p["x"]
            or p["y"] + p["h"] <= q["y"]
            or q["y"] + q["h"] <= p["y"]
        )
        assert apart, (a, b)


def test_every_expression_names_documented_or_recorded_series(dashboard):
    contract = contract_load()
    recorded = {rule["record"] for rule in rules_load() if "record" in rule}
    found = {
        f"{title}: {expr}": problems(expr, contract, recorded)
        for title, expr in expressions(dashboard)
    }
    assert {query: p for query, p in found.items() if p} == {}


def test_the_deployment_variable_filters_every_per_deployment_query(dashboard):
    contract = contract_load()
    recorded = {rule["record"] for rule in rules_load() if "record" in rule}
    for title, expr in expressions(dashboard):
        for selector in selectors(expr):
            if selector.name in recorded:
                labels = recorded_labels(selector.name)
            else:
                series, _ = contract.lookup(selector.name)
                labels = series.labels if series else frozenset()
            if "deployment" in labels:
                filters = [v for label, _, v in selector.matchers if label == "deployment"]
                assert filters and "$deployment" in filters[0], (title, selector.name)


def test_it_answers_the_questions_an_operator_asks(dashboard):
    text = "\n".join(expr for _, expr in expressions(dashboard))
    for series in (
        "roundhouse_requests_total",
        "roundhouse_admission_decisions_total",
        "deployment_stage:roundhouse_stage_seconds:p50_rate5m",
        "deployment_priority:roundhouse_time_to_first_token_seconds:p95_rate5m",
        "deployment:vllm_inter_token_latency_seconds:p95_rate5m",
        'roundhouse_deployment_slo{deployment=~"$deployment", objective="ttft_p95_seconds"}',
        'roundhouse_deployment_slo{deployment=~"$deployment", objective="itl_p95_seconds"}',
        "deployment_priority:roundhouse_queue_depth:max",
        "deployment_priority:roundhouse_queue_oldest_age_seconds:max",
        "deployment:roundhouse_backlog_tokens:max",
        "deployment:roundhouse_deployment_workers:max",
        "deployment:roundhouse_deployment_desired_replicas:max",
        "deployment:vllm_kv_cache_usage_perc:max",
        "deployment:vllm_num_requests_running:sum",
        "deployment:vllm_num_requests_waiting:sum",
        "roundhouse_encoder_batch_size_bucket",
        "roundhouse_encoder_batch_fill_ratio",
        "deployment:roundhouse_usage_ingest_lag_seconds:max",
        "topk(10, sum by (tenant) (rate(roundhouse_tenant_tokens_total",
    ):
        assert series in text, series


def test_the_stage_breakdown_is_stacked_per_deployment(dashboard):
    panels = all_panels(dashboard)
    (row,) = [p for p in panels if p["type"] == "row" and p.get("repeat") == "deployment"]
    stacked = [
        p
        for p in panels
        if p["type"] == "timeseries"
        and p["fieldConfig"]["defaults"]["custom"].get("stacking", {}).get("mode") == "normal"
        and any("roundhouse_stage_seconds" in t["expr"] for t in p["targets"])
    ]
    assert {p["title"] for p in stacked} >= {"Stage p50, stacked"}
    for panel in stacked:
        # one repeated row per deployment: the panels below it, until the next row, repeat too
        assert panel["gridPos"]["y"] == row["gridPos"]["y"] + 1
        assert all(re.search(r'deployment="\$deployment"', t["expr"]) for t in panel["targets"])


# The recorded SLIs that have no objective to burn (docs/metrics.md, "Service level indicators").
SLI_GROUPS = (
    "roundhouse-sli-streams",
    "roundhouse-sli-serving-cost",
    "roundhouse-sli-workers",
    "roundhouse-sli-breakers",
)


def test_it_draws_every_sli_from_its_recorded_series(dashboard):
    text = "\n".join(expr for _, expr in expressions(dashboard))
    recorded = [r["record"] for r in rules_load() if "record" in r and r["group"] in SLI_GROUPS]
    assert "deployment:roundhouse_stream_completion:ratio_rate5m" in recorded
    assert [name for name in recorded if name not in text] == []
