"""What the platform measured about its workers: points of each deployment's throughput curve."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from models_registry.models import Deployment


class ThroughputPoint(models.Model):
    """One concurrency level of a capacity measurement: closed-loop load on a deployment.

    The points of one `capacity_measure` run share `run`; `capacity_plan` reads the latest
    run. Rates are for the whole deployment as measured (`workers` live workers); latencies
    are per request, in seconds. Deleting a deployment deletes its curve: the numbers
    describe that deployment's engine settings and hardware and nothing else.
    """

    run = models.UUIDField(db_index=True)
    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="throughput_points"
    )
    version_digest = models.CharField(max_length=64)
    measured_at = models.DateTimeField(default=timezone.now)
    workers = models.PositiveIntegerField()  # live workers while this level ran
    max_num_seqs = models.PositiveIntegerField()  # the deployment's setting at the time
    concurrency = models.PositiveIntegerField()  # requests kept in flight
    requests = models.PositiveIntegerField()  # requests that finished without error
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens_mean = models.FloatField()
    output_tokens_mean = models.FloatField()
    requests_per_second = models.FloatField()
    output_tokens_per_second = models.FloatField()
    total_tokens_per_second = models.FloatField()
    # None when no request of the level succeeded (ITL also when none produced two tokens).
    ttft_p50_seconds = models.FloatField(null=True, blank=True)
    ttft_p95_seconds = models.FloatField(null=True, blank=True)
    itl_p50_seconds = models.FloatField(null=True, blank=True)
    itl_p95_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-measured_at", "concurrency"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "concurrency"], name="throughput_point_run_concurrency"
            ),
        ]
        indexes = [models.Index(fields=["deployment", "-measured_at"])]

    def __str__(self) -> str:
        return f"{self.deployment.name} c={self.concurrency} ({self.measured_at:%Y-%m-%d %H:%M})"
