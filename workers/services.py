"""Services a worker calls at the edges of its life: load its spec, report its state."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from dataplane.changes import ROUTES, change_publish
from dataplane.redis_client import redis_sync_client
from dataplane.snapshots import live_workers_sync
from models_registry.manifest import ArtifactError
from models_registry.models import Deployment, DeploymentState, ModelVersion, Task
from models_registry.services import model_version_verify
from workers.capacity import Level
from workers.encoder import EncoderSpec
from workers.engine import AdapterRef, EngineSpec
from workers.models import ThroughputPoint
from workers.weights import HashMismatch, ProgressCallback, WeightFile, WeightsCache, WeightsError


@dataclass(frozen=True)
class WorkerPlan:
    deployment: str
    version: str
    spec: EngineSpec
    encoder: EncoderSpec | None = None  # set for an embedding model: no vLLM engine then


# Versions this process has pinned in the weights cache, by digest: held until the process
# exits, so eviction (by this or any other process of the host) never removes files an engine
# loaded.
_pins = contextlib.ExitStack()
_pinned: dict[tuple[Path, str], Path] = {}


def weights_cache() -> WeightsCache:
    """Return this host's weights cache."""
    limit = settings.ROUNDHOUSE_WEIGHTS_CACHE_MAX_BYTES
    return WeightsCache(root=settings.ROUNDHOUSE_WEIGHTS_CACHE_DIR, max_bytes=limit or None)


def weight_files(*, version: ModelVersion) -> list[WeightFile]:
    """Return a version's files with the URIs a worker fetches them from."""
    return [
        WeightFile(
            path=f["path"], sha256=f["sha256"], size=f["size"], uri=version.file_uri(f["path"])
        )
        for f in version.manifest["files"]
    ]


def version_fetch(*, version: ModelVersion, progress: ProgressCallback | None = None) -> Path:
    """Return the directory of a version in this host's weights cache, pinned and verified.

    Fetches what is missing from the version's weights URI, each file checked against its
    sha256 as it lands. A copy that was already cached is verified again before use (the
    cache is a directory on a shared host); one that changed on disk since it was fetched is
    fetched anew. Raises ArtifactError naming the file.
    """
    cache = weights_cache()
    key = (cache.root, version.digest)
    if key in _pinned:
        return model_version_verify(version=version, directory=_pinned[key])
    files = weight_files(version=version)
    for attempt in range(2):
        fetched_now = not cache.version_dir(version.digest).is_dir()
        pin = contextlib.ExitStack()
        try:
            directory = pin.enter_context(cache.use(version.digest, files, progress=progress))
        except HashMismatch as exc:
            raise ArtifactError(
                f"{version.public_name} failed verification: {exc.path} (sha256 mismatch)"
            ) from exc
        except WeightsError as exc:
            raise ArtifactError(f"{version.public_name} could not be fetched: {exc}") from exc
        try:
            if not fetched_now:
                model_version_verify(version=version, directory=directory)
        except ArtifactError:
            pin.close()
            if attempt:
                raise
            cache.remove(version.digest)
            continue
        _pins.enter_context(pin)
        _pinned[key] = directory
        return directory
    raise AssertionError("unreachable: the second attempt returns or raises")


def worker_plan(*, deployment_name: str, progress: ProgressCallback | None = None) -> WorkerPlan:
    """Return what a worker of a deployment runs, its files fetched into the weights cache.

    Raises Deployment.DoesNotExist or ArtifactError (naming the file) before any model loads.
    """
    deployment = Deployment.objects.select_related("version__model").get(name=deployment_name)
    version = deployment.version
    model_dir = version_fetch(version=version, progress=progress)
    # The version's engine arguments are part of what was registered and tested: where they
    # name a setting the deployment also has, the version's value wins.
    extra = version.engine_args
    max_num_seqs = int(extra.pop("max_num_seqs", deployment.max_num_seqs))
    spec = EngineSpec(
        model_dir=model_dir,
        max_num_seqs=max_num_seqs,
        max_model_len=deployment.context_length,
        kv_cache_bytes=deployment.kv_cache_bytes,
        gpu_memory_utilization=deployment.gpu_memory_utilization,
        enforce_eager=bool(extra.pop("enforce_eager", deployment.enforce_eager)),
        dtype=str(extra.pop("dtype", deployment.dtype)),
        prefix_caching=bool(extra.pop("enable_prefix_caching", deployment.prefix_caching)),
        extra_args=extra,
        max_loras=deployment.max_loras,
        max_lora_rank=deployment.max_lora_rank,
        engine_nice=settings.ROUNDHOUSE_ENGINE_NICE,
        reasoning_parser=version.reasoning_parser,
        **_scheduling(extra, max_num_seqs=max_num_seqs),
    )
    encoder = None
    if version.model.task == Task.EMBEDDING:
        head = version.encoder
        encoder = EncoderSpec(
            model_dir=model_dir,
            dtype=spec.dtype,
            pooling=head["pooling"],
            normalize=head["normalize"],
            dimensions=head["dimensions"],
            max_batch_size=deployment.max_batch_size,
            latency_slo_seconds=deployment.latency_slo_ms / 1000,
            max_length=deployment.context_length,
        )
    return WorkerPlan(
        deployment=deployment.name, version=version.public_name, spec=spec, encoder=encoder
    )


def _scheduling(extra: dict[str, Any], *, max_num_seqs: int) -> dict[str, Any]:
    """The engine's scheduling settings: the platform's, unless the version's arguments
    (taken out of `extra`) name their own.

    The priority policy orders the engine by the priorities the worker gives (fairness
    between tenants); the step budget is at least max_num_seqs, as vLLM requires; a prefill
    chunk the platform leaves unset (0) is the engine's to derive (see EngineSpec).
    """
    budget = int(extra.pop("max_num_batched_tokens", settings.ROUNDHOUSE_ENGINE_MAX_BATCHED_TOKENS))
    chunk = extra.pop("long_prefill_token_threshold", None)
    if chunk is None:
        chunk = settings.ROUNDHOUSE_ENGINE_PREFILL_CHUNK_TOKENS or None
    return {
        "scheduling_policy": str(extra.pop("scheduling_policy", "priority")),
        "max_num_batched_tokens": max(budget, max_num_seqs),
        "prefill_chunk_tokens": None if chunk is None else max(int(chunk), 0),
    }


def adapter_ref(*, deployment_name: str, digest: str) -> AdapterRef:
    """Return a LoRA adapter version a deployment may apply, after verifying its files.

    Raises ArtifactError (naming the file) or ModelVersion.DoesNotExist; an adapter of
    another base version is refused.
    """
    deployment = Deployment.objects.get(name=deployment_name)
    version = ModelVersion.objects.select_related("model").get(digest=digest)
    if version.base_id != deployment.version_id:
        raise ArtifactError(f"{version.public_name} is not an adapter of {deployment.version}")
    path = version_fetch(version=version)
    # vLLM tells adapters apart by this integer alone: unique per content, never 0.
    return AdapterRef(name=version.public_name, int_id=int(digest[:7], 16) + 1, path=path)


def deployment_report(*, deployment_name: str, state: str) -> None:
    """Record the state a worker reports for its deployment."""
    Deployment.objects.filter(name=deployment_name).update(
        state=state, last_heartbeat_at=timezone.now(), updated_at=timezone.now()
    )
    change_publish(ROUTES)  # routes prefer deployments whose workers are ready


def deployments_reconcile(*, settle_seconds: float = 30.0) -> int:
    """Align each deployment's recorded state with its live workers; return how many changed.

    Liveness lives in Redis (worker heartbeats). A ready deployment whose workers all went
    silent becomes stopped; a stopped one with live workers becomes ready again. States a
    worker is still passing through (loading, warming) are left alone.
    """
    client = redis_sync_client()
    settled = timezone.now() - dt.timedelta(seconds=settle_seconds)
    changed = 0
    for deployment in Deployment.objects.all():
        live = live_workers_sync(client, deployment.name)
        if deployment.state == DeploymentState.READY and live == 0:
            if deployment.updated_at < settled:
                deployment_report(deployment_name=deployment.name, state=DeploymentState.STOPPED)
                changed += 1
        elif deployment.state == DeploymentState.STOPPED and live > 0:
            deployment_report(deployment_name=deployment.name, state=DeploymentState.READY)
            changed += 1
    return changed


def lease_seconds() -> float:
    return settings.ROUNDHOUSE_LEASE_SECONDS


def throughput_record(
    *,
    deployment: Deployment,
    run: uuid.UUID,
    levels: Sequence[Level],
    measured_at: dt.datetime | None = None,
) -> list[ThroughputPoint]:
    """Store a measurement run of a deployment: one point of its curve per concurrency level.

    The version and the effective max_num_seqs (the version's engine arguments win, as in
    worker_plan) are the deployment's now. All points or none are stored.
    """
    if not levels:
        raise ValidationError("a measurement run needs at least one level")
    concurrencies = [level.concurrency for level in levels]
    if len(set(concurrencies)) != len(concurrencies):
        raise ValidationError(f"each concurrency is measured once per run: {concurrencies}")
    if any(level.workers < 1 for level in levels):
        raise ValidationError("every level needs the live worker count it ran on (1 or more)")
    version = deployment.version
    max_num_seqs = int(version.engine_args.get("max_num_seqs", deployment.max_num_seqs))
    when = measured_at or timezone.now()
    points = [
        ThroughputPoint(
            run=run,
            deployment=deployment,
            version_digest=version.digest,
            measured_at=when,
            workers=level.workers,
            max_num_seqs=max_num_seqs,
            concurrency=level.concurrency,
            requests=level.requests,
            errors=level.errors,
            prompt_tokens_mean=level.prompt_tokens_mean,
            output_tokens_mean=level.output_tokens_mean,
            requests_per_second=level.requests_per_second,
            output_tokens_per_second=level.output_tokens_per_second,
            total_tokens_per_second=level.total_tokens_per_second,
            ttft_p50_seconds=level.ttft_p50,
            ttft_p95_seconds=level.ttft_p95,
            itl_p50_seconds=level.itl_p50,
            itl_p95_seconds=level.itl_p95,
        )
        for level in levels
    ]
    with transaction.atomic():
        if ThroughputPoint.objects.filter(run=run).exists():
            raise ValidationError(f"run {run} is already recorded")
        return ThroughputPoint.objects.bulk_create(points)
