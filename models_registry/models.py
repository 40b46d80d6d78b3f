"""Models, their immutable content-addressed versions, aliases and deployments."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import models

from tenants.models import AppendOnlyError, Tenant


class Task(models.TextChoices):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"


class Model(models.Model):
    """A model clients call by name; who may call it is its access (docs/model-access.md).

    Platform-wide (no owner): every tenant may call it, unless an operator limited it to the
    tenants granted it (ModelGrant). Owned by a tenant: that tenant alone may, whatever the
    grants say; its versions, the adapters on them and the aliases that route to them follow.
    Changed only through the registry's services, which audit each change.
    """

    name = models.SlugField(max_length=100, unique=True)
    task = models.CharField(max_length=16, choices=Task.choices, default=Task.CHAT)
    description = models.TextField(blank=True)
    # PROTECT: a deleted tenant's row stays (tenant_delete), and so do the models built for it.
    owner = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="owned_models"
    )
    # A platform-wide model open to every tenant (False) or only to the tenants granted it.
    limited = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    @property
    def access(self) -> str:
        """How the console and the CLI name the model's access: owned, limited or open."""
        if self.owner_id is not None:
            return "owned"
        return "limited" if self.limited else "open"

    def __str__(self) -> str:
        return self.name


class ModelGrant(models.Model):
    """A tenant that may call a limited platform-wide model."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="grants")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="model_grants")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["model", "tenant"], name="model_grant_unique")
        ]

    def __str__(self) -> str:
        return f"{self.model.name} granted to {self.tenant.slug}"


class ModelVersion(models.Model):
    """One immutable build of a model; its id is the hash of its manifest."""

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    digest = models.CharField(max_length=64, unique=True)
    # An operator's name for the version ("v2", "2026-11-rc1"); one label names one content.
    label = models.CharField(max_length=64, blank=True)
    # A LoRA adapter is a version on a base version: the base's workers serve it.
    base = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="adapters"
    )
    manifest = models.JSONField()
    # Where workers fetch the files from: a directory URI (file:// or http(s)://) under which
    # each manifest path is found. Blank: the registry's own store. Not part of the digest: the
    # content is what the hashes say, wherever it is kept.
    weights_uri = models.CharField(max_length=1024, blank=True)
    max_model_len = models.PositiveIntegerField()
    price_input_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    price_output_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "label"],
                condition=~models.Q(label=""),
                name="model_version_label_unique",
            )
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("model versions are immutable; register a new version")
        super().save(*args, **kwargs)

    @property
    def version(self) -> str:
        """Return the short version id clients see and pin (`name@version`)."""
        return self.digest[:12]

    @property
    def is_adapter(self) -> bool:
        return self.base_id is not None

    @property
    def public_name(self) -> str:
        return f"{self.model.name}@{self.version}"

    @property
    def artifact_dir(self) -> Path:
        return settings.ROUNDHOUSE_ARTIFACT_ROOT / self.digest

    def file_uri(self, path: str) -> str:
        """Return the URI a worker fetches one of the version's files from."""
        base = self.weights_uri or self.artifact_dir.as_uri()
        return f"{base.rstrip('/')}/{quote(path)}"

    @property
    def engine_args(self) -> dict[str, Any]:
        return dict(self.manifest.get("engine_args", {}))

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        return dict(self.manifest.get("sampling_defaults", {}))

    @property
    def tool_parser(self) -> str:
        """The vLLM tool parser that turns the model's output into tool calls ("": none)."""
        return str(self.manifest.get("tool_parser", ""))

    @property
    def reasoning_parser(self) -> str:
        """The vLLM reasoning parser that splits the model's thinking from its answer ("":
        none)."""
        return str(self.manifest.get("reasoning_parser", ""))

    @property
    def encoder(self) -> dict[str, Any]:
        """An embedding model's head: dimensions, pooling, normalisation ({} for others)."""
        return dict(self.manifest.get("encoder", {}))

    def __str__(self) -> str:
        return self.public_name


FALLBACK_HOPS = 3  # an alias's fallback, its fallback's, and one more at most


class Alias(models.Model):
    """A stable name clients call (e.g. `chat-default`).

    `version` is the primary version: it takes every bucket the splits do not. `fallback` is
    the alias an interactive request goes to when this one's deployment cannot take it (its
    queue is full, no worker serves it, or its wait passes the deadline): a smaller model
    answering beats a 503 (docs/rollouts.md, "Fallbacks").
    """

    name = models.SlugField(max_length=100, unique=True)
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="aliases")
    fallback = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="fallback_of"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} -> {self.version}"


BUCKETS = 10_000  # traffic is split in basis points: 1 bucket = 0.01 %


class AliasSplit(models.Model):
    """A share of an alias's traffic sent to another version, in buckets of 10,000.

    A split that names a tenant targets that tenant alone: a tenant named by any split of an
    alias is routed by the splits that name it (the rest of its traffic on the primary), and
    every other tenant by the splits that name none (docs/rollouts.md, "Tenant targeting").
    """

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="splits")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="splits")
    # Null: every tenant the alias's tenant-targeted splits do not name.
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="alias_splits"
    )
    buckets = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias", "version"],
                condition=models.Q(tenant__isnull=True),
                name="alias_split_unique",
            ),
            models.UniqueConstraint(
                fields=["alias", "version", "tenant"],
                condition=models.Q(tenant__isnull=False),
                name="alias_split_tenant_unique",
            ),
            models.CheckConstraint(
                condition=models.Q(buckets__lte=BUCKETS), name="alias_split_buckets_max"
            ),
        ]

    @property
    def percent(self) -> float:
        return self.buckets * 100 / BUCKETS

    def __str__(self) -> str:
        scope = f" for {self.tenant}" if self.tenant_id is not None else ""
        return f"{self.alias.name}: {self.percent:g}% -> {self.version}{scope}"


class AliasShadow(models.Model):
    """Copy a fraction of an alias's requests to a candidate; its output is discarded."""

    alias = models.OneToOneField(Alias, on_delete=models.CASCADE, related_name="shadow")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="shadows")
    buckets = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.alias.name}: shadow {self.buckets * 100 / BUCKETS:g}% -> {self.version}"


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
    # 0: sized from the GPU's memory, the fraction of it vLLM may take being
    # gpu_memory_utilization (models_registry/engine_defaults.py).
    kv_cache_bytes = models.PositiveBigIntegerField(default=256 << 20)
    gpu_memory_utilization = models.FloatField(default=0.9)
    enforce_eager = models.BooleanField(default=False)
    dtype = models.CharField(max_length=16, default="float32")
    # vLLM's automatic prefix caching: prompts sharing a prefix reuse its KV-cache blocks, and
    # dispatch sends them to the replica that holds it (dataplane/leases.py).
    prefix_caching = models.BooleanField(default=True)
    # LoRA adapters of the version this deployment serves: how many one batch may mix
    # (0: none are served) and the largest rank accepted.
    max_loras = models.PositiveIntegerField(default=0)
    max_lora_rank = models.PositiveIntegerField(default=8)
    # Encoder deployments: inputs per forward pass, and the latency the dynamic batcher aims
    # for (its queue delay is this minus a full batch's measured compute time).
    max_batch_size = models.PositiveIntegerField(default=64)
    latency_slo_ms = models.PositiveIntegerField(default=250)
    # Service level objectives, read by alerts, the autoscaling signal and the capacity planner:
    # time to first token (from admission) and inter-token latency at the 95th percentile, and
    # the share of requests that must not fail on the platform's side.
    slo_ttft_p95_ms = models.PositiveIntegerField(default=2000)
    slo_itl_p95_ms = models.PositiveIntegerField(default=200)
    slo_availability = models.DecimalField(max_digits=6, decimal_places=5, default=Decimal("0.999"))
    # Bounds of the autoscaling signal: the warm pool kept however idle, and the ceiling.
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=8)
    # A pool of the version: several deployments of one version share its traffic
    # (dataplane/pools.py). The accelerator its workers run on (a GPU type such as "h100" or
    # "l4", a MIG profile, or "cpu"), which the Helm chart turns into node selectors and
    # resource names; and whether they are preemptible (spot), where batch work goes first.
    accelerator = models.CharField(max_length=64, blank=True, default="")
    spot = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    @property
    def context_length(self) -> int:
        return min(self.max_model_len, self.version.max_model_len)

    def __str__(self) -> str:
        return f"{self.name} ({self.version})"


class RolloutState(models.TextChoices):
    RUNNING = "running"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


def default_steps() -> list[float]:
    return [1, 5, 25, 50, 100]


def default_guardrails() -> dict[str, float]:
    return {
        # An SLO's error budget burning this many times faster than it may (the SLIs of the
        # burn-rate alerts, docs/metrics.md), over both windows, is a breach...
        "burn_rate": 6.0,
        # ...when it also burns this many times faster than the baseline's over each window:
        # both versions burning is the platform's trouble, not the canary's.
        "burn_vs_baseline": 2.0,
        # Serving cost guard: the canary's engine-seconds per 1k tokens over the step, as a
        # multiple of the baseline's, above which it is held at its step.
        "engine_seconds_per_1k_ratio": 1.5,
    }


class Rollout(models.Model):
    """A canary of one version against an alias's primary version, ramped step by step.

    A rollout scoped to tenants ramps the canary within those tenants' traffic alone (their
    tenant-targeted splits), is judged on their requests, and reverts only their targeting.
    An alias has at most one active rollout for every tenant (unscoped) and one per tenant.
    """

    alias = models.ForeignKey(Alias, on_delete=models.PROTECT, related_name="rollouts")
    baseline = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    canary = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    # The tenants a scoped rollout still targets: one rolled back alone leaves the set.
    tenants = models.ManyToManyField(Tenant, blank=True, related_name="+")
    # Set once at the start: a scoped rollout whose tenants all left is rolled back, never
    # widened to every tenant, and the constraint below needs a column to read.
    scoped = models.BooleanField(default=False)
    state = models.CharField(
        max_length=16, choices=RolloutState.choices, default=RolloutState.RUNNING
    )
    steps = models.JSONField(default=default_steps)  # percent of traffic at each step
    step_index = models.PositiveIntegerField(default=0)
    step_started_at = models.DateTimeField()
    # Requests each version must have served in a step before it may advance.
    min_samples = models.PositiveIntegerField(default=200)
    min_step_seconds = models.PositiveIntegerField(default=300)
    guardrails = models.JSONField(default=default_guardrails)
    # The burn-rate windows, sliding with every analysis: a breach must burn over both, for
    # `breach_checks` analyses in a row. A short window no longer than the analysis period
    # lets one noisy window count in at most two analyses.
    short_window_seconds = models.PositiveIntegerField(default=10)
    long_window_seconds = models.PositiveIntegerField(default=60)
    breach_checks = models.PositiveIntegerField(default=3)
    breaches = models.PositiveIntegerField(default=0)
    # Held at its step by the serving-cost guard (a decision is stored when this changes).
    cost_held = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias"],
                condition=models.Q(state__in=["running", "paused"], scoped=False),
                name="rollout_one_active_per_alias",
            )
        ]

    @property
    def percent(self) -> float:
        """The canary's share of the alias's traffic now."""
        if self.state == RolloutState.ROLLED_BACK:
            return 0.0
        if self.state == RolloutState.PROMOTED:
            return 100.0
        return float(self.steps[self.step_index])

    @property
    def is_active(self) -> bool:
        return self.state in (RolloutState.RUNNING, RolloutState.PAUSED)

    def __str__(self) -> str:
        return f"{self.alias.name}: {self.canary} at {self.percent:g}% ({self.state})"


class RolloutDecision(models.Model):
    """One step of a rollout and the numbers it was based on."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="decisions")
    action = models.CharField(max_length=16)  # hold, advance, promote, rollback, pause, resume
    percent = models.FloatField()  # the canary's share once the decision took effect
    reason = models.TextField()
    evidence = models.JSONField(default=dict)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.rollout_id}: {self.action} at {self.percent:g}%"
