"""Read-only queries over the registry: what a model name routes to."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from models_registry.models import Alias, Deployment, DeploymentState, ModelVersion


@dataclass(frozen=True)
class Route:
    """Where a request for a model name goes: a version and the deployment that serves it."""

    requested: str
    model_name: str
    version: str
    version_digest: str
    deployment: str
    context_length: int
    artifact_dir: Path
    sampling_defaults: dict[str, Any]
    price_input_per_1k: Decimal
    price_output_per_1k: Decimal
    max_queued: int
    max_queued_tokens: int

    @property
    def served_name(self) -> str:
        """The `model` field of responses: the model pinned to the version that served it."""
        return f"{self.model_name}@{self.version}"


def _deployment_for(version: ModelVersion) -> Deployment | None:
    """Return the deployment serving a version, preferring one whose workers are ready.

    A deployment with no live worker still routes: the frontend then answers 503 (retry),
    which is the truth, rather than 404 (no such model).
    """
    deployments = Deployment.objects.filter(version=version).order_by("-updated_at")
    ranked = sorted(deployments, key=lambda d: d.state != DeploymentState.READY)
    return ranked[0] if ranked else None


def _version_for(name: str) -> ModelVersion | None:
    if "@" in name:
        model_name, _, short = name.partition("@")
        return (
            ModelVersion.objects.select_related("model")
            .filter(model__name=model_name, digest__startswith=short)
            .first()
            if len(short) >= 8
            else None
        )
    alias = Alias.objects.select_related("version__model").filter(name=name).first()
    if alias is not None:
        return alias.version
    # A bare model name goes to its newest version that has a deployment.
    deployment = (
        Deployment.objects.select_related("version__model")
        .filter(version__model__name=name)
        .order_by("-version__created_at")
        .first()
    )
    return deployment.version if deployment else None


def route_resolve(*, name: str) -> Route | None:
    """Return where a model name (alias, model or `model@version`) routes, or None."""
    version = _version_for(name)
    if version is None:
        return None
    deployment = _deployment_for(version)
    if deployment is None:
        return None
    return Route(
        requested=name,
        model_name=version.model.name,
        version=version.version,
        version_digest=version.digest,
        deployment=deployment.name,
        context_length=deployment.context_length,
        artifact_dir=version.artifact_dir,
        sampling_defaults=version.sampling_defaults,
        price_input_per_1k=version.price_input_per_1k,
        price_output_per_1k=version.price_output_per_1k,
        max_queued=deployment.max_queued,
        max_queued_tokens=deployment.max_queued_tokens,
    )


def model_names_list() -> list[tuple[str, int]]:
    """Return every name a client can call (aliases and served models) with a created time."""
    names: dict[str, int] = {}
    for alias in Alias.objects.all():
        names[alias.name] = int(alias.updated_at.timestamp())
    for deployment in Deployment.objects.select_related("version__model"):
        model = deployment.version.model
        names.setdefault(model.name, int(model.created_at.timestamp()))
        names.setdefault(
            deployment.version.public_name, int(deployment.version.created_at.timestamp())
        )
    return sorted(names.items())
