"""Budget alerts at 50, 80 and 100 % of a tenant's monthly budget."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from billing.budgets import budget_alerts_check, budget_banner
from billing.services import usage_ingest
from dataplane.types import Status, UsageEvent
from tenants.services import membership_add, tenant_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant(world):
    made = tenant_create(slug=f"spender-{uuid.uuid4().hex[:6]}")
    made.quota.monthly_budget = Decimal("10.00")
    made.quota.save()
    membership_add(
        tenant=made, username=f"{made.slug}-cfo", role="finance", email="cfo@example.com"
    )
    membership_add(tenant=made, username=f"{made.slug}-dev", role="member", email="dev@example.com")
    return made


def _spend(world, tenant, dollars: int) -> None:
    """Ingest requests costing `dollars` in total (1k in + 1k out cost 2.00 at the test prices)."""
    now = timezone.now().timestamp()
    events = [
        UsageEvent(
            request_id=uuid.uuid4().hex,
            tenant_id=tenant.pk,
            api_key_id=0,
            deployment="tiny-chat",
            model_version=world.version.digest,
            endpoint="completions",
            status=Status.OK,
            prompt_tokens=1000,
            completion_tokens=1000,
            enqueued_at=now,
            finished_at=now,
        )
        for _ in range(dollars // 2)
    ]
    usage_ingest(events=events)


def test_each_threshold_is_sent_once_to_admins_and_finance(world, tenant, mailoutbox):
    _spend(world, tenant, 4)
    assert budget_alerts_check() == [] and mailoutbox == []
    _spend(world, tenant, 2)  # 6.00 of 10.00
    (alert,) = budget_alerts_check()
    assert alert.threshold == 50 and alert.spent == Decimal("6.00")
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["cfo@example.com"]
    assert "50%" in mailoutbox[0].subject
    assert budget_alerts_check() == [] and len(mailoutbox) == 1  # not again
    _spend(world, tenant, 6)  # 12.00: past 80 and 100 at once, one email for the top one
    alerts = budget_alerts_check()
    assert [a.threshold for a in alerts] == [80, 100]
    assert len(mailoutbox) == 2 and "100%" in mailoutbox[1].subject
    assert "budget_exceeded" in mailoutbox[1].body
    banner = budget_banner(tenant=tenant)
    assert banner is not None and banner.threshold == 100


def test_the_budget_endpoint_shows_spend_and_the_banner(world, tenant):
    _spend(world, tenant, 8)
    budget_alerts_check()
    staff = APIClient()
    staff.force_login(User.objects.create_user("bea", is_staff=True))
    body = staff.get("/api/finance/budget", {"tenant": tenant.slug}).json()
    assert body["spent"] == "8.00" and body["percent"] == 80.0
    assert body["banner"]["threshold"] == 80
