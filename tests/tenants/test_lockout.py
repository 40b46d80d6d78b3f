"""One sign-in lockout for every way a password comes in: console, Django admin, HTTP Basic."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client

from tenants import lockout
from tenants.lockout import LOCKED_ACTION, UNLOCKED_ACTION, lockout_reset
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "pw-olga-correct"
LOCKED = "Too many failed sign-ins"
NAMES = ("olga", "bob", "nobody")


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    # The counters live in Valkey, which no test transaction rolls back.
    for name in NAMES:
        lockout_reset(username=name)
    yield
    for name in NAMES:
        lockout_reset(username=name)


@pytest.fixture
def olga() -> User:
    """An operator: staff, so the management API and the admin let her in."""
    return User.objects.create_user("olga", password=PASSWORD, is_staff=True)


def _basic(username: str, password: str) -> str:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    answer = Client().get("/api/tenants/acme/quota", HTTP_AUTHORIZATION=f"Basic {token}")
    # 403 rather than 401 because session authentication comes first (it sends no challenge).
    return {200: "in", 401: "refused", 403: "refused"}.get(answer.status_code, str(answer))


def _admin(username: str, password: str) -> str:
    form = {"username": username, "password": password, "next": "/admin/"}
    answer = Client().post("/admin/login/?next=/admin/", form)
    return "in" if answer.status_code == 302 else f"form again ({answer.status_code})"


def _last_audit_id() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _console(username: str, password: str) -> str:
    answer = Client().post("/console/login", {"username": username, "password": password})
    return "signed in" if answer.status_code == 302 else answer.content.decode()


def test_basic_auth_on_the_api_refuses_the_right_password_after_repeated_failures(world, olga):
    assert [_basic("olga", "wrong") for _ in range(12)] == ["refused"] * 12
    assert _basic("olga", PASSWORD) == "refused"


def test_the_admin_login_refuses_the_right_password_after_repeated_failures(world, olga):
    assert [_admin("olga", "wrong") for _ in range(12)] == ["form again (200)"] * 12
    assert _admin("olga", PASSWORD) == "form again (200)"


def test_a_lock_reached_in_the_console_also_closes_basic_auth_and_the_admin(world, olga):
    for _ in range(settings.ROUNDHOUSE_LOGIN_FAILURES):
        assert LOCKED not in _console("olga", "wrong")
    assert LOCKED in _console("olga", PASSWORD)
    assert _basic("olga", PASSWORD) == "refused"
    assert _admin("olga", PASSWORD) == "form again (200)"


def test_a_lock_reached_over_basic_auth_shows_as_locked_in_the_console(world, olga):
    for _ in range(settings.ROUNDHOUSE_LOGIN_FAILURES):
        _basic("olga", "wrong")
    assert LOCKED in _console("olga", PASSWORD)


def test_the_right_password_clears_earlier_failures(world, olga):
    for _ in range(2):
        assert [_basic("olga", "wrong") for _ in range(4)] == ["refused"] * 4
        assert _basic("olga", PASSWORD) == "in"


def test_an_unknown_username_locks_like_a_known_one(world):
    for _ in range(settings.ROUNDHOUSE_LOGIN_FAILURES):
        assert LOCKED not in _console("nobody", "wrong")
    assert LOCKED in _console("nobody", "wrong")


def test_the_lock_is_one_audit_event(world, olga):
    last = _last_audit_id()
    for _ in range(12):
        _basic("olga", "wrong")
    events = list(AuditEvent.objects.filter(pk__gt=last).order_by("id"))
    assert [(event.action, event.target_type, event.target_id) for event in events] == [
        (LOCKED_ACTION, "user", "olga")
    ]
    assert events[0].data == {
        "username": "olga",
        "failures": settings.ROUNDHOUSE_LOGIN_FAILURES,
        "lock_seconds": settings.ROUNDHOUSE_LOGIN_LOCK_SECONDS,
        "path": "/api/tenants/acme/quota",
    }
    assert events[0].actor is None


def test_the_lock_ends_with_its_window(world, olga, settings):
    settings.ROUNDHOUSE_LOGIN_LOCK_SECONDS = 1
    for _ in range(settings.ROUNDHOUSE_LOGIN_FAILURES):
        _basic("olga", "wrong")
    assert _basic("olga", PASSWORD) == "refused"
    time.sleep(1.2)
    assert _basic("olga", PASSWORD) == "in"


def _counting_password_checks(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    checks = 0
    guard = threading.Lock()
    check = User.check_password

    def counted(user: User, raw_password: str) -> bool:
        nonlocal checks
        with guard:
            checks += 1
        return check(user, raw_password)

    monkeypatch.setattr(User, "check_password", counted)
    return lambda: checks


@pytest.mark.parametrize("way_in", [_console, _basic, _admin], ids=["console", "basic", "admin"])
def test_parallel_wrong_passwords_are_checked_only_as_often_as_failures_are_allowed(
    world, monkeypatch, way_in: Callable[[str, str], Any]
):
    # bob is committed with the world, so the threads' own connections see him.
    checks = _counting_password_checks(monkeypatch)
    last = _last_audit_id()
    attempts = 40
    start = threading.Barrier(attempts)

    def attempt() -> None:
        try:
            start.wait()
            way_in("bob", "wrong")
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert checks() == settings.ROUNDHOUSE_LOGIN_FAILURES
    assert LOCKED in _console("bob", "wrong")
    locks = AuditEvent.objects.filter(pk__gt=last, action=LOCKED_ACTION, target_id="bob")
    assert locks.count() == 1


def test_it_refuses_sign_in_while_the_counter_is_unreachable(world, olga, monkeypatch):
    def unreachable() -> redis.Redis:
        raise redis.ConnectionError("Valkey is down")

    with monkeypatch.context() as patch:
        patch.setattr(lockout, "_client", unreachable)
        assert _basic("olga", PASSWORD) == "refused"
        assert _console("olga", PASSWORD) != "signed in"
    assert _basic("olga", PASSWORD) == "in"


def test_an_operator_can_lift_a_lock_and_it_is_audited(world, olga):
    for _ in range(settings.ROUNDHOUSE_LOGIN_FAILURES):
        _basic("olga", "wrong")
    last = _last_audit_id()
    call_command("unlock_login", "olga", "--reason", "she called the help desk", stdout=StringIO())
    assert _basic("olga", PASSWORD) == "in"
    event = AuditEvent.objects.get(pk__gt=last)
    assert (event.action, event.target_id, event.reason) == (
        UNLOCKED_ACTION,
        "olga",
        "she called the help desk",
    )
