"""A tenant's large bodies are read one at a time per frontend; other tenants' are not held."""

from __future__ import annotations

import asyncio

from inference.asgi import _large, _Turns


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
    turns = _Turns()
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
    turns = _Turns()
    held = await turns.take(7)
    waiting = asyncio.create_task(turns.take(7))
    await asyncio.sleep(0)
    waiting.cancel()  # its client went away
    await asyncio.gather(waiting, return_exceptions=True)
    assert turns.tenants() == {7}  # the holder still reads
    held()
    (await asyncio.wait_for(turns.take(7), timeout=5))()
    assert turns.tenants() == set()
