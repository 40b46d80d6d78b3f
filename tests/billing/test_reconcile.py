"""Reconciliation of admitted, finished and recorded requests per deployment and hour."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from billing.reconcile import usage_reconcile
from billing.services import usage_ingest
from dataplane.keys import ledger_key
from dataplane.redis_client import redis_sync_client
from dataplane.types import Status, UsageEvent
from models_registry.services import deployment_create

pytestmark = pytest.mark.django_db
HOUR = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
NOW = HOUR + dt.timedelta(days=1)


@pytest.fixture
def deployment(world):
    made = deployment_create(name=f"recon-{uuid.uuid4().hex[:6]}", version=world.version)
    yield made
    redis_sync_client().delete(ledger_key(made.name))


def _record(world, deployment, *, tokens=(10, 20)):
    at = (HOUR + dt.timedelta(minutes=5)).timestamp()
    event = UsageEvent(
        request_id=uuid.uuid4().hex, tenant_id=world.acme.pk, api_key_id=0,
        deployment=deployment.name, model_version=world.version.digest, endpoint="completions",
        status=Status.OK, prompt_tokens=tokens[0], completion_tokens=tokens[1],
        enqueued_at=at, finished_at=at + 1,
    )  # fmt: skip
    usage_ingest(events=[event])


def _ledger(deployment, **fields):
    redis_sync_client().hset(
        ledger_key(deployment.name), mapping={f"2026112009:{k}": v for k, v in fields.items()}
    )


def _row(deployment):
    (row,) = [r for r in usage_reconcile(hours=48, now=NOW) if r.deployment == deployment.name]
    return row


def test_an_hour_whose_counts_agree_reconciles(world, deployment):
    _ledger(deployment, admitted=2, finished=2, tokens=60)
    _record(world, deployment)
    _record(world, deployment)
    row = _row(deployment)
    assert (row.admitted, row.finished, row.recorded, row.recorded_tokens) == (2, 2, 2, 60)
    assert row.settled and row.problems == []


def test_a_lost_usage_event_and_a_request_that_never_ended_are_named(world, deployment):
    _ledger(deployment, admitted=3, finished=2, tokens=60)
    _record(world, deployment)
    problems = _row(deployment).problems
    assert "admitted 3 but finished 2" in problems
    assert "finished 2 but 1 usage records" in problems
    assert "finished 60 tokens but records hold 30" in problems


def test_the_command_exits_1_on_a_difference(world, deployment, capsys):
    _ledger(deployment, admitted=1, finished=1, tokens=30)
    with pytest.raises(CommandError, match="do not reconcile"):
        call_command(
            "usage_reconcile", "--hours", str(48 + int((time.time() - NOW.timestamp()) // 3600))
        )
    assert deployment.name in capsys.readouterr().out
