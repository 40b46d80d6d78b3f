"""Read-only queries over safety policies: which pack a tenant's request runs under."""

from __future__ import annotations

import re

from django.db.models import Q

from models_registry.models import Alias, ModelVersion
from safety.models import PolicyAssignment
from safety.policy import Policy, policy_combine, policy_compile

# A version id as routes and responses carry it: a digest, or its first 12 characters.
_VERSION = re.compile(r"^[0-9a-f]{12,64}$")


def policy_names(*, version: str) -> list[str]:
    """Return the names whose packs cover a version: its model's, and every alias's that
    routes to that model (a version of it primary, or taking a split of the alias's traffic).

    Empty for an id that names no version.
    """
    if not _VERSION.fullmatch(version):
        return []
    found = (
        ModelVersion.objects.filter(digest__startswith=version)
        .values_list("model_id", "model__name")
        .first()
    )
    if found is None:
        return []
    model_id, model_name = found
    aliases = (
        Alias.objects.filter(Q(version__model_id=model_id) | Q(splits__version__model_id=model_id))
        .values_list("name", flat=True)
        .distinct()
    )
    return [model_name, *sorted(aliases)]


def policy_load(*, tenant_id: int, version: str) -> Policy | None:
    """Return the compiled policy of a tenant's requests that a version serves, or None.

    `version`: the id of the version that serves the request (a digest, or the 12 characters
    of `model@version`), never the name the client sent: every name that reaches a model gets
    the same policy. Every pack assigned to a name that covers the version (`policy_names`)
    applies, together; the tenant's default (blank name) applies where none does.
    """
    names = policy_names(version=version)
    assignments = (
        PolicyAssignment.objects.filter(Q(alias__in=names) | Q(alias=""), tenant_id=tenant_id)
        .select_related("pack")
        .order_by("pack__name")
    )
    named = [a.pack for a in assignments if a.alias]
    packs = named or [a.pack for a in assignments if not a.alias]
    unique = list({pack.pk: pack for pack in packs}.values())
    return policy_combine([policy_compile(p) for p in unique]) if unique else None
