"""Services that register versions, point aliases and create deployments."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from models_registry.manifest import (
    MANIFEST_SCHEMA,
    ArtifactError,
    manifest_digest,
    manifest_files,
    manifest_verify,
)
from models_registry.models import Alias, Deployment, Model, ModelVersion, Task
from tenants.services import audit_record

DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0}


def _max_model_len(source_dir: Path) -> int:
    try:
        config = json.loads((source_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError({"source_dir": f"no readable config.json in {source_dir}"}) from exc
    return int(config.get("max_position_embeddings", 2048))


def _store(*, source_dir: Path, digest: str) -> Path:
    """Copy a version's files into the content-addressed store, read-only, atomically."""
    root = settings.SWITCHYARD_ARTIFACT_ROOT
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


def model_version_register(
    *,
    model_name: str,
    source_dir: Path,
    task: str = Task.CHAT,
    engine_args: dict[str, Any] | None = None,
    sampling_defaults: dict[str, Any] | None = None,
    price_input_per_1k: Decimal = Decimal("0"),
    price_output_per_1k: Decimal = Decimal("0"),
    actor: User | None = None,
) -> tuple[ModelVersion, bool]:
    """Register the files of a directory as a version; the same content twice is one version."""
    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        raise ValidationError({"source_dir": f"{source_dir} is not a directory"})
    if task not in Task.values:
        raise ValidationError({"task": f"task must be one of {', '.join(Task.values)}"})
    if price_input_per_1k < 0 or price_output_per_1k < 0:
        raise ValidationError({"price": "prices cannot be negative"})
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
    digest = manifest_digest(manifest)
    existing = ModelVersion.objects.filter(digest=digest).first()
    if existing is not None:
        return existing, False
    _store(source_dir=source_dir, digest=digest)
    with transaction.atomic():
        model, _ = Model.objects.get_or_create(name=model_name, defaults={"task": task})
        version, created = ModelVersion.objects.get_or_create(
            digest=digest,
            defaults={
                "model": model,
                "manifest": manifest,
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
                data={"digest": digest, "files": len(manifest["files"])},
            )
    return version, created


def model_version_verify(*, version: ModelVersion) -> Path:
    """Return the version's directory after checking every file against the manifest."""
    problems = manifest_verify(manifest=version.manifest, directory=version.artifact_dir)
    if problems:
        detail = ", ".join(f"{p.path} ({p.reason})" for p in problems)
        raise ArtifactError(f"{version.public_name} failed verification: {detail}")
    return version.artifact_dir


def alias_set(*, name: str, version: ModelVersion, actor: User | None = None) -> Alias:
    """Point an alias at a version."""
    with transaction.atomic():
        alias, _ = Alias.objects.update_or_create(name=name, defaults={"version": version})
        audit_record(
            action="alias.set",
            target_type="alias",
            target_id=name,
            actor=actor,
            data={"version": version.public_name},
        )
    return alias


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
    actor: User | None = None,
) -> Deployment:
    """Create a deployment of a version; its workers start with `run_worker`."""
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
        )
        audit_record(
            action="deployment.create",
            target_type="deployment",
            target_id=name,
            actor=actor,
            data={"version": version.public_name, "max_num_seqs": max_num_seqs},
        )
    return deployment
