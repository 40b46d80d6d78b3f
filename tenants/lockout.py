"""Sign-in lockout: one counter per username in Valkey, shared by every way a password comes in.

`LockoutBackend` is the only authentication backend, so the console, the Django admin and HTTP
Basic on the management API all pass through it. Each attempt takes its number from the counter
(INCR, with the window set by the first one) *before* the password is checked: with N failures
allowed, at most N checks happen in a window however many attempts run in parallel, and the
(N+1)th is refused even with the right password. A success clears the counter; the Nth failure
locks the username for a whole window and is recorded as an audit event.

The lock is per username, whether or not the user exists, so a locked name reads the same as
an unknown one (no enumeration). The price is that anyone who knows a username can keep it
locked; that is accepted, because locking per address lets an attacker who rotates addresses
guess on. API clients use API keys, which no lockout touches.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from dataplane.keys import login_attempts_key
from dataplane.redis_client import control_sync_client
from tenants.audit import audit_record

log = logging.getLogger(__name__)

LOCKED_ACTION = "login.locked"
UNLOCKED_ACTION = "login.unlocked"


@functools.cache
def _client() -> redis.Redis:
    return control_sync_client()


def lockout_take(*, username: str) -> int:
    """Count one attempt for a username and return its number in the current window."""
    pipe = _client().pipeline(transaction=True)
    pipe.incr(login_attempts_key(username))
    # NX: later attempts do not stretch the window the first one opened.
    pipe.expire(login_attempts_key(username), settings.ROUNDHOUSE_LOGIN_LOCK_SECONDS, nx=True)
    number, _ = pipe.execute()
    return int(number)


def lockout_is_locked(*, username: str) -> bool:
    """Return whether a username is locked (its failures in the window reached the limit).

    Unreachable Valkey reads as not locked: this only picks a message, and the backend refuses
    every sign-in while it cannot count.
    """
    try:
        value = _client().get(login_attempts_key(username))
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    return int(value or 0) >= settings.ROUNDHOUSE_LOGIN_FAILURES


def lockout_reset(*, username: str) -> None:
    """Forget a username's attempts: after a successful sign-in, or to unlock it by hand."""
    _client().delete(login_attempts_key(username))


def lockout_unlock(*, username: str, actor: User | None = None, reason: str = "") -> None:
    """Lift a username's lock before its window ends (an operator's decision: audited)."""
    lockout_reset(username=username)
    audit_record(
        action=UNLOCKED_ACTION,
        target_type="user",
        target_id=username[:64],
        actor=actor,
        data={"username": username},
        reason=reason,
    )


def lockout_fail(*, username: str, attempt: int, request: HttpRequest | None = None) -> None:
    """Record a failed check; the one that reaches the limit locks the name for a full window."""
    if attempt != settings.ROUNDHOUSE_LOGIN_FAILURES:
        return
    seconds = settings.ROUNDHOUSE_LOGIN_LOCK_SECONDS
    _client().expire(login_attempts_key(username), seconds)
    log.warning("sign-in locked for %r after %d failures", username, attempt)
    audit_record(
        action=LOCKED_ACTION,
        target_type="user",
        target_id=username[:64],
        data={
            "username": username,
            "failures": attempt,
            "lock_seconds": seconds,
            "path": getattr(request, "path", ""),
        },
    )


class LockoutBackend(ModelBackend):
    """Django's username and password check, refused while the username is locked."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        if username is None:
            username = kwargs.get(User.USERNAME_FIELD)
        if username is None or password is None:
            return None
        try:
            attempt = lockout_take(username=username)
        except (redis.ConnectionError, redis.TimeoutError):
            # Without the counter nothing bounds guessing: refuse rather than check unbounded.
            log.warning("sign-in refused: the lockout counter is unreachable")
            raise PermissionDenied("sign-in is unavailable") from None
        if attempt > settings.ROUNDHOUSE_LOGIN_FAILURES:
            # PermissionDenied stops django.contrib.auth.authenticate at this backend.
            raise PermissionDenied("too many failed sign-ins")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            lockout_fail(username=username, attempt=attempt, request=request)
        else:
            lockout_reset(username=username)
        return user

    async def aauthenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        # ModelBackend checks asynchronous sign-ins on a path of its own, past the lockout.
        return await sync_to_async(self.authenticate)(
            request, username=username, password=password, **kwargs
        )
