"""Every admin page an operator opens renders (the admin is the UI until the console lands)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root-operator"))
    return client


def test_every_changelist_and_change_page_renders(operator, world):
    for model in admin.site._registry:
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        assert operator.get(changelist).status_code == 200, changelist
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            change = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[first.pk])
            assert operator.get(change).status_code == 200, change


def test_a_quota_edited_in_the_admin_is_audited(operator, world):
    from tenants.models import AuditEvent

    quota = world.globex.quota
    url = reverse("admin:tenants_quota_change", args=[quota.pk])
    form = {
        "tenant": quota.tenant_id,
        "requests_per_minute": 77,
        "tokens_per_minute": quota.tokens_per_minute,
        "max_concurrency": quota.max_concurrency,
        "max_tokens_per_request": quota.max_tokens_per_request,
        "max_context_tokens": quota.max_context_tokens,
        "monthly_budget": quota.monthly_budget,
        "priority_weight": quota.priority_weight,
        "max_request_seconds": quota.max_request_seconds,
        "response_cache_seconds": quota.response_cache_seconds,
        "response_cache_bill_percent": quota.response_cache_bill_percent,
    }
    assert operator.post(url, form).status_code == 302
    event = AuditEvent.objects.filter(action="quota.update").latest("id")
    assert event.data == {"requests_per_minute": {"from": "600", "to": "77"}}
