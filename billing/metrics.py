"""The usage ingester's Prometheus series (docs/metrics.md), served on its own port."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from prometheus_client import Counter

tenant_tokens = Counter(
    "roundhouse_tenant_tokens",
    "Billed tokens, counted once per usage record written.",
    ["tenant", "kind"],
)
usage_ingested = Counter("roundhouse_usage_ingested", "Usage records written.")
# What versions bill at list price, against their tokens: the price side of the serving cost.
billed_cost = Counter(
    "roundhouse_billed_cost",
    "List-price cost of the billed usage records written, in the price books' currency.",
    ["deployment", "version"],
)
billed_tokens = Counter(
    "roundhouse_billed_tokens",
    "Prompt and completion tokens of the billed usage records written.",
    ["deployment", "version"],
)


class TenantLabels:
    """Tenant label values with a cap: the first `limit` tenants by name, then `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._named: set[str] = set()

    def __call__(self, slug: str) -> str:
        if slug in self._named:
            return slug
        if len(self._named) < self.limit:
            self._named.add(slug)
            return slug
        return "other"


def usage_recorded(
    tokens: dict[str, tuple[int, int]],
    *,
    recorded: int,
    labels: TenantLabels,
    billed: Mapping[tuple[str, str], tuple[Decimal, int]] | None = None,
) -> None:
    """Count a written batch: its records, each tenant's prompt and completion tokens, and
    each version's billed cost and tokens."""
    usage_ingested.inc(recorded)
    for (deployment, version), (cost, used) in (billed or {}).items():
        billed_cost.labels(deployment=deployment, version=version).inc(float(cost))
        billed_tokens.labels(deployment=deployment, version=version).inc(used)
    for slug, (prompt, completion) in tokens.items():
        tenant = labels(slug)
        tenant_tokens.labels(tenant=tenant, kind="prompt").inc(prompt)
        tenant_tokens.labels(tenant=tenant, kind="completion").inc(completion)
