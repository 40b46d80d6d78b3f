"""What the data plane does when a tenant's keys stop working: frontends forget them now.

A frontend caches the keys it has checked (inference.pipeline.auth); a revocation published
here makes every frontend drop the key at once, and the cache's TTL bounds how long a missed message
leaves it working. tenants publishes a revoked key itself (it sits above the data plane);
`tenant_keys_forget` receives tenants' `tenant_deleted` signal with plain values, connected by
InferenceConfig.ready, so this package imports no app.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dataplane.keys import KEY_REVOCATIONS_CHANNEL
from dataplane.redis_client import control_sync_client

log = logging.getLogger(__name__)


def key_revocation_publish(*, public_id: str) -> None:
    """Tell every frontend to forget a key now."""
    try:
        control_sync_client().publish(KEY_REVOCATIONS_CHANNEL, public_id)
    except Exception:
        # The cache TTL still bounds how long a revoked key keeps working.
        log.warning("could not publish revocation of %s", public_id, exc_info=True)


def tenant_keys_forget(*, key_public_ids: Iterable[str], **_: object) -> None:
    """Receive a deleted tenant's keys, deleted ones too: frontends forget every one now."""
    for public_id in key_public_ids:
        key_revocation_publish(public_id=public_id)
