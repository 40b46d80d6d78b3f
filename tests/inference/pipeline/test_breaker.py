"""An alias's circuit breakers: when they open, send requests on, probe and close, and whose
requests they hold back (no I/O)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from dataplane.breakers import breaker_message_read
from dataplane.types import Failed, Finished
from inference.pipeline import breaker as breakers
from inference.pipeline.breaker import (
    Breaker,
    breaker_admits,
    breaker_ended,
    breakers_observe,
    breakers_reset,
)


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


def test_it_holds_while_open_or_while_its_probe_is_out():
    clock = Clock()
    b = _breaker(clock)
    assert not b.holding
    _fail(b, 4)
    assert b.holding
    clock.now += 15
    assert not b.holding  # half-open, nobody probing
    assert b.admits("probe")
    assert b.holding
    clock.now += 15
    assert not b.holding  # the probe never ended


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
    settings.ROUNDHOUSE_BREAKER_MIN_TENANTS = 2
    breakers_reset()
    yield
    breakers_reset()


def _failed(code: str) -> Failed:
    return Failed(code=code, message="", prompt_tokens=1, completion_tokens=0)


A, B, C = 1, 2, 3  # tenants


def test_only_the_platforms_failures_count(fresh):
    for i, code in enumerate(("invalid_request_error", "cancelled", "timeout", "relay_failed")):
        breaker_ended("m", A, f"a{i}", _failed(code))
    assert breaker_admits("m", A, "x")
    breaker_ended("m", A, "b1", _failed("engine_error"))
    breaker_ended("m", A, "b2", _failed("worker_lost"))
    assert not breaker_admits("m", A, "y")
    assert breaker_admits("other", A, "z")  # one breaker per alias


def test_a_success_is_counted(fresh):
    ok = Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    breaker_ended("m", A, "a", ok)
    breaker_ended("m", A, "b", _failed("engine_error"))
    assert breaker_admits("m", A, "x")  # 1 of 2 failed; the share asked is all of them


def test_one_tenants_failures_hold_back_its_own_requests_only(fresh):
    breaker_ended("m", A, "a1", _failed("engine_error"))
    breaker_ended("m", A, "a2", _failed("engine_error"))
    assert not breaker_admits("m", A, "x")
    assert breaker_admits("m", B, "y")  # B's requests did not fail: they still go to it
    assert breaker_admits("m", C, "z")


def test_once_two_tenants_breakers_hold_every_tenants_requests_go_on(fresh):
    for tenant in (A, B):
        breaker_ended("m", tenant, f"{tenant}-1", _failed("worker_lost"))
        breaker_ended("m", tenant, f"{tenant}-2", _failed("worker_lost"))
    assert not breaker_admits("m", C, "z")  # C never failed here, and is held back too
    assert breaker_admits("other", C, "z")


def test_the_hold_on_every_tenant_lifts_when_the_failing_tenants_go_quiet(fresh, settings):
    clock = Clock()
    breakers._alias_breakers("m").make = lambda: Breaker(
        window=30, min_requests=2, failure_share=1.0, open_seconds=15, clock=clock
    )
    for tenant in (A, B):
        breaker_ended("m", tenant, f"{tenant}-1", _failed("engine_error"))
        breaker_ended("m", tenant, f"{tenant}-2", _failed("engine_error"))
    assert not breaker_admits("m", C, "c1")
    clock.now += 15  # both half-open, and nobody probes: nothing holds C back
    assert breaker_admits("m", C, "c2")
    assert breaker_admits("m", A, "probe-a") and breaker_admits("m", B, "probe-b")
    assert not breaker_admits("m", C, "c3")  # both probes are out: both hold again
    breaker_ended("m", A, "probe-a", _failed("engine_error"))
    assert not breaker_admits("m", A, "a3") and not breaker_admits("m", C, "c4")
    clock.now += 15  # B's probe never ended, and A, half-open again, is not probing
    assert breaker_admits("m", C, "c5")


def test_one_tenant_is_enough_when_the_setting_says_so(fresh, settings):
    settings.ROUNDHOUSE_BREAKER_MIN_TENANTS = 1
    breaker_ended("m", A, "a1", _failed("engine_error"))
    breaker_ended("m", A, "a2", _failed("engine_error"))
    assert not breaker_admits("m", B, "y")


def test_idle_tenants_breakers_are_forgotten(fresh):
    clock = Clock()
    breakers._alias_breakers("m").make = lambda: Breaker(
        window=30, min_requests=2, failure_share=1.0, open_seconds=15, clock=clock
    )
    ok = Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    for tenant in range(100, 100 + breakers._SWEEP_EVERY - 2):
        breaker_ended("m", tenant, "r", ok)
    breaker_ended("m", A, "a1", _failed("engine_error"))  # A's breaker has a failure counted
    clock.now += 31
    breaker_ended("m", B, "b1", ok)  # the sweep: the idle ones go, A's recent-less too
    assert set(breakers._breakers["m"].tenants) == {B}


def test_a_minimum_of_zero_turns_the_breakers_off(fresh, settings):
    settings.ROUNDHOUSE_BREAKER_MIN_REQUESTS = 0
    for i in range(5):
        breaker_ended("m", A, f"a{i}", _failed("engine_error"))
    assert breaker_admits("m", A, "x")
    assert "m" not in breakers._breakers


def test_a_tenant_held_by_another_frontends_breaker_is_held_here_until_then(fresh):
    soon = time.time() + 60
    news = breaker_message_read(f"{A}:m {soon}")
    assert news == ("m", A, soon)
    breakers.breaker_elsewhere(*news)
    assert not breaker_admits("m", A, "x")  # held here too, with no failure seen here
    assert breaker_admits("m", B, "y")  # one tenant's, as a breaker here would be
    breakers.breaker_elsewhere("m", B, soon)
    assert not breaker_admits("m", C, "z")  # two tenants held (elsewhere): every tenant goes on
    breakers.breaker_elsewhere("m", B, 0)  # B's closed where it opened
    assert breaker_admits("m", B, "y") and breaker_admits("m", C, "z")
    breakers.breakers_elsewhere_replace({("m", A): time.time() - 1})  # lapsed: holds nothing
    assert breaker_admits("m", A, "x")
    assert breaker_message_read("not a message") is None


def test_opening_again_after_a_failed_probe_is_told_as_an_opening(fresh):
    clock = Clock()
    alias = breakers._alias_breakers("m")
    alias.make = lambda: Breaker(
        window=30, min_requests=2, failure_share=1.0, open_seconds=15, clock=clock
    )
    assert alias.ended(A, "a1", failed=True)[2] is False
    assert alias.ended(A, "a2", failed=True)[2] is True  # opened: told
    clock.now += 15
    assert alias.admits(A, "probe")
    assert alias.ended(A, "probe", failed=True)[2] is True  # opened again: told, a new until
    clock.now += 15
    assert alias.admits(A, "probe2")
    assert alias.ended(A, "probe2", failed=False)[2] is True  # closed: told


def _gauge(alias: str) -> float | None:
    return REGISTRY.get_sample_value("roundhouse_breaker_state", {"model": alias})


def test_the_state_gauge_follows_the_worst_of_the_aliass_breakers(fresh):
    clock = Clock()
    breakers._alias_breakers("gauged").make = lambda: Breaker(
        window=30, min_requests=2, failure_share=1.0, open_seconds=15, clock=clock
    )
    ok = Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    breaker_ended("gauged", B, "b1", ok)
    breakers_observe()
    assert _gauge("gauged") == 0  # closed
    breaker_ended("gauged", A, "a1", _failed("engine_error"))
    breaker_ended("gauged", A, "a2", _failed("engine_error"))
    assert _gauge("gauged") == 2  # A's opened; B's is closed: the worst is shown
    clock.now += 15
    breakers_observe()  # no request came: time alone turned it half-open
    assert _gauge("gauged") == 1
    assert breaker_admits("gauged", A, "probe")
    breaker_ended("gauged", A, "probe", ok)
    assert _gauge("gauged") == 0
