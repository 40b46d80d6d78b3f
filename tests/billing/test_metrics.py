"""The ingester's per-tenant series keep their label count bounded."""

from __future__ import annotations

from billing.metrics import TenantLabels


def test_tenants_past_the_cap_are_counted_as_other():
    labels = TenantLabels(limit=2)
    assert [labels(s) for s in ("acme", "globex", "acme", "initech", "umbrella")] == [
        "acme",
        "globex",
        "acme",
        "other",
        "other",
    ]
