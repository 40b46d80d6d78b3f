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
from django.db.models import Q

from dataplane.changes import ACCESS, ROUTES, change_publish
from dataplane.redis_client import redis_sync_client
from dataplane.snapshots import retire_request_sync
from models_registry.access import Audience, audience_includes, audience_meet, version_audience
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
    ModelGrant,
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
    owner: Tenant | None = None,
    actor: User | None = None,
) -> tuple[ModelVersion, bool]:
    """Register the files of a directory as a version; the same content twice is one version.

    `owner`: the tenant the model is built for (its own fine-tune or adapter), which alone may
    call it; None registers a platform-wide model. A model keeps the owner it was first
    registered with (model_owner_set changes it), and an adapter on a tenant's model is that
    tenant's (docs/model-access.md).

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
    _owner_check(model_name=model_name, owner=owner, base=base)
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
        model, _ = Model.objects.get_or_create(
            name=model_name, defaults={"task": task, "owner": owner}
        )
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
                    "owner": owner.slug if owner else None,
                },
            )
    return version, created


def _owner_name(owner: Tenant | None) -> str:
    return f"tenant {owner.slug}'s" if owner is not None else "platform-wide"


def _owner_check(*, model_name: str, owner: Tenant | None, base: ModelVersion | None) -> None:
    """Refuse a version whose owner is not its model's, or an adapter another tenant's base
    would have to serve to a tenant that may not call it."""
    model = Model.objects.select_related("owner").filter(name=model_name).first()
    if model is not None and model.owner_id != (owner.pk if owner else None):
        raise ValidationError(
            {
                "tenant": f"{model_name} is {_owner_name(model.owner)}; a new version of it "
                f"is too (registered {_owner_name(owner)})"
            }
        )
    base_owner = base.model.owner if base is not None else None
    if base_owner is not None and (owner is None or owner.pk != base_owner.pk):
        raise ValidationError(
            {
                "tenant": f"{base.public_name if base else ''} is {_owner_name(base_owner)}: "
                f"an adapter on it is {base_owner.slug}'s too (register it for {base_owner.slug})"
            }
        )


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
        _alias_access_check(alias, field="version")
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
        _alias_access_check(alias, field="version")
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
        _alias_access_check(alias, field="version")
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
        _alias_access_check(alias, field="alias")
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


# --- who may call a model (models_registry.access, docs/model-access.md) ----------------------


def _audience_named(audience: Audience) -> str:
    if audience is None:
        return "every tenant"
    slugs = sorted(Tenant.objects.filter(pk__in=audience).values_list("slug", flat=True))
    return f"only {', '.join(slugs)}" if slugs else "no tenant"


def alias_access_problems(alias: Alias) -> list[str]:
    """Say where an alias would send a tenant that may call it to a version it may not use.

    Every version the alias routes to (its splits, its shadow) and its fallback's primary must
    be open to every tenant its primary is open to (a split targeted at a tenant: to that
    tenant, if it may call the alias); and so must this alias for every alias that falls back
    to it. Routing enforces the same per request (routing_for_tenant); this refuses the
    configuration that would need it.
    """
    alias = Alias.objects.select_related(
        "version__model", "version__base__model", "fallback__version__model"
    ).get(pk=alias.pk)
    audience = version_audience(alias.version)
    routed: list[tuple[str, ModelVersion, Audience]] = [
        (
            f"split {s.version.public_name}" + (f" for {s.tenant}" if s.tenant else ""),
            s.version,
            audience_meet(audience, frozenset({s.tenant_id})) if s.tenant_id else audience,
        )
        for s in alias.splits.select_related("version__model", "version__base__model", "tenant")
    ]
    shadow = AliasShadow.objects.select_related("version__model").filter(alias=alias).first()
    if shadow is not None:
        routed.append((f"shadow {shadow.version.public_name}", shadow.version, audience))
    if alias.fallback is not None:
        routed.append((f"fallback {alias.fallback.name}", alias.fallback.version, audience))
    problems = [
        f"{alias.name}'s {role} is open to {_audience_named(version_audience(version))}, "
        f"but {alias.name} to {_audience_named(needed)}"
        for role, version, needed in routed
        if not audience_includes(version_audience(version), needed)
    ]
    for other in Alias.objects.select_related("version__model").filter(fallback=alias):
        if not audience_includes(audience, version_audience(other.version)):
            problems.append(
                f"{other.name} falls back to {alias.name}, which is open to "
                f"{_audience_named(audience)}, but {other.name} to "
                f"{_audience_named(version_audience(other.version))}"
            )
    return problems


def alias_version_check(
    *, alias: Alias, version: ModelVersion, field: str, tenants: Sequence[Tenant] = ()
) -> None:
    """Refuse a version for an alias's traffic (a canary, of `tenants`' traffic alone if any)
    that some of the callers it would take may not use."""
    wanted, allowed = version_audience(alias.version), version_audience(version)
    if tenants:
        wanted = audience_meet(wanted, frozenset(t.pk for t in tenants))
    if not audience_includes(allowed, wanted):
        raise ValidationError(
            {
                field: f"{version.public_name} is open to {_audience_named(allowed)}, but "
                f"{alias.name} to {_audience_named(wanted)}"
            }
        )


def _alias_access_check(alias: Alias, *, field: str) -> None:
    problems = alias_access_problems(alias)
    if problems:
        raise ValidationError({field: "; ".join(problems)})


def _model_access_check(model: Model) -> None:
    """Refuse an owner that would leave an alias or an adapter of the model's open to a tenant
    that may not call it."""
    problems = []
    owner = model.owner_id
    for adapter in ModelVersion.objects.select_related("model").filter(base__model=model):
        if owner is not None and adapter.model.owner_id != owner:
            problems.append(f"the adapter {adapter.public_name} is not {model.owner}'s")
    for version in model.versions.select_related("base__model").filter(base__isnull=False):
        assert version.base is not None
        base_owner = version.base.model.owner_id
        if base_owner is not None and owner != base_owner:
            problems.append(f"{version.public_name} is an adapter on {version.base.public_name}")
    touching = Alias.objects.filter(
        Q(version__model=model)
        | Q(version__base__model=model)
        | Q(splits__version__model=model)
        | Q(shadow__version__model=model)
    ).distinct()
    for alias in touching:
        problems += alias_access_problems(alias)
    if problems:
        raise ValidationError({"tenant": "; ".join(problems)})


def _access_state(model: Model) -> dict[str, Any]:
    return {
        "owner": model.owner.slug if model.owner else None,
        "limited": model.limited,
        "grants": sorted(model.grants.values_list("tenant__slug", flat=True)),
    }


def _access_changed() -> None:
    """Tell every frontend to forget the routes it holds: none may serve a tenant a model it
    no longer may call (nor refuse one it now may), not even once while its reload runs."""
    change_publish(ACCESS)


def model_owner_set(
    *, model: Model, owner: Tenant | None, actor: User | None = None, reason: str = ""
) -> Model:
    """Give a model to a tenant (it alone may call it) or make it platform-wide (None).

    A platform-wide model keeps being limited to its grants, if it was; a model given to a
    tenant loses its grants (only its owner may call it). Refused where an alias or an adapter
    would then route a tenant to a version it may not use.
    """
    with transaction.atomic():
        model = (
            Model.objects.select_for_update(of=("self",)).select_related("owner").get(pk=model.pk)
        )
        before = _access_state(model)
        if model.owner_id == (owner.pk if owner else None):
            return model
        model.owner = owner
        if owner is not None:
            model.grants.all().delete()
            model.limited = False
        model.save(update_fields=["owner", "limited"])
        _model_access_check(model)
        _access_changed()
        audit_record(
            action="model.owner",
            target_type="model",
            target_id=model.name,
            tenant=owner,
            actor=actor,
            reason=reason,
            before=before,
            after=_access_state(model),
        )
    return model


def model_limit_set(
    *,
    model: Model,
    limited: bool,
    grants: list[Tenant] | None = None,
    actor: User | None = None,
    reason: str = "",
) -> Model:
    """Limit a platform-wide model to the tenants granted it (and grant `grants` at once), or
    open it to every tenant again (its grants go: they mean nothing on an open model)."""
    if grants and not limited:
        raise ValidationError({"grants": "an open model takes no grants: every tenant may call it"})
    with transaction.atomic():
        model = (
            Model.objects.select_for_update(of=("self",)).select_related("owner").get(pk=model.pk)
        )
        if model.owner is not None:
            raise ValidationError(
                {
                    "model": f"{model.name} is {model.owner.slug}'s alone; make it "
                    "platform-wide first"
                }
            )
        before = _access_state(model)
        model.limited = limited
        model.save(update_fields=["limited"])
        if limited:
            for tenant in grants or []:
                ModelGrant.objects.get_or_create(
                    model=model, tenant=tenant, defaults={"created_by": _who(actor)}
                )
        else:
            model.grants.all().delete()
        after = _access_state(model)
        if after == before:
            return model
        _access_changed()
        audit_record(
            action="model.limit" if limited else "model.open",
            target_type="model",
            target_id=model.name,
            actor=actor,
            reason=reason,
            before=before,
            after=after,
        )
    return model


def _who(actor: User | None) -> User | None:
    return actor if actor is not None and actor.pk else None


def model_grant(
    *, model: Model, tenant: Tenant, actor: User | None = None, reason: str = ""
) -> bool:
    """Let a tenant call a limited platform-wide model; False if it could already."""
    with transaction.atomic():
        model = (
            Model.objects.select_for_update(of=("self",)).select_related("owner").get(pk=model.pk)
        )
        if model.owner is not None:
            raise ValidationError(
                {"model": f"{model.name} is {model.owner.slug}'s alone: it takes no grants"}
            )
        if not model.limited:
            raise ValidationError(
                {
                    "model": f"{model.name} is open to every tenant: limit it to named tenants "
                    "first (a grant would change nothing)"
                }
            )
        _, created = ModelGrant.objects.get_or_create(
            model=model, tenant=tenant, defaults={"created_by": _who(actor)}
        )
        if created:
            _access_changed()
            audit_record(
                action="model.grant",
                target_type="model",
                target_id=model.name,
                tenant=tenant,
                actor=actor,
                reason=reason,
                data={"tenant": tenant.slug},
            )
    return created


def model_revoke(
    *, model: Model, tenant: Tenant, actor: User | None = None, reason: str = ""
) -> bool:
    """Stop a tenant calling a limited platform-wide model, on every frontend within seconds;
    False if it had no grant (nothing changes)."""
    with transaction.atomic():
        model = Model.objects.select_for_update().get(pk=model.pk)
        deleted, _ = ModelGrant.objects.filter(model=model, tenant=tenant).delete()
        if deleted:
            _access_changed()
            audit_record(
                action="model.revoke",
                target_type="model",
                target_id=model.name,
                tenant=tenant,
                actor=actor,
                reason=reason,
                data={"tenant": tenant.slug},
            )
    return bool(deleted)


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
    gpu_memory_utilization: float = 0.9,
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
    if kv_cache_bytes != 0 and kv_cache_bytes < 1 << 20:
        raise ValidationError(
            {"kv_cache_bytes": "must be at least 1 MiB, or 0 to size it from the GPU's memory"}
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise ValidationError({"gpu_memory_utilization": "must be above 0 and at most 1"})
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
            gpu_memory_utilization=gpu_memory_utilization,
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
