"""Models, their immutable content-addressed versions, aliases and deployments."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import models

from tenants.models import AppendOnlyError


class Task(models.TextChoices):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"


class Model(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    task = models.CharField(max_length=16, choices=Task.choices, default=Task.CHAT)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One immutable build of a model; its id is the hash of its manifest."""

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    digest = models.CharField(max_length=64, unique=True)
    manifest = models.JSONField()
    max_model_len = models.PositiveIntegerField()
    price_input_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    price_output_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("model versions are immutable; register a new version")
        super().save(*args, **kwargs)

    @property
    def version(self) -> str:
        """Return the short version id clients see and pin (`name@version`)."""
        return self.digest[:12]

    @property
    def public_name(self) -> str:
        return f"{self.model.name}@{self.version}"

    @property
    def artifact_dir(self) -> Path:
        return settings.SWITCHYARD_ARTIFACT_ROOT / self.digest

    @property
    def engine_args(self) -> dict[str, Any]:
        return dict(self.manifest.get("engine_args", {}))

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        return dict(self.manifest.get("sampling_defaults", {}))

    def __str__(self) -> str:
        return self.public_name


class Alias(models.Model):
    """A stable name clients call (e.g. `chat-default`) that points at one version."""

    name = models.SlugField(max_length=100, unique=True)
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="aliases")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} -> {self.version}"


class DeploymentState(models.TextChoices):
    PENDING = "pending"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class Deployment(models.Model):
    """A version served by a pool of workers with fixed engine settings."""

    name = models.SlugField(max_length=100, unique=True)
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="deployments")
    state = models.CharField(
        max_length=16, choices=DeploymentState.choices, default=DeploymentState.PENDING
    )
    desired_replicas = models.PositiveIntegerField(default=1)
    max_num_seqs = models.PositiveIntegerField(default=64)
    # Requests waiting for a worker beyond this are refused at once (503 queue_full).
    max_queued = models.PositiveIntegerField(default=256)
    # Reserved tokens (prompt + max_tokens) allowed to wait; beyond it requests get queue_full.
    max_queued_tokens = models.PositiveIntegerField(default=1_000_000)
    max_model_len = models.PositiveIntegerField(default=2048)
    kv_cache_bytes = models.PositiveBigIntegerField(default=256 << 20)
    enforce_eager = models.BooleanField(default=False)
    dtype = models.CharField(max_length=16, default="float32")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    @property
    def context_length(self) -> int:
        return min(self.max_model_len, self.version.max_model_len)

    def __str__(self) -> str:
        return f"{self.name} ({self.version})"
