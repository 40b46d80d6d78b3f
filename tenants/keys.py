"""The shape of an API key token: `sy-` + a 12-character public id + a random secret."""

from __future__ import annotations

import hashlib
import secrets
import string
from dataclasses import dataclass

PREFIX = "sy-"
PUBLIC_ID_LENGTH = 12
_PUBLIC_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class ParsedToken:
    public_id: str
    token: str


def token_generate() -> tuple[str, str]:
    """Return a new (public id, full token)."""
    public_id = "".join(secrets.choice(_PUBLIC_ALPHABET) for _ in range(PUBLIC_ID_LENGTH))
    return public_id, f"{PREFIX}{public_id}{secrets.token_urlsafe(32)}"


def token_hash(token: str) -> str:
    """Return the hex SHA-256 stored in place of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_parse(token: str) -> ParsedToken | None:
    """Split a presented token into its public id, or None when it cannot be one of ours."""
    if not token.startswith(PREFIX) or len(token) < len(PREFIX) + PUBLIC_ID_LENGTH + 16:
        return None
    public_id = token[len(PREFIX) : len(PREFIX) + PUBLIC_ID_LENGTH]
    if any(c not in _PUBLIC_ALPHABET for c in public_id):
        return None
    return ParsedToken(public_id=public_id, token=token)
