"""Overload sheds the batch class first: batch work fills only its share of a queue.

Against a real Valkey, on a deployment of the test's own with one live worker heartbeat and
no free slots, so every job admitted waits in the queue.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from config.db import db_call
from dataplane.leases import Leases
from inference.base.errors import ApiError
from inference.pipeline import auth, submission
from inference.pipeline.clients import dispatch_get
from models_registry.selectors import Route
from tenants.keys import token_parse
from tests.conftest import ALIAS
from tests.jobs import job_new

pytestmark = pytest.mark.django_db


async def _route(world, *, max_queued: int, max_queued_tokens: int) -> Route:
    """The demo model's route, moved to a fresh deployment whose one worker has no free slot."""
    deployment = f"share-{uuid.uuid4().hex[:8]}"
    await Leases(dispatch_get().redis).heartbeat(
        deployment=deployment, worker="w", ttl=60, slots=(0, 0)
    )
    principal = await db_call(auth.principal_of_key, token_parse(world.acme_key).public_id)  # type: ignore[union-attr]
    routing = await submission.routing_get(ALIAS, principal=principal)
    route = routing.pick(tenant_id=world.acme.pk, user=None)
    return dataclasses.replace(
        route,
        deployment=deployment,
        max_queued=max_queued,
        max_queued_tokens=max_queued_tokens,
    )


async def _refused(route: Route, job: Any) -> str:
    with pytest.raises(ApiError) as refused:
        await submission._enqueue(route=route, job=job, model=ALIAS)
    return refused.value.code


async def test_batch_work_fills_half_the_queue_and_interactive_work_the_rest(world, settings):
    settings.ROUNDHOUSE_BATCH_QUEUE_SHARE = 0.5
    route = await _route(world, max_queued=4, max_queued_tokens=1_000_000)
    deployment = route.deployment
    for _ in range(2):
        await submission._enqueue(
            route=route, job=job_new(deployment, priority="batch"), model=ALIAS
        )
    assert await _refused(route, job_new(deployment, priority="batch")) == "queue_full"
    # The batch class is shed, and only it: interactive requests still get in.
    assert submission._queue_full_recently(deployment, "batch")
    assert not submission._queue_full_recently(deployment, "interactive")
    for _ in range(2):
        await submission._enqueue(route=route, job=job_new(deployment), model=ALIAS)
    assert await _refused(route, job_new(deployment)) == "queue_full"
    assert submission._queue_full_recently(deployment, "interactive")
    assert submission._queue_full_recently(deployment, "batch")


async def test_batch_work_takes_its_share_of_the_queued_tokens(world, settings):
    settings.ROUNDHOUSE_BATCH_QUEUE_SHARE = 0.5
    route = await _route(world, max_queued=100, max_queued_tokens=100)
    deployment = route.deployment
    # 80 tokens, more than the batch class's 50: it still gets in when nothing waits ahead.
    big = job_new(deployment, priority="batch", max_tokens=77)
    assert big.reserved_tokens == 80
    await submission._enqueue(route=route, job=big, model=ALIAS)
    assert await _refused(route, job_new(deployment, priority="batch")) == "queue_full"
    await submission._enqueue(route=route, job=job_new(deployment, max_tokens=17),
                              model=ALIAS)  # fmt: skip
    assert await _refused(route, job_new(deployment, max_tokens=1)) == "queue_full"
