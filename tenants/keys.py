"""The shape of an API key token: `rh-` + a 12-character public id + a random secret.

Keys issued before the product's rename start `sy-`; they keep working (same public id, same
stored hash of the whole token), and new keys start `rh-`.
"""

from __future__ import annotations

import hashlib
import secrets
import string
from dataclasses import dataclass

PREFIX = "rh-"
# Every prefix a presented key may start with: the current one first, then the former one.
PREFIXES = (PREFIX, "sy-")
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


def public_id_of(key_id: str) -> str:
    """Return the public id of a key named by its public id, with or without a prefix."""
    for prefix in PREFIXES:
        if key_id.startswith(prefix):
            return key_id[len(prefix) : len(prefix) + PUBLIC_ID_LENGTH]
    return key_id[:PUBLIC_ID_LENGTH]


def token_parse(token: str) -> ParsedToken | None:
    """Split a presented token into its public id, or None when it cannot be one of ours."""
    prefix = next((p for p in PREFIXES if token.startswith(p)), None)
    if prefix is None or len(token) < len(prefix) + PUBLIC_ID_LENGTH + 16:
        return None
    public_id = token[len(prefix) : len(prefix) + PUBLIC_ID_LENGTH]
    if any(c not in _PUBLIC_ALPHABET for c in public_id):
        return None
    return ParsedToken(public_id=public_id, token=token)
