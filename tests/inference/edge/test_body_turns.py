"""A tenant's large bodies are read one at a time per frontend; other tenants' are not held."""

from __future__ import annotations

import asyncio

from config.turns import Turns
from inference.base.errors import ApiError
from inference.edge import asgi
from inference.edge.asgi import _large, _Refused


def test_which_bodies_are_large(settings):
    settings.ROUNDHOUSE_LARGE_BODY_BYTES = 1000

    def scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
        return {"headers": list(headers)}

    assert not _large(scope((b"content-length", b"999")))
    assert _large(scope((b"content-length", b"1000")))
    assert _large(scope((b"transfer-encoding", b"chunked")))  # its size is unknown
    assert not _large(scope())  # no body


async def test_one_large_body_of_a_tenant_at_a_time_and_none_of_another_tenants_held(settings):
    settings.ROUNDHOUSE_LARGE_BODIES_PER_TENANT = 1
    turns = Turns(lambda: settings.ROUNDHOUSE_LARGE_BODIES_PER_TENANT)
    first = await turns.take(1)
    second = asyncio.create_task(turns.take(1))
    other = await asyncio.wait_for(turns.take(2), timeout=5)  # tenant 2 is not held
    await asyncio.sleep(0)
    assert not second.done()  # tenant 1's second body waits, unread
    first()
    first()  # ending a turn twice gives nothing back twice
    over = await asyncio.wait_for(second, timeout=5)
    third = asyncio.create_task(turns.take(1))
    await asyncio.sleep(0)
    assert not third.done()  # the double end did not let a third in
    over()
    (await asyncio.wait_for(third, timeout=5))()
    other()
    assert turns.tenants() == set()  # nobody reading or waiting: nothing kept


async def test_a_waiter_that_gives_up_takes_no_turn(settings):
    settings.ROUNDHOUSE_LARGE_BODIES_PER_TENANT = 1
    turns = Turns(lambda: settings.ROUNDHOUSE_LARGE_BODIES_PER_TENANT)
    held = await turns.take(7)
    waiting = asyncio.create_task(turns.take(7))
    await asyncio.sleep(0)
    waiting.cancel()  # its client went away
    await asyncio.gather(waiting, return_exceptions=True)
    assert turns.tenants() == {7}  # the holder still reads
    held()
    (await asyncio.wait_for(turns.take(7), timeout=5))()
    assert turns.tenants() == set()


def test_a_tenant_refused_a_moment_ago_is_refused_from_memory_until_a_retry_could_pass():
    now = [100.0]
    refused = _Refused(clock=lambda: now[0])
    error = ApiError(429, "rate_limit_exceeded", "too many", retry_after=0.25, headers={"a": "b"})
    refused.remember(7, "requests", error)
    again = refused.refusal(7, "requests")
    assert again is not None and again.code == "rate_limit_exceeded" and again.headers == {"a": "b"}
    assert refused.refusal(8, "requests") is None  # another tenant asks Valkey
    now[0] += 0.25
    assert refused.refusal(7, "requests") is None  # a retry may pass now: ask again
    # Bytes: a body as large or larger is refused from memory, a smaller one may fit.
    refused.remember(7, "bytes", ApiError(429, "body_bytes_exceeded", "x", retry_after=30), size=4)
    assert refused.refusal(7, "bytes", size=5) is not None
    assert refused.refusal(7, "bytes", size=3) is None
    now[0] += _Refused.MAX_SECONDS  # held a second at most, whatever the wait
    assert refused.refusal(7, "bytes", size=5) is None


async def test_a_throttled_tenants_429_is_held_until_a_retry_could_pass(monkeypatch):
    slept: list[float] = []
    release = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await release.wait()

    monkeypatch.setattr(asgi, "_sleep", sleep)
    release.set()
    short = await asgi.refusal_held(5, ApiError(429, "rate_limit_exceeded", "x", retry_after=0.2))
    long = await asgi.refusal_held(5, ApiError(429, "body_bytes_exceeded", "x", retry_after=30.0))
    assert slept == [0.2, asgi.HOLD_MAX_SECONDS]  # until a retry could pass, a second at most
    assert short.retry_after == 0.0 and long.retry_after == 30.0 - asgi.HOLD_MAX_SECONDS
    # At most HOLD_MAX_PER_TENANT of a tenant's refusals wait at once; the rest are answered.
    release.clear()
    waiting = [
        asyncio.create_task(
            asgi.refusal_held(6, ApiError(429, "rate_limit_exceeded", "x", retry_after=1))
        )
        for _ in range(asgi.HOLD_MAX_PER_TENANT)
    ]
    await asyncio.sleep(0)  # they all begin to wait
    at_once = await asgi.refusal_held(6, ApiError(429, "rate_limit_exceeded", "x", retry_after=1))
    assert at_once.retry_after == 1  # not held
    assert not any(task.done() for task in waiting)
    release.set()
    await asyncio.gather(*waiting)
    assert asgi._holding == {}
