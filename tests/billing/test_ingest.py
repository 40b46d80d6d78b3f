from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
from prometheus_client import REGISTRY

from billing.metrics import TenantLabels, usage_recorded
from billing.models import UsageRecord
from billing.services import usage_ingest
from dataplane.types import Status, UsageEvent

pytestmark = pytest.mark.django_db


def _event(world, **overrides) -> UsageEvent:
    now = time.time()
    fields = {
        "request_id": uuid.uuid4().hex,
        "tenant_id": world.acme.pk,
        "api_key_id": world.acme.api_keys.first().pk,
        "deployment": "tiny-chat",
        "model_version": world.version.digest,
        "endpoint": "chat.completions",
        "status": Status.OK,
        "prompt_tokens": 1000,
        "completion_tokens": 2000,
        "enqueued_at": now,
        "finished_at": now,
        **overrides,
    }
    return UsageEvent(**fields)


def test_a_replayed_event_is_recorded_once(world):
    event = _event(world)
    assert usage_ingest(events=[event]).recorded == 1
    assert usage_ingest(events=[event, event]).recorded == 0
    assert UsageRecord.objects.filter(request_id=event.request_id).count() == 1


def test_usage_is_priced_at_the_version_that_served_it(world):
    event = _event(world)
    usage_ingest(events=[event])
    record = UsageRecord.objects.get(request_id=event.request_id)
    # 1k input at 0.5 + 2k output at 1.5 per 1k.
    assert record.cost == Decimal("3.5")


def test_a_record_says_which_alias_the_client_named_when_a_fallback_answered(world):
    fell_back, plain = _event(world, fallback_from="tiny-chat-big"), _event(world)
    usage_ingest(events=[fell_back, plain])
    assert UsageRecord.objects.get(request_id=fell_back.request_id).fallback_from == (
        "tiny-chat-big"
    )
    assert UsageRecord.objects.get(request_id=plain.request_id).fallback_from == ""


def test_a_record_says_what_max_tokens_admission_capped_the_request_to(world):
    capped, plain = _event(world, capped_max_tokens=120), _event(world)
    usage_ingest(events=[capped, plain])
    assert UsageRecord.objects.get(request_id=capped.request_id).capped_max_tokens == 120
    assert UsageRecord.objects.get(request_id=plain.request_id).capped_max_tokens is None


def test_cancelled_requests_are_recorded_with_the_tokens_they_produced(world):
    event = _event(world, status=Status.CANCELLED, completion_tokens=7)
    usage_ingest(events=[event])
    record = UsageRecord.objects.get(request_id=event.request_id)
    assert record.status == "cancelled" and record.completion_tokens == 7


def test_an_event_of_an_unknown_tenant_is_refused_without_blocking_the_batch(world):
    good, orphan = _event(world), _event(world, tenant_id=987654)
    result = usage_ingest(events=[orphan, good])
    assert result.recorded == 1 and result.refused == [orphan]
    assert UsageRecord.objects.filter(request_id=good.request_id).exists()


def _billed(name: str, version: str) -> float:
    labels = {"deployment": "tiny-chat", "version": version}
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_versions_list_price_cost_and_tokens_are_counted_once_shadows_not(world):
    version = world.version.version
    cost, tokens = (
        _billed("roundhouse_billed_cost_total", version),
        _billed("roundhouse_billed_tokens_total", version),
    )
    billed, shadow = _event(world), _event(world, shadow=True)
    for batch in ([billed, shadow, billed], [billed]):  # the second is a replay
        result = usage_ingest(events=batch)
        usage_recorded(
            result.tenant_tokens,
            recorded=result.recorded,
            labels=TenantLabels(10),
            billed=result.version_billed,
        )
    # 1k input at 0.5 + 2k output at 1.5 per 1k, once.
    assert _billed("roundhouse_billed_cost_total", version) == pytest.approx(cost + 3.5)
    assert _billed("roundhouse_billed_tokens_total", version) == tokens + 3000
