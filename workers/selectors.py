"""Read what was measured about workers (deployments' throughput curves) and what they label
their series with."""

from __future__ import annotations

from collections.abc import Collection

from django.db import close_old_connections

from models_registry.models import Deployment
from tenants.models import Tenant
from workers.capacity import Curve, CurvePoint
from workers.models import ThroughputPoint
from workers.traffic_profile import Slo


def throughput_curve_latest(*, deployment: Deployment) -> Curve | None:
    """Return the deployment's most recent measurement run, per replica, or None.

    Rates and concurrency are divided by the live workers each level ran on; latencies are
    per request and stay as measured.
    """
    latest = (
        ThroughputPoint.objects.filter(deployment=deployment)
        .order_by("-measured_at", "-id")
        .only("run")
        .first()
    )
    if latest is None:
        return None
    rows = list(ThroughputPoint.objects.filter(run=latest.run).order_by("concurrency"))
    # The run's request mix, weighted by the requests each level served.
    served = max(sum(row.requests for row in rows), 1)
    prompt = sum(row.prompt_tokens_mean * row.requests for row in rows) / served
    output = sum(row.output_tokens_mean * row.requests for row in rows) / served
    return Curve(
        run=str(latest.run),
        measured_at=rows[0].measured_at,
        version_digest=rows[0].version_digest,
        workers=max(row.workers for row in rows),
        max_num_seqs=rows[0].max_num_seqs,
        prompt_tokens_mean=prompt,
        output_tokens_mean=output,
        points=tuple(
            CurvePoint(
                concurrency=row.concurrency / row.workers,
                tokens_per_second=row.total_tokens_per_second / row.workers,
                ttft_p95=row.ttft_p95_seconds,
                itl_p95=row.itl_p95_seconds,
                errors=row.errors,
            )
            for row in rows
        ),
    )


def deployment_gpus_per_replica(*, deployment: Deployment) -> int:
    """Return the GPUs one worker of a deployment uses: tensor x pipeline parallel size.

    Read from the engine arguments registered with the version (1 when it names neither).
    """
    args = deployment.version.engine_args
    return int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))


def deployment_slo(*, deployment: Deployment) -> Slo:
    """Return a deployment's latency objectives (TTFT and ITL p95), in seconds."""
    return Slo(ttft_p95=deployment.slo_ttft_p95_ms / 1000, itl_p95=deployment.slo_itl_p95_ms / 1000)


def tenant_slugs(*, tenant_ids: Collection[int]) -> dict[int, str]:
    """Return the slugs of these tenants (those that exist), for a worker's metric labels.

    Called from the metrics server's thread: a connection that outlived the database's restart
    is replaced first.
    """
    close_old_connections()
    return dict(Tenant.objects.filter(id__in=list(tenant_ids)).values_list("id", "slug"))
