"""Sealing retained text with the content keys: the first key encrypts, every key decrypts."""

from __future__ import annotations

import functools

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@functools.cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def content_fernet() -> MultiFernet:
    """Return the cipher over ROUNDHOUSE_CONTENT_KEYS as they are set now."""
    # Keyed by the keys themselves, so a settings override (tests, rotation) is picked up.
    return _fernet(tuple(settings.ROUNDHOUSE_CONTENT_KEYS))


def content_keys_check() -> None:
    """Raise ImproperlyConfigured unless ROUNDHOUSE_CONTENT_KEYS holds valid Fernet keys."""
    if not settings.ROUNDHOUSE_CONTENT_KEYS:
        raise ImproperlyConfigured("ROUNDHOUSE_CONTENT_KEYS names no key")
    try:
        content_fernet()
    except ValueError as exc:
        # The message never includes the key: it would end up in logs.
        raise ImproperlyConfigured(
            "ROUNDHOUSE_CONTENT_KEYS holds a value that is not a Fernet key "
            "(32 url-safe base64-encoded bytes)"
        ) from exc


def content_seal(plaintext: bytes) -> bytes:
    """Return plaintext encrypted and authenticated with the first content key."""
    return content_fernet().encrypt(plaintext)


def content_open(token: bytes) -> bytes:
    """Return the plaintext of a sealed token (raises InvalidToken if no key opens it)."""
    return content_fernet().decrypt(token)
