"""Services that register versions, point aliases and create deployments."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from dataplane.changes import ROUTES, change_publish
from dataplane.redis_client import redis_sync_client
from dataplane.snapshots import retire_request_sync
from models_registry.manifest import (
    MANIFEST_SCHEMA,
    ArtifactError,
    manifest_digest,
    manifest_files,
    manifest_verify,
)
from models_registry.models import (
    BUCKETS,
    FALLBACK_HOPS,
    Alias,
    AliasShadow,
    AliasSplit,
    Deployment,
    DeploymentState,
    Model,
    ModelVersion,
    Rollout,
    RolloutState,
    Task,
)
from tenants.models import Tenant
from tenants.services import audit_record

DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0}
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM accepts


def _max_model_len(source_dir: Path) -> int:
    try:
        config = json.loads((source_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError({"source_dir": f"no readable config.json in {source_dir}"}) from exc
    limit = int(config.get("max_position_embeddings", 2048))
    # A sentence-transformers encoder was trained on inputs up to its own, shorter limit.
    try:
        encoder = json.loads((source_dir / "sentence_bert_config.json").read_text())
    except (OSError, ValueError):
        return limit
    return min(limit, int(encoder.get("max_seq_length", limit)))


def _encoder_head(source_dir: Path, engine_args: dict[str, Any]) -> dict[str, Any]:
    """Return how an encoder turns hidden states into one vector (sentence-transformers layout).

    Pooling comes from `1_Pooling/config.json` (mean unless it says CLS) and normalisation from
    a Normalize module in `modules.json`; without those files: mean pooling, normalised.
    """
    config = json.loads((source_dir / "config.json").read_text())
    dimensions = int(config.get("hidden_size", 0))
    if dimensions <= 0:
        raise ValidationError({"source_dir": "config.json has no hidden_size"})
    pooling = "mean"
    with contextlib.suppress(OSError, ValueError):
        pooled = json.loads((source_dir / "1_Pooling" / "config.json").read_text())
        if pooled.get("pooling_mode_cls_token"):
            pooling = "cls"
    normalize = True
    with contextlib.suppress(OSError, ValueError):
        modules = json.loads((source_dir / "modules.json").read_text())
        normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    matryoshka = engine_args.get("matryoshka_dimensions", [])
    if not isinstance(matryoshka, list) or not all(
        isinstance(d, int) and 0 < d < dimensions for d in matryoshka
    ):
        raise ValidationError(
            {"engine_args": f"matryoshka_dimensions must be sizes below {dimensions}"}
        )
    return {
        "dimensions": dimensions,
        "pooling": pooling,
        "normalize": normalize,
        "matryoshka_dimensions": sorted(matryoshka),
    }


def _store(*, source_dir: Path, digest: str) -> Path:
    """Copy a version's files into the content-addressed store, read-only, atomically."""
    root = settings.ROUNDHOUSE_ARTIFACT_ROOT
    target = root / digest
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    shutil.copytree(source_dir, staging, dirs_exist_ok=True)
    for path in staging.rglob("*"):
        if path.is_file():
            path.chmod(0o444)
    os.replace(staging, target)
    return target


def _label_check(*, model_name: str, label: str, digest: str) -> None:
    """Refuse a label that already names other content: registered versions never change."""
    if not label:
        return
    taken = ModelVersion.objects.filter(model__name=model_name, label=label).first()
    if taken is not None and taken.digest != digest:
        raise ValidationError(
            {
                "label": f"{model_name} {label} is already registered as {taken.public_name} "
                "with different content; a registered version never changes, so register "
                "the new content under a new label"
            }
        )


def _tool_parser_check(name: str) -> None:
    """Refuse a tool parser name that vLLM's workers would not find."""
    # vLLM takes seconds to import: only a registration that names a parser pays for it.
    from vllm.tool_parsers import ToolParserManager

    known = ToolParserManager.list_registered()
    if name not in known:
        names = ", ".join(sorted(known))
        raise ValidationError({"tool_parser": f"{name!r} is not a vLLM tool parser ({names})"})


def _reasoning_parser_check(name: str) -> None:
    """Refuse a reasoning parser name that vLLM's workers would not find."""
    from vllm.reasoning import ReasoningParserManager

    known = ReasoningParserManager.list_registered()
    if name not in known:
        names = ", ".join(sorted(known))
        raise ValidationError(
            {"reasoning_parser": f"{name!r} is not a vLLM reasoning parser ({names})"}
        )


def model_version_register(
    *,
    model_name: str,
    source_dir: Path,
    task: str = Task.CHAT,
    label: str = "",
    base: ModelVersion | None = None,
    engine_args: dict[str, Any] | None = None,
    sampling_defaults: dict[str, Any] | None = None,
    price_input_per_1k: Decimal = Decimal("0"),
    price_output_per_1k: Decimal = Decimal("0"),
    weights_uri: str = "",
    tool_parser: str = "",
    reasoning_parser: str = "",
    actor: User | None = None,
) -> tuple[ModelVersion, bool]:
    """Register the files of a directory as a version; the same content twice is one version.

    With `base`, the directory is a LoRA adapter (PEFT layout) served by the base version's
    workers. The manifest (files and their hashes, tokenizer, engine arguments, sampling
    defaults, price, base, tool parser) determines the version id; the label is an operator's
    name for it. `tool_parser` names the vLLM tool parser that turns the model's output into
    tool calls (hermes, llama3_json, ...); an adapter's calls are read by its base's.
    `reasoning_parser` names the vLLM reasoning parser that splits a reasoning model's
    thinking from its answer (qwen3, deepseek_r1, ...), likewise the base's for an adapter.
    """
    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        raise ValidationError({"source_dir": f"{source_dir} is not a directory"})
    if task not in Task.values:
        raise ValidationError({"task": f"task must be one of {', '.join(Task.values)}"})
    if price_input_per_1k < 0 or price_output_per_1k < 0:
        raise ValidationError({"price": "prices cannot be negative"})
    if weights_uri and urlparse(weights_uri).scheme not in ("file", "http", "https"):
        raise ValidationError(
            {"weights_uri": "weights_uri must be a file://, http:// or https:// directory URI"}
        )
    if tool_parser:
        if task == Task.EMBEDDING:
            raise ValidationError({"tool_parser": "an embedding model takes no tools"})
        if base is not None:
            raise ValidationError(
                {"tool_parser": "an adapter's tool calls are read by its base's tool parser"}
            )
        _tool_parser_check(tool_parser)
    if reasoning_parser:
        if task != Task.CHAT:
            raise ValidationError({"reasoning_parser": "only a chat model reasons"})
        if base is not None:
            raise ValidationError(
                {"reasoning_parser": "an adapter's thinking is read by its base's parser"}
            )
        _reasoning_parser_check(reasoning_parser)
    if base is not None:
        if base.base_id is not None:
            raise ValidationError({"base": "an adapter's base must be a full model version"})
        if not (source_dir / "adapter_config.json").is_file():
            raise ValidationError({"source_dir": f"no adapter_config.json in {source_dir}"})
        max_model_len = base.max_model_len
    else:
        max_model_len = _max_model_len(source_dir)
    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "model": model_name,
        "task": task,
        "files": manifest_files(source_dir),
        "tokenizer": ".",
        "engine_args": engine_args or {},
        "sampling_defaults": {**DEFAULT_SAMPLING, **(sampling_defaults or {})},
        "max_model_len": max_model_len,
        "price": {
            "input_per_1k": str(price_input_per_1k),
            "output_per_1k": str(price_output_per_1k),
        },
    }
    if tool_parser:
        # Only when set: the digests of versions registered without one stay as they were.
        manifest["tool_parser"] = tool_parser
    if reasoning_parser:
        manifest["reasoning_parser"] = reasoning_parser
    if task == Task.EMBEDDING:
        manifest["encoder"] = _encoder_head(source_dir, engine_args or {})
    if base is not None:
        manifest["base"] = base.digest
        manifest["kind"] = "lora"
    digest = manifest_digest(manifest)
    _label_check(model_name=model_name, label=label, digest=digest)
    existing = ModelVersion.objects.filter(digest=digest).first()
    if existing is not None:
        if label and existing.label and existing.label != label:
            raise ValidationError(
                {
                    "label": f"this content is already registered as {existing.public_name} "
                    f"with label {existing.label!r}; a registered version never changes"
                }
            )
        return existing, False
    _store(source_dir=source_dir, digest=digest)
    with transaction.atomic():
        model, _ = Model.objects.get_or_create(name=model_name, defaults={"task": task})
        version, created = ModelVersion.objects.get_or_create(
            digest=digest,
            defaults={
                "model": model,
                "label": label,
                "base": base,
                "manifest": manifest,
                "weights_uri": weights_uri,
                "max_model_len": max_model_len,
                "price_input_per_1k": price_input_per_1k,
                "price_output_per_1k": price_output_per_1k,
            },
        )
        if created:
            audit_record(
                action="model_version.register",
                target_type="model_version",
                target_id=version.public_name,
                actor=actor,
                data={
                    "digest": digest,
                    "files": len(manifest["files"]),
                    "label": label,
                    "base": base.public_name if base else None,
                    "weights_uri": weights_uri,
                    "tool_parser": tool_parser,
                    "reasoning_parser": reasoning_parser,
                },
            )
    return version, created


def model_version_verify(*, version: ModelVersion, directory: Path | None = None) -> Path:
    """Return a copy of the version (the store's by default) after checking every file.

    Raises ArtifactError naming each file that is missing, resized or changed.
    """
    directory = directory or version.artifact_dir
    problems = manifest_verify(manifest=version.manifest, directory=directory)
    if problems:
        detail = ", ".join(f"{p.path} ({p.reason})" for p in problems)
        raise ArtifactError(f"{version.public_name} failed verification: {detail}")
    return directory


def alias_set(
    *, name: str, version: ModelVersion, actor: User | None = None, reason: str = ""
) -> Alias:
    """Point an alias's primary share at a version."""
    with transaction.atomic():
        current = Alias.objects.select_related("version__model").filter(name=name).first()
        before = {"version": current.version.public_name} if current else None
        alias, _ = Alias.objects.update_or_create(name=name, defaults={"version": version})
        audit_record(
            action="alias.set",
            target_type="alias",
            target_id=name,
            actor=actor,
            reason=reason,
            before=before,
            after={"version": version.public_name},
            data={"version": version.public_name},
        )
    return alias


def percent_buckets(percent: float, field: str) -> int:
    if not 0 <= percent <= 100:
        raise ValidationError({field: "percent must be between 0 and 100"})
    return round(percent * BUCKETS / 100)


def _splits_of(alias: Alias, tenant: Tenant | None = None) -> dict[str, float]:
    """Each version's percent of the traffic the splits naming `tenant` (None: none) divide."""
    splits = alias.splits.select_related("version__model").filter(tenant=tenant)
    return {s.version.public_name: s.percent for s in splits}


def _targeting_of(alias: Alias, tenants: Sequence[Tenant]) -> dict[str, dict[str, float]]:
    return {t.slug: _splits_of(alias, t) for t in tenants}


def targeting_tenants_check(tenants: Sequence[Tenant]) -> None:
    """Refuse to target a deleted tenant."""
    gone = Tenant.objects.filter(pk__in=[t.pk for t in tenants], deleted_at__isnull=False)
    deleted = sorted(gone.values_list("slug", flat=True))
    if deleted:
        raise ValidationError({"tenants": f"deleted tenants cannot be targeted: {deleted}"})


def alias_targeted_tenants(*, alias: Alias) -> list[Tenant]:
    """Return the tenants the alias's splits name, by slug."""
    return list(Tenant.objects.filter(alias_splits__alias=alias).distinct().order_by("slug"))


def alias_split_set(
    *,
    alias: Alias,
    version: ModelVersion,
    percent: float,
    tenants: Sequence[Tenant] = (),
    actor: User | None = None,
    reason: str = "",
) -> Alias:
    """Send a share of an alias's traffic to another version (0 removes the split).

    With `tenants`, the share is of each named tenant's traffic alone, and those tenants
    leave the splits that name no tenant (0 for a tenant removes its split of that version:
    rolled back alone, others' targeting untouched). The primary takes whatever is left.
    A tenant that an active rollout of the alias targets is the rollout's to move.
    """
    buckets = percent_buckets(percent, "percent")
    if version.pk == alias.version_id and buckets:
        raise ValidationError({"version": f"{version.public_name} is the alias's primary"})
    targeting_tenants_check(tenants)
    scopes: list[Tenant | None] = list(dict.fromkeys(tenants)) or [None]
    with transaction.atomic():
        Alias.objects.select_for_update().get(pk=alias.pk)
        if tenants:
            active = [RolloutState.RUNNING, RolloutState.PAUSED]
            held = Rollout.objects.filter(
                alias=alias, state__in=active, tenants__in=tenants
            ).values_list("pk", "tenants__slug")
            if held:
                named = ", ".join(f"{slug} (rollout {pk})" for pk, slug in held)
                raise ValidationError(
                    {"tenants": f"an active rollout of {alias.name} targets {named}: "
                     "roll it back or promote it first"}
                )  # fmt: skip
        before = _targeting_of(alias, tenants) if tenants else _splits_of(alias)
        for scope in scopes:
            others = sum(
                s.buckets for s in alias.splits.filter(tenant=scope).exclude(version=version)
            )
            if others + buckets > BUCKETS:
                whose = f" of {scope.slug}" if scope is not None else ""
                raise ValidationError(
                    {"percent": f"the splits{whose} of an alias cannot pass 100%"}
                )
            if buckets == 0:
                AliasSplit.objects.filter(alias=alias, version=version, tenant=scope).delete()
            else:
                AliasSplit.objects.update_or_create(
                    alias=alias, version=version, tenant=scope, defaults={"buckets": buckets}
                )
        data: dict[str, Any] = {"version": version.public_name, "percent": percent}
        if tenants:
            data["tenants"] = [t.slug for t in scopes if t is not None]
        audit_record(
            action="alias.split",
            target_type="alias",
            target_id=alias.name,
            actor=actor,
            reason=reason,
            before=before,
            after=_targeting_of(alias, tenants) if tenants else _splits_of(alias),
            data=data,
        )
    return alias


def alias_shadow_set(
    *,
    alias: Alias,
    version: ModelVersion | None,
    percent: float = 0.0,
    actor: User | None = None,
    reason: str = "",
) -> Alias:
    """Copy a share of an alias's requests to a candidate version (None or 0 % stops it)."""
    buckets = percent_buckets(percent, "percent")
    if version is not None and version.pk == alias.version_id:
        raise ValidationError({"version": f"{version.public_name} already serves the alias"})
    with transaction.atomic():
        current = AliasShadow.objects.select_related("version__model").filter(alias=alias).first()
        before = (
            {"version": current.version.public_name, "buckets": current.buckets}
            if current
            else None
        )
        after = None
        if version is None or buckets == 0:
            AliasShadow.objects.filter(alias=alias).delete()
        else:
            AliasShadow.objects.update_or_create(
                alias=alias, defaults={"version": version, "buckets": buckets}
            )
            after = {"version": version.public_name, "buckets": buckets}
        audit_record(
            action="alias.shadow",
            target_type="alias",
            target_id=alias.name,
            actor=actor,
            reason=reason,
            before=before,
            after=after,
        )
    return alias


def alias_fallback_set(
    *, alias: Alias, fallback: Alias | None, actor: User | None = None, reason: str = ""
) -> Alias:
    """Name the alias an alias's interactive requests go to when it cannot take them (None: none).

    The fallback must answer the same kind of request (a chat model for a chat model; an
    embedding model's vectors differ from any other's, so embeddings have none), and the
    chain it starts must end without coming back to this alias, within FALLBACK_HOPS aliases.
    """
    if fallback is not None:
        if fallback.pk == alias.pk:
            raise ValidationError({"alias": f"{alias.name} cannot fall back to itself"})
        tasks = {a.name: a.version.model.task for a in (alias, fallback)}
        if Task.EMBEDDING in tasks.values() or len(set(tasks.values())) > 1:
            raise ValidationError(
                {
                    "alias": f"{fallback.name} serves {tasks[fallback.name]} requests and "
                    f"{alias.name} {tasks[alias.name]} requests: a fallback answers chat or "
                    "completion requests like its alias's own"
                }
            )
        chain = [alias.name, fallback.name]
        after = fallback.fallback
        while after is not None and len(chain) <= FALLBACK_HOPS + 1:
            chain.append(after.name)
            if after.pk == alias.pk:
                raise ValidationError({"alias": f"a loop of fallbacks: {' -> '.join(chain)}"})
            after = after.fallback
        if len(chain) - 1 > FALLBACK_HOPS:
            raise ValidationError(
                {
                    "alias": f"a chain of {len(chain) - 1} fallbacks ({' -> '.join(chain)}); "
                    f"at most {FALLBACK_HOPS} are followed"
                }
            )
    with transaction.atomic():
        current = Alias.objects.select_for_update(of=("self",)).select_related("fallback")
        held = current.get(pk=alias.pk)
        before = {"fallback": held.fallback.name if held.fallback else None}
        Alias.objects.filter(pk=alias.pk).update(fallback=fallback)
        change_publish(ROUTES)  # update() sends no signal
        audit_record(
            action="alias.fallback",
            target_type="alias",
            target_id=alias.name,
            actor=actor,
            reason=reason,
            before=before,
            after={"fallback": fallback.name if fallback else None},
        )
    alias.fallback = fallback
    return alias


def deployment_retire(
    *, deployment: Deployment, actor: User | None = None, reason: str = ""
) -> None:
    """Ask a deployment's workers to serve what is queued, drain, and leave."""
    with transaction.atomic():
        before = {"state": deployment.state}
        Deployment.objects.filter(pk=deployment.pk, state=DeploymentState.READY).update(
            state=DeploymentState.DRAINING
        )
        change_publish(ROUTES)
        audit_record(
            action="deployment.retire",
            target_type="deployment",
            target_id=deployment.name,
            actor=actor,
            reason=reason,
            before=before,
            after={"state": DeploymentState.DRAINING},
        )
        name = deployment.name
        transaction.on_commit(lambda: retire_request_sync(redis_sync_client(), name, retire=True))


def deployment_serve(*, deployment: Deployment) -> None:
    """Withdraw a retire request: the deployment's workers stay (new ones start serving)."""
    name = deployment.name
    transaction.on_commit(lambda: retire_request_sync(redis_sync_client(), name, retire=False))


def deployment_create(
    *,
    name: str,
    version: ModelVersion,
    max_num_seqs: int = 64,
    max_queued: int = 256,
    max_queued_tokens: int = 1_000_000,
    max_model_len: int | None = None,
    kv_cache_bytes: int = 256 << 20,
    enforce_eager: bool = False,
    dtype: str = "float32",
    prefix_caching: bool = True,
    max_loras: int = 0,
    max_lora_rank: int = 8,
    max_batch_size: int = 64,
    latency_slo_ms: int = 250,
    slo_ttft_p95_ms: int = 2000,
    slo_itl_p95_ms: int = 200,
    slo_availability: Decimal = Decimal("0.999"),
    min_replicas: int = 1,
    max_replicas: int = 8,
    accelerator: str = "",
    spot: bool = False,
    actor: User | None = None,
) -> Deployment:
    """Create a deployment of a version; its workers start with `run_worker`.

    A second deployment of the same version is another pool of it (dataplane/pools.py).
    """
    if Deployment.objects.filter(name=name).exists():
        raise ValidationError({"name": f"deployment {name!r} already exists"})
    if max_num_seqs < 1:
        raise ValidationError({"max_num_seqs": "must be at least 1"})
    if max_queued < 0:
        raise ValidationError({"max_queued": "must not be negative"})
    if max_queued_tokens < 1:
        raise ValidationError({"max_queued_tokens": "must be at least 1"})
    if kv_cache_bytes < 1 << 20:
        raise ValidationError({"kv_cache_bytes": "must be at least 1 MiB"})
    if max_lora_rank not in LORA_RANKS:
        raise ValidationError(
            {"max_lora_rank": f"must be one of {', '.join(map(str, LORA_RANKS))}"}
        )
    if version.base_id is not None:
        raise ValidationError({"version": "deploy the adapter's base version; it serves adapters"})
    if max_batch_size < 1:
        raise ValidationError({"max_batch_size": "must be at least 1"})
    if latency_slo_ms < 1:
        raise ValidationError({"latency_slo_ms": "must be at least 1"})
    if slo_ttft_p95_ms < 1 or slo_itl_p95_ms < 1:
        raise ValidationError({"slo_ttft_p95_ms": "latency objectives must be at least 1 ms"})
    if not Decimal(0) < slo_availability < Decimal(1):
        raise ValidationError({"slo_availability": "must be between 0 and 1, e.g. 0.999"})
    if not 0 <= min_replicas <= max_replicas or max_replicas < 1:
        raise ValidationError({"max_replicas": "needs 0 <= min_replicas <= max_replicas, max >= 1"})
    context = min(max_model_len or version.max_model_len, version.max_model_len)
    with transaction.atomic():
        deployment = Deployment.objects.create(
            name=name,
            version=version,
            max_num_seqs=max_num_seqs,
            max_queued=max_queued,
            max_queued_tokens=max_queued_tokens,
            max_model_len=context,
            kv_cache_bytes=kv_cache_bytes,
            enforce_eager=enforce_eager,
            dtype=dtype,
            prefix_caching=prefix_caching,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_batch_size=max_batch_size,
            latency_slo_ms=latency_slo_ms,
            slo_ttft_p95_ms=slo_ttft_p95_ms,
            slo_itl_p95_ms=slo_itl_p95_ms,
            slo_availability=slo_availability,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            accelerator=accelerator,
            spot=spot,
        )
        audit_record(
            action="deployment.create",
            target_type="deployment",
            target_id=name,
            actor=actor,
            data={"version": version.public_name, "max_num_seqs": max_num_seqs},
        )
    return deployment
