"""Helpers of the privacy tests: a staff client and usage records for any tenant."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from billing.models import UsageRecord
from billing.services import usage_ingest
from dataplane.types import Status, UsageEvent

OCTOBER = dt.date(2026, 10, 1)


def usage_add(world, *, tenant, api_key_id: int = 0, at: dt.datetime | None = None) -> UsageRecord:
    """Ingest one request's usage (1000 tokens in and out) for a tenant, in October 2026."""
    at = at or dt.datetime(2026, 10, 3, tzinfo=dt.UTC)
    event = UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant_id=tenant.pk,
        api_key_id=api_key_id,
        deployment="tiny-chat",
        model_version=world.version.digest,
        endpoint="chat.completions",
        status=Status.OK,
        prompt_tokens=1000,
        completion_tokens=1000,
        enqueued_at=at.timestamp(),
        finished_at=at.timestamp(),
    )
    usage_ingest(events=[event])
    return UsageRecord.objects.get(request_id=event.request_id)


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("petra", is_staff=True))
    return client
