"""What tenants tells the apps above it, which it does not import (docs/design/layers.md).

tenant_deleting: sent by tenant_delete inside its transaction, before the tenant's keys go,
    with `deletion`, a TenantDeletion. Each app deletes its own rows of the tenant there and
    notes what it did on the record: privacy its retained text, batches its batches and files
    (they hold keys, so they go first), billing the keys its usage records name, which are kept
    (scrubbed) instead of deleted. A receiver that raises rolls the whole deletion back.
tenant_deleted: sent once the deletion has committed, with plain values (`tenant_id`, `slug`
    and `key_public_ids`, every key the tenant had), for what lives outside the database:
    the frontends' key caches and cached answers in Redis.
retention_shortened: sent by tenant_privacy_update inside its transaction, with `tenant` and
    `retention_days`, when a tenant's retention period gets shorter: the text already kept
    must expire within it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.dispatch import Signal

from tenants.models import ApiKey, Tenant

tenant_deleting = Signal()
tenant_deleted = Signal()
retention_shortened = Signal()


@dataclass
class TenantDeletion:
    """A tenant deletion in progress, which tenant_deleting's receivers fill in."""

    tenant: Tenant
    keys: list[ApiKey]
    # Keys that records kept for finance still name: revoked and scrubbed, not deleted.
    keys_kept: set[int] = field(default_factory=set)
    retained_texts_deleted: int = 0
    batches_deleted: int = 0
    files_deleted: int = 0
