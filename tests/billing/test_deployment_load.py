"""Operators' view of each deployment's load, counted from the usage records."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from billing.selectors import deployment_load
from billing.services import usage_ingest
from dataplane.types import Status, UsageEvent

pytestmark = pytest.mark.django_db
START = dt.datetime(2026, 11, 21, 14, 0, tzinfo=dt.UTC)


def _event(
    world, deployment, *, minute, ttft_ms, tokens=10, status=Status.OK, start=START, **fields
):
    at = (start + dt.timedelta(minutes=minute, seconds=20)).timestamp()
    return UsageEvent(
        request_id=uuid.uuid4().hex, tenant_id=world.acme.pk, api_key_id=0,
        deployment=deployment, model_version=world.version.digest, endpoint="chat",
        status=status, prompt_tokens=5, completion_tokens=tokens, enqueued_at=at,
        first_token_at=None if ttft_ms is None else at + ttft_ms / 1000, finished_at=at + 2,
        **fields,
    )  # fmt: skip


def test_a_deployments_minutes_count_requests_failures_tokens_and_the_ttft_tail(world):
    name = f"load-{uuid.uuid4().hex[:6]}"
    usage_ingest(
        events=[
            *[_event(world, name, minute=1, ttft_ms=ms) for ms in range(10, 110, 10)],
            _event(world, name, minute=1, ttft_ms=None, tokens=0, status=Status.ERROR),
            _event(world, name, minute=3, ttft_ms=40, tokens=7),
            # Not the deployment's load: answered from the tenant's response cache.
            _event(world, name, minute=3, ttft_ms=1, tokens=99, response_cache=True),
            # Cancelled by its client: served, not failed.
            _event(world, name, minute=3, ttft_ms=30, tokens=2, status=Status.CANCELLED),
            # Finished after the window.
            _event(world, name, minute=59, ttft_ms=10),
        ]
    )
    minutes, whole = deployment_load(since=START, until=START + dt.timedelta(minutes=59))
    mine = [m for m in minutes if m.deployment == name]
    assert [m.start for m in mine] == [
        START + dt.timedelta(minutes=1),
        START + dt.timedelta(minutes=3),
    ]
    first, third = mine
    assert (first.requests, first.failed, first.completion_tokens) == (11, 1, 100)
    # The continuous percentiles of 10, 20, ... 100 ms (the failed request had no token).
    assert first.ttft_p50_ms == pytest.approx(55.0)
    assert first.ttft_p95_ms == pytest.approx(95.5)
    assert (third.requests, third.failed, third.completion_tokens) == (2, 0, 9)
    (total,) = [w for w in whole if w.deployment == name]
    assert total.start is None
    assert (total.requests, total.failed, total.completion_tokens) == (13, 1, 109)


def test_a_window_without_requests_has_no_load(world):
    minutes, whole = deployment_load(
        since=START - dt.timedelta(days=400), until=START - dt.timedelta(days=399)
    )
    assert minutes == [] and whole == []


def test_the_operations_page_charts_each_deployments_last_hour(world, client):
    from django.contrib.auth.models import User
    from django.utils import timezone

    name = f"ops-{uuid.uuid4().hex[:6]}"
    start = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
    usage_ingest(
        events=[
            _event(world, name, minute=0, ttft_ms=25, tokens=12, start=start),
            _event(
                world, name, minute=0, ttft_ms=None, tokens=0, status=Status.TIMEOUT, start=start
            ),
        ]
    )
    client.force_login(User.objects.create_user("ops-hour", is_staff=True))
    answer = client.get("/console/ops/")
    assert answer.status_code == 200
    chart = answer.context["hour_chart"]
    assert len(chart["labels"]) == 60
    (line,) = [d for d in chart["deployments"] if d["name"] == name]
    i = chart["labels"].index(start.strftime("%H:%M"))
    assert line["tokens"][i] == 12 and line["failed"][i] == 1
    assert line["ttft_p95"][i] == pytest.approx(25.0, abs=0.5)
    # A minute without requests: no tokens, and a gap in the latency line.
    assert line["ttft_p95"][i + 1] is None and line["tokens"][i + 1] == 0
    page = answer.content.decode()
    assert 'data-chart="hour_tokens"' in page and f"<td>{name}</td>" in page


def test_the_last_hour_is_for_staff_only(world, client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("not-ops"))
    assert client.get("/console/ops/").status_code in (403, 404)
