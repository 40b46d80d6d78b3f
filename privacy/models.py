"""Prompt and completion text a tenant asked us to keep, encrypted, until it expires."""

from __future__ import annotations

from django.db import models

from tenants.models import Tenant


class RetainedContent(models.Model):
    """One request's prompt and completion, sealed with the content keys (privacy.crypto)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="retained_content")
    request_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    # A Fernet token of the JSON {"prompt", "completion"}: never the text itself.
    ciphertext = models.BinaryField()

    def __str__(self) -> str:
        return f"{self.request_id} of {self.tenant_id}"
