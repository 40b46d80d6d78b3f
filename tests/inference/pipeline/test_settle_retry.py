"""A request's settling keeps trying while Redis is unreachable, and only then."""

from __future__ import annotations

import pytest
import redis

from dataplane.redis_client import until_reachable


async def test_it_tries_again_until_redis_answers():
    calls: list[int] = []

    async def give_back() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise redis.ConnectionError("Connection refused")
        return "given back"

    assert await until_reachable(give_back, "give back a reservation") == "given back"
    assert len(calls) == 3


async def test_another_error_is_raised_at_once():
    calls: list[int] = []

    async def broken() -> None:
        calls.append(1)
        raise redis.ResponseError("NOSCRIPT")

    with pytest.raises(redis.ResponseError):
        await until_reachable(broken, "give back a reservation")
    assert len(calls) == 1


async def test_it_gives_up_after_a_while():
    calls: list[int] = []

    async def down() -> None:
        calls.append(1)
        raise redis.TimeoutError("still away")

    with pytest.raises(redis.TimeoutError):
        await until_reachable(down, "give back a reservation", within=0.25)
    assert 2 <= len(calls) <= 4  # 0.1 s, then 0.2 s between tries
