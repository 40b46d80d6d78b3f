"""A request is counted against its tenant's requests per minute before its body is parsed:
a small body's count goes on while the body is read, parsed and tokenised, and admission waits
for it; a larger body is counted before a byte of it is read.

The key's lookup and the count are the boundary here (stand-ins); a real frontend answers the
same requests in tests/inference/invariants/test_cheap_checks.py.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

from dataplane.quotas import Limits
from inference.base.errors import ApiError
from inference.edge import asgi
from inference.pipeline import admission
from inference.pipeline.auth import Principal
from tenants.models import Scope

PRINCIPAL = Principal(
    tenant_id=41,
    tenant_slug="counted",
    key_id=1,
    key_public_id="k",
    scopes=frozenset({Scope.INFERENCE}),
    max_tokens_per_request=100,
    max_context_tokens=100,
    limits=Limits(
        requests_per_minute=1,
        tokens_per_minute=1000,
        max_concurrency=10,
        monthly_budget=Decimal(1),
    ),
)
REFUSAL = ApiError(429, "rate_limit_exceeded", "You have sent too many requests this minute.")


def _scope(length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [
            (b"authorization", b"Bearer rh-test"),
            (b"content-length", str(length).encode()),
        ],
    }


@pytest.fixture
def count(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The key checks out; the count waits until `answer` is set, then says `refusal`."""
    state: dict[str, Any] = {"answer": asyncio.Event(), "refusal": None, "counted": 0}

    async def key_check(token: Any) -> Principal:
        return PRINCIPAL

    async def unread_request_count(
        *, principal: Principal, size: int | None, at_once: bool = False
    ) -> Any:
        state["counted"] += 1
        await state["answer"].wait()
        return state["refusal"]

    monkeypatch.setattr(asgi, "key_check", key_check)
    monkeypatch.setattr(asgi, "unread_request_count", unread_request_count)
    monkeypatch.setattr(asgi, "counted_paths", lambda: frozenset({"/v1/chat/completions"}))
    return state


async def test_a_small_bodys_count_goes_on_while_its_body_is_read(count):
    scope = _scope(asgi.COUNTED_BESIDE_BYTES)
    # Answered while the count has no answer yet: the body is read and parsed meanwhile.
    assert await asyncio.wait_for(asgi.refusal_before_body(scope), timeout=30) is None
    pending = scope[asgi.COUNTING]
    assert scope[asgi.COUNTED] and not pending.done() and count["counted"] == 1
    admission.count_pending_set(pending)
    settled = asyncio.create_task(admission.count_pending_settle(PRINCIPAL))
    await asyncio.sleep(0)
    assert not settled.done()  # admission waits for the count
    count["answer"].set()
    await asyncio.wait_for(settled, timeout=30)  # it let the request through
    assert await admission.count_pending_refusal() is None  # settled once: nothing is left


async def test_a_small_bodys_refusal_is_raised_where_admission_waits_for_it(count):
    count["refusal"], scope = REFUSAL, _scope(100)
    await asgi.refusal_before_body(scope)
    count["answer"].set()
    admission.count_pending_set(scope[asgi.COUNTING])
    with pytest.raises(ApiError) as raised:
        await admission.count_pending_settle(PRINCIPAL)
    assert raised.value.code == "rate_limit_exceeded"


async def test_a_view_that_answers_before_admission_finds_the_counts_refusal(count):
    """A body refused for what it holds, or a replay: the count's 429 is the answer."""
    count["refusal"], scope = REFUSAL, _scope(100)
    await asgi.refusal_before_body(scope)
    count["answer"].set()
    admission.count_pending_set(scope[asgi.COUNTING])
    refusal = await admission.count_pending_refusal()
    assert refusal is not None and refusal.code == "rate_limit_exceeded"


async def test_a_count_that_fails_is_counted_again_where_admission_waits(count, monkeypatch):
    counted_again: list[int] = []

    async def request_count(*, principal: Principal) -> None:
        counted_again.append(principal.tenant_id)

    monkeypatch.setattr(admission, "request_count", request_count)
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[ApiError | None] = loop.create_future()
    failed.set_exception(ConnectionError("Valkey is away"))
    admission.count_pending_set(failed)
    await admission.count_pending_settle(PRINCIPAL)
    assert counted_again == [PRINCIPAL.tenant_id]


async def test_a_larger_body_is_counted_before_it_is_read(count):
    scope = _scope(asgi.COUNTED_BESIDE_BYTES + 1)
    before = asyncio.create_task(asgi.refusal_before_body(scope))
    await asyncio.sleep(0.05)
    assert not before.done() and count["counted"] == 1  # no byte read until it is counted
    count["answer"].set()
    assert await asyncio.wait_for(before, timeout=30) is None
    assert asgi.COUNTING not in scope and scope[asgi.COUNTED]
