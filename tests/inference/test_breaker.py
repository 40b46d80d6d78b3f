"""An alias's circuit breaker: when it opens, sends requests on, probes and closes (no I/O)."""

from __future__ import annotations

import pytest

from dataplane.types import Failed, Finished
from inference import breaker as breakers
from inference.breaker import Breaker, breaker_admits, breaker_ended, breakers_reset


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: Clock) -> Breaker:
    return Breaker(window=30, min_requests=4, failure_share=0.5, open_seconds=15, clock=clock)


def _fail(b: Breaker, n: int, prefix: str = "r") -> bool:
    return any([b.ended(f"{prefix}{i}", failed=True) for i in range(n)])


def test_it_opens_once_enough_recent_requests_failed_and_not_before():
    clock = Clock()
    b = _breaker(clock)
    assert not _fail(b, 3)  # three ends are fewer than the minimum
    assert b.state == "closed" and b.admits("x")
    assert b.ended("ok", failed=False) is True  # 3 of 4 failed: open
    assert b.state == "open"
    assert not b.admits("y")


def test_successes_keep_it_closed_and_old_failures_are_forgotten():
    clock = Clock()
    b = _breaker(clock)
    for i in range(10):
        b.ended(f"ok{i}", failed=False)
    _fail(b, 5)  # 5 of 15
    assert b.state == "closed"
    clock.now += 31  # the window moved past all of them
    _fail(b, 3, "late")
    assert b.state == "closed"  # three ends in the window: below the minimum
    b.ended("late3", failed=True)
    assert b.state == "open"


def test_after_a_while_one_probe_goes_through_and_its_success_closes_it():
    clock = Clock()
    b = _breaker(clock)
    _fail(b, 4)
    clock.now += 15
    assert b.state == "half_open"
    assert b.admits("probe")
    assert not b.admits("another")  # one probe at a time
    # The end of a request admitted before it opened decides nothing.
    assert not b.ended("r1", failed=False)
    assert b.state == "half_open"
    assert b.ended("probe", failed=False) is True
    assert b.state == "closed" and b.admits("next")
    assert not _fail(b, 3)  # counting starts again from nothing
    assert b.state == "closed"


def test_a_failed_probe_opens_it_again():
    clock = Clock()
    b = _breaker(clock)
    _fail(b, 4)
    clock.now += 16
    assert b.admits("probe")
    assert not b.ended("probe", failed=True)
    assert b.state == "open"
    clock.now += 14
    assert not b.admits("soon")
    clock.now += 1
    assert b.admits("probe2")


def test_a_probe_that_never_ends_makes_way_for_another():
    clock = Clock()
    b = _breaker(clock)
    _fail(b, 4)
    clock.now += 15
    assert b.admits("gone")  # its client left: no end will come
    clock.now += 14
    assert not b.admits("waiting")
    clock.now += 1
    assert b.admits("next-probe")


@pytest.fixture
def fresh(settings):
    settings.ROUNDHOUSE_BREAKER_MIN_REQUESTS = 2
    settings.ROUNDHOUSE_BREAKER_FAILURE_SHARE = 1.0
    breakers_reset()
    yield
    breakers_reset()


def _failed(code: str) -> Failed:
    return Failed(code=code, message="", prompt_tokens=1, completion_tokens=0)


def test_only_the_platforms_failures_count(fresh):
    for i, code in enumerate(("invalid_request_error", "cancelled", "timeout", "relay_failed")):
        breaker_ended("m", f"a{i}", _failed(code))
    assert breaker_admits("m", "x")
    breaker_ended("m", "b1", _failed("engine_error"))
    breaker_ended("m", "b2", _failed("worker_lost"))
    assert not breaker_admits("m", "y")
    assert breaker_admits("other", "z")  # one breaker per alias


def test_a_success_is_counted(fresh):
    breaker_ended("m", "a", Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1))
    breaker_ended("m", "b", _failed("engine_error"))
    assert breaker_admits("m", "x")  # 1 of 2 failed; the share asked is all of them


def test_a_minimum_of_zero_turns_the_breakers_off(fresh, settings):
    settings.ROUNDHOUSE_BREAKER_MIN_REQUESTS = 0
    for i in range(5):
        breaker_ended("m", f"a{i}", _failed("engine_error"))
    assert breaker_admits("m", "x")
    assert "m" not in breakers._breakers
