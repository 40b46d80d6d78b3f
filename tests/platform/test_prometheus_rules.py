"""The SLO recording rules and alerts of platform/prometheus.

The structural tests always run; those that need Prometheus's promtool (Debian's `prometheus`
package) skip without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from tests.platform.contract import (
    PROMETHEUS_DIR,
    ROOT,
    RULE_FILES,
    contract_load,
    problems,
    rules_load,
    selectors,
)

WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# (burn rate, long window, short window) per severity: the SRE workbook's table for 30 days.
BURN_RATES = {
    "page": {("14.4", "1h", "5m"), ("6", "6h", "30m")},
    "ticket": {("3", "1d", "2h"), ("1", "3d", "6h")},
}
SLIS = (
    "deployment:roundhouse_ttft_slo_errors",
    "deployment:roundhouse_itl_slo_errors",
    "deployment:roundhouse_availability_errors",
    "roundhouse:api_errors",
)
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)


def _recorded(rules: list[dict]) -> set[str]:
    return {rule["record"] for rule in rules if "record" in rule}


def test_every_rule_names_only_documented_or_recorded_series():
    contract = contract_load()
    rules = rules_load()
    recorded = _recorded(rules)
    found = {
        rule.get("record") or rule["alert"]: problems(rule["expr"], contract, recorded)
        for rule in rules
    }
    assert {name: p for name, p in found.items() if p} == {}


def test_the_contract_check_catches_an_undocumented_label_and_value():
    contract = contract_load()
    assert problems('roundhouse_requests_total{deployment="chat"}', contract, set()) == [
        "roundhouse_requests_total: no label 'deployment'"
    ]
    assert problems(
        'roundhouse_worker_requests_total{status=~"error|worker-lost"}', contract, set()
    ) == ["roundhouse_worker_requests_total: status values ['worker-lost'] are not documented"]
    assert problems("roundhouse_queue_depth_bucket", contract, set()) == [
        "roundhouse_queue_depth_bucket: not in docs/metrics.md nor recorded"
    ]


def test_rules_are_well_formed():
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert len({g["name"] for g in groups}) == len(groups)
    for rule in rules_load():
        assert ("record" in rule) != ("alert" in rule), rule
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        if "record" in rule:
            # level:metric:operations
            assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook():
    alerts = [rule for rule in rules_load() if "alert" in rule]
    assert alerts
    for alert in alerts:
        assert alert["labels"]["severity"] in {"page", "ticket"}, alert["alert"]
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], alert["alert"]
        assert re.fullmatch(r"docs/runbook\.md#[a-z0-9-]+", annotations["runbook_url"]), alert


def test_every_sli_is_recorded_over_every_window_with_the_same_expression():
    rules = {rule["record"]: rule for rule in rules_load() if "record" in rule}
    for sli in SLIS:
        base = rules[f"{sli}:ratio_rate5m"]["expr"]
        assert "[5m]" in base
        for window in WINDOWS:
            rule = rules[f"{sli}:ratio_rate{window}"]
            assert rule["expr"] == base.replace("[5m]", f"[{window}]"), (sli, window)


def test_slo_alerts_pair_the_standard_burn_rates_and_windows():
    slo_alerts = [rule for rule in rules_load() if "alert" in rule and "slo" in rule["labels"]]
    assert {rule["alert"] for rule in slo_alerts} == {
        "RoundhouseTTFTBudgetBurn",
        "RoundhouseITLBudgetBurn",
        "RoundhouseAvailabilityBudgetBurn",
        "RoundhouseAPIErrorBudgetBurn",
    }
    for rule in slo_alerts:
        pairs = set()
        for branch in re.split(r"\n\s*or\n", rule["expr"]):
            found = re.findall(r"ratio_rate(\w+) > \(([\d.]+) \*", branch)
            (long, rate_long), (short, rate_short) = found
            assert rate_long == rate_short
            pairs.add((rate_long, long, short))
        assert pairs == BURN_RATES[rule["labels"]["severity"]], rule["alert"]


def _le_values(metric: str) -> set[str]:
    return {
        value
        for rule in rules_load()
        for selector in selectors(rule["expr"])
        if selector.name == f"{metric}_bucket"
        for label, _, value in selector.matchers
        if label == "le"
    }


def test_latency_thresholds_are_bucket_boundaries_of_their_histograms():
    from vllm.v1.metrics.buckets import histogram_buckets

    from inference.base.metrics import TTFT_BUCKETS

    ttft = {floatToGoString(b) for b in TTFT_BUCKETS}
    itl = {floatToGoString(b) for b in histogram_buckets("inter_token_latency")}
    assert _le_values("roundhouse_time_to_first_token_seconds") == {"2.0"} <= ttft
    assert _le_values("vllm:inter_token_latency_seconds") == {"0.2"} <= itl


def test_the_default_thresholds_are_the_registrys_defaults():
    """The rules measure what `create_deployment` sets when given no objective."""
    from models_registry.models import Deployment

    fields = {f.name: f.default for f in Deployment._meta.get_fields() if hasattr(f, "default")}
    assert floatToGoString(fields["slo_ttft_p95_ms"] / 1000) == "2.0"
    assert floatToGoString(fields["slo_itl_p95_ms"] / 1000) == "0.2"
    assert float(fields["slo_availability"]) == 0.999


def runbook_anchors(paths: list[Path]) -> set[str]:
    anchors = set()
    for path in paths:
        anchors |= set(re.findall(r"runbook\.md#([a-z0-9-]+)", path.read_text()))
    return anchors


def test_runbook_links_resolve_to_sections_of_docs_runbook():
    runbook = ROOT / "docs" / "runbook.md"
    if not runbook.exists():
        pytest.skip("docs/runbook.md is not written yet")
    text = re.sub(r"^```.*?^```", "", runbook.read_text(), flags=re.M | re.S)
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
    explicit = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    missing = runbook_anchors(list(RULE_FILES)) - headings - explicit
    assert missing == set()


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_accepts_the_rule_files():
    result = _promtool("check", "rules", *(p.name for p in RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_pass():
    tests = sorted(p.name for p in (PROMETHEUS_DIR / "tests").glob("*.yml"))
    assert tests
    result = _promtool("test", "rules", *tests, cwd=PROMETHEUS_DIR / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_sli_alert_is_tested_firing_and_staying_silent():
    """Each alert on the SLIs has a promtool case where it fires and one where it does not."""
    sli_alerts = {r["alert"] for r in rules_load() if r["group"] == "roundhouse-sli-alerts"}
    assert sli_alerts
    cases = [
        case
        for group in yaml.safe_load((PROMETHEUS_DIR / "tests" / "slis.test.yml").read_text())[
            "tests"
        ]
        for case in group.get("alert_rule_test", [])
    ]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    silent = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert sli_alerts <= fires
    assert sli_alerts <= silent


@needs_promtool
@pytest.mark.parametrize(
    ("original", "mutant"),
    [
        # A page threshold too high to catch a 90 % burn.
        ("(14.4 * 0.05)", "(19 * 0.05)"),
        # The short window gone: the page would outlast the burn.
        (
            "deployment:roundhouse_ttft_slo_errors:ratio_rate30m > (6 * 0.05)",
            "deployment:roundhouse_ttft_slo_errors:ratio_rate6h > (6 * 0.05)",
        ),
    ],
)
def test_the_unit_tests_catch_a_broken_burn_rate_alert(tmp_path, original, mutant):
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "prometheus")
    alerts = tmp_path / "prometheus" / "alert-rules.yml"
    text = alerts.read_text()
    assert original in text
    alerts.write_text(text.replace(original, mutant))
    result = _promtool(
        "test", "rules", "latency-slo.test.yml", cwd=tmp_path / "prometheus" / "tests"
    )
    assert result.returncode != 0
    assert "RoundhouseTTFTBudgetBurn" in result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize(
    ("path", "original", "mutant", "named"),
    [
        # Without the zero branch a deployment none of whose streams completes has no ratio,
        # and the page that matters most never fires.
        (
            "recording-rules.yml",
            '0 * sum by (deployment) (rate(roundhouse_streams_ended_total{outcome=~"completed|error|worker_lost|timeout|relay_failed"}[5m]))',  # noqa: E501
            'sum by (deployment) (rate(roundhouse_streams_ended_total{outcome="completed"}[5m]))',
            "RoundhouseStreamsCut",
        ),
        # Client cuts counted as the platform's: a healthy deployment pages.
        ("recording-rules.yml", "completed|error|worker_lost", "completed|client_gone|error", ""),
        ("alert-rules.yml", '{reason="oom"}[15m])) > 0', '{reason="oom"}[15m])) > 1', ""),
        ("alert-rules.yml", "[2m]) >= 2", "[2m]) >= 1", "RoundhouseBreakerOpen"),
    ],
)
def test_the_unit_tests_catch_a_broken_sli_rule(tmp_path, path, original, mutant, named):
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "prometheus")
    rules = tmp_path / "prometheus" / path
    text = rules.read_text()
    assert original in text
    rules.write_text(text.replace(original, mutant))
    result = _promtool("test", "rules", "slis.test.yml", cwd=tmp_path / "prometheus" / "tests")
    assert result.returncode != 0
    assert named in result.stdout + result.stderr
