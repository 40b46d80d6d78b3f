"""Output capping through admission: a tenant that opts in gets a capped max_tokens.

In process, against the real Valkey and database, on a deployment of the demo model's own. No
worker runs: a heartbeat with one slot and a measured rate makes the deployment live and sets
what its estimates take (one reserved token: 1/20 s), so whatever it admits waits in its queue
and is ended by the test.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY

from billing.services import price_current
from config.db import db_call
from dataplane.leases import Leases
from inference.base.errors import ApiError
from inference.body.fields import CHAT
from inference.body.parser import generation_parse
from inference.pipeline import auth, submission
from inference.pipeline.admission import request_abandon
from inference.pipeline.capping import CAPPED_HEADER
from inference.pipeline.clients import dispatch_get
from inference.pipeline.submission import generation_submit
from models_registry.selectors import routing_resolve
from models_registry.services import alias_set
from tenants.keys import token_parse
from tests.conftest import own_deployment, roomy_key

pytestmark = pytest.mark.django_db

MODEL = "cap-model"
TOKENS_PER_SECOND = 20
ASKED = 1000


@pytest.fixture(scope="module")
def keys(world: Any, demo_model_dir: Any, django_db_blocker: Any) -> dict[str, str]:
    """Keys of a tenant that caps output and of one that does not, committed."""
    with django_db_blocker.unblock():
        version = own_deployment(f"{MODEL}-d", MODEL, Decimal("0.67"), demo_model_dir)
        alias_set(name=MODEL, version=version)
        roomy = {"max_tokens_per_request": ASKED}
        # A tokens-per-minute window of 300: a request asking 1,000 tokens never fits it.
        tight = {**roomy, "tokens_per_minute": 300}
        return {
            "caps": roomy_key("cap-caps", output_capping=True, **roomy),
            "runs": roomy_key("cap-runs", **roomy),
            "tight-caps": roomy_key("cap-tight-caps", output_capping=True, **tight),
            "tight-runs": roomy_key("cap-tight-runs", **tight),
        }


@pytest.fixture(autouse=True)
def no_recent_refusals() -> Any:
    submission._full_until.clear()
    yield
    submission._full_until.clear()


async def _principal(key: str) -> Any:
    return await db_call(auth.principal_of_key, token_parse(key).public_id)  # type: ignore[union-attr]


async def _live() -> str:
    routing = await db_call(routing_resolve, name=MODEL, price_of=price_current)
    assert routing is not None
    deployment = routing.primary.deployment
    await Leases(dispatch_get().redis).heartbeat(
        deployment=deployment, worker="w", ttl=60, slots=(1, 0), tokens_per_second=20
    )
    return deployment


async def _submit(
    principal: Any, *, timeout: float, max_tokens: int = ASKED, capping: bool = True
) -> Any:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
    }
    return await generation_submit(
        principal=principal,
        request=generation_parse(body, endpoint=CHAT),
        request_id=uuid.uuid4().hex,
        timeout=timeout,
        capping=capping,
    )


def _capped(deployment: str) -> float:
    labels = {"deployment": deployment}
    return REGISTRY.get_sample_value("roundhouse_max_tokens_capped_total", labels) or 0.0


async def test_a_tenant_that_caps_output_gets_the_max_tokens_that_finishes_in_time(keys):
    deployment = await _live()
    before = _capped(deployment)
    submitted = await _submit(await _principal(keys["caps"]), timeout=10.0)
    try:
        job = submitted.job
        # 10 s at 20 tokens a second serve 200 tokens, its prompt's among them.
        cap = job.sampling.max_tokens
        assert 16 <= cap <= 200 - len(job.prompt_token_ids)
        assert job.max_tokens_requested == ASKED
        assert submitted.headers()[CAPPED_HEADER] == str(cap)
        assert _capped(deployment) == before + 1
        # What is queued is the capped job: the worker runs it, and its usage names the cap.
        stored = await dispatch_get().redis.hget(f"sy:{{{deployment}}}:jobs", job.request_id)
        assert stored is not None and b"max_tokens_requested" in stored
    finally:
        await request_abandon(submitted.job)


async def test_a_tenant_that_does_not_cap_output_runs_as_asked(keys):
    await _live()
    submitted = await _submit(await _principal(keys["runs"]), timeout=10.0)
    try:
        assert submitted.job.sampling.max_tokens == ASKED
        assert submitted.job.max_tokens_requested == 0
        assert CAPPED_HEADER not in submitted.headers()
    finally:
        await request_abandon(submitted.job)


async def test_a_request_whose_answer_has_no_headers_is_not_capped(keys):
    """A WebSocket frame or a batch line could not say so: it runs as asked."""
    await _live()
    submitted = await _submit(await _principal(keys["caps"]), timeout=10.0, capping=False)
    try:
        assert submitted.job.sampling.max_tokens == ASKED
        assert CAPPED_HEADER not in submitted.headers()
    finally:
        await request_abandon(submitted.job)


async def test_a_request_that_finishes_in_time_is_not_capped(keys):
    await _live()
    submitted = await _submit(await _principal(keys["caps"]), timeout=10.0, max_tokens=50)
    try:
        assert (submitted.job.sampling.max_tokens, submitted.job.max_tokens_requested) == (50, 0)
        assert CAPPED_HEADER not in submitted.headers()
    finally:
        await request_abandon(submitted.job)


async def test_a_request_no_cap_above_the_floor_fits_runs_as_asked(keys):
    await _live()
    # 1 s serves 20 tokens: fewer than its prompt and the floor's 16.
    submitted = await _submit(await _principal(keys["caps"]), timeout=1.0)
    try:
        assert submitted.job.sampling.max_tokens == ASKED
        assert CAPPED_HEADER not in submitted.headers()
    finally:
        await request_abandon(submitted.job)


@pytest.mark.parametrize("tenant", ["caps", "runs"])
async def test_a_wait_past_the_deadline_is_refused_whether_or_not_the_tenant_caps(keys, tenant):
    await _live()
    principal = await _principal(keys[tenant])
    # Its own request ahead holds 100 tokens and more: 5 s of work before the next one starts.
    ahead = await _submit(principal, timeout=60.0, max_tokens=100)
    try:
        with pytest.raises(ApiError) as refused:
            await _submit(principal, timeout=3.0)
        assert (refused.value.status, refused.value.code) == (503, "deadline_unattainable")
    finally:
        await request_abandon(ahead.job)


async def test_a_tenant_that_caps_output_gets_what_its_tokens_per_minute_have_left(keys):
    """Instead of a 429 to wait out: the reservation (prompt + max_tokens) shrinks to fit."""
    await _live()
    submitted = await _submit(await _principal(keys["tight-caps"]), timeout=60.0)
    try:
        job = submitted.job
        assert job.sampling.max_tokens == 300 - len(job.prompt_token_ids)
        assert job.max_tokens_requested == ASKED
        assert submitted.headers()[CAPPED_HEADER] == str(job.sampling.max_tokens)
        # The window is spent now: the next request has nothing above the floor left.
        with pytest.raises(ApiError) as refused:
            await _submit(await _principal(keys["tight-caps"]), timeout=60.0)
        assert (refused.value.status, refused.value.code) == (429, "tokens_per_minute_exceeded")
    finally:
        await request_abandon(submitted.job)


async def test_a_tenant_that_does_not_cap_output_keeps_its_429(keys):
    await _live()
    with pytest.raises(ApiError) as refused:
        await _submit(await _principal(keys["tight-runs"]), timeout=60.0)
    assert (refused.value.status, refused.value.code) == (429, "tokens_per_minute_exceeded")
