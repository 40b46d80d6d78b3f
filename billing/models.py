"""Usage: one append-only record per accepted request, priced at the version that served it."""

from __future__ import annotations

from typing import Any

from django.db import models

from models_registry.models import ModelVersion
from tenants.models import ApiKey, AppendOnlyError, Tenant


class UsageRecord(models.Model):
    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage")
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL)
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT)
    deployment = models.CharField(max_length=100)
    endpoint = models.CharField(max_length=32)
    status = models.CharField(max_length=16)
    finish_reason = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()
    cost = models.DecimalField(max_digits=14, decimal_places=8)
    # A shadow copy's record: kept for comparing versions, never billed (cost 0).
    shadow = models.BooleanField(default=False)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    first_token_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(db_index=True)
    ingested_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "finished_at"]),
            models.Index(fields=["model_version", "finished_at"]),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("usage records are append-only")
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.request_id} {self.status} {self.prompt_tokens}+{self.completion_tokens}"
