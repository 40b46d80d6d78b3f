"""Tell every frontend when control-plane state it caches changes.

Saving or deleting a model that keys, routes or safety policies are built from publishes
that kind once its transaction commits; frontends mark their cached entries of the kind stale
and reload them in the background (`inference.pipeline.control_cache`). A canary rolled back,
a quota raised or a policy assigned reaches every frontend within milliseconds rather than at
the next TTL.

Bulk `QuerySet.update()` sends no signals: code that changes such state that way calls
`change_publish` itself.

A change of who may call a model (a grant made or revoked, a model limited, opened or given
to a tenant) publishes ACCESS as well: frontends then drop their cached routes rather than mark
them stale, so that no request is routed by what was cached before it, not even one served
while its reload runs (as a revoked key is dropped, `dataplane.tenancy`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from dataplane.keys import CONTROL_CHANGES_CHANNEL
from dataplane.redis_client import control_sync_client

log = logging.getLogger(__name__)

KEYS, ROUTES, POLICIES = "keys", "routes", "policies"
# Not a kind of cached state of its own: the routes, dropped at once (see above).
ACCESS = "access"

# The models each kind of cached state is built from ("app_label.ModelName").
SOURCES = {
    KEYS: ("tenants.ApiKey", "tenants.Tenant", "tenants.Quota"),
    ROUTES: (
        "models_registry.Model",
        "models_registry.ModelGrant",
        "models_registry.ModelVersion",
        "models_registry.Alias",
        "models_registry.AliasSplit",
        "models_registry.AliasShadow",
        "models_registry.Deployment",
        "billing.PriceBook",
    ),
    # A pack covers the models an alias routes to (safety.selectors.policy_load): a change of
    # where an alias points changes which pack a version's requests run under.
    POLICIES: (
        "safety.PolicyPack",
        "safety.PolicyAssignment",
        "models_registry.Model",
        "models_registry.ModelVersion",
        "models_registry.Alias",
        "models_registry.AliasSplit",
    ),
}


def change_publish(kind: str) -> None:
    """Publish that a kind of cached state changed, once the current transaction commits."""
    transaction.on_commit(functools.partial(_publish, kind))


def _publish(kind: str) -> None:
    try:
        control_sync_client().publish(CONTROL_CHANGES_CHANNEL, kind)
    except Exception:
        # Frontends still reload within their cache TTL.
        log.warning("could not publish a change of %s", kind, exc_info=True)


def _changed(kind: str, **_: Any) -> None:
    change_publish(kind)


def receivers_connect() -> None:
    """Publish a change whenever a source model of a cached kind is saved or deleted."""
    from django.apps import apps

    for kind, labels in SOURCES.items():
        receiver = functools.partial(_changed, kind)
        for label in labels:
            model = apps.get_model(label)
            for signal in (post_save, post_delete):
                signal.connect(
                    receiver, sender=model, weak=False, dispatch_uid=f"changes:{kind}:{label}"
                )
