"""A give-back is tried twice: after Redis restarts, each pooled connection fails once."""

from __future__ import annotations

import pytest

from inference.admission import twice


async def test_a_call_that_fails_once_is_tried_again():
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("stale pooled connection")
        return "given back"

    assert await twice(flaky) == "given back"
    assert len(calls) == 2


async def test_a_call_that_works_runs_once_and_one_that_keeps_failing_raises():
    calls: list[int] = []

    async def fine() -> int:
        calls.append(1)
        return 7

    assert await twice(fine) == 7
    assert len(calls) == 1

    async def down() -> None:
        calls.append(1)
        raise ConnectionError("still down")

    with pytest.raises(ConnectionError, match="still down"):
        await twice(down)
    assert len(calls) == 3
