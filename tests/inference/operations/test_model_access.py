"""/v1/models lists exactly what a request can call, for any owners, grants and key narrowing.

A property test: hypothesis draws who owns each of a few models (an adapter and its base
among them), which of two tenants a limited one is granted to, which tenant calls and which
names its key is narrowed to. The frontend (this process, real PostgreSQL and Valkey; /tokenize
needs no engine) must list exactly the names a small independent model of the rules says the
key may call, answer each of those, and answer every other name with the 404 of a name that
does not exist. An alias never routes the caller to a split version it may not use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import AsyncClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.changes import ACCESS
from inference.pipeline.admission import VERSION_HEADER
from inference.pipeline.control_cache import change_received
from models_registry.demo_adapter import demo_adapter_build
from models_registry.models import Alias, Deployment, DeploymentState, Model, ModelGrant
from models_registry.services import (
    alias_set,
    alias_split_set,
    deployment_create,
    model_version_register,
)
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_issue
from tests.conftest import ALIAS, roomy_key

MODELS = ("prop-a", "prop-b", "prop-base", "prop-lora")  # prop-lora: an adapter on prop-base
PROP_ALIAS = "prop-alias"  # prop-a, with every user split to prop-b (who may use it)
UNKNOWN = "nope-"
TENANTS = ("prop-one", "prop-two")


@dataclass(frozen=True)
class Universe:
    versions: dict[str, str]  # model -> the version id clients pin
    tenants: dict[str, int]  # slug -> id

    def names(self) -> list[str]:
        pinned = [f"{model}@{version}" for model, version in self.versions.items()]
        return [*MODELS, *pinned, PROP_ALIAS, ALIAS]


@pytest.fixture(scope="module")
def universe(
    world: Any, demo_model_dir: Path, django_db_blocker: Any, tmp_path_factory: Any
) -> Iterator[Universe]:
    with django_db_blocker.unblock():
        for slug in TENANTS:
            roomy_key(slug)  # tenants of their own: the examples' requests use their quota
        versions = {}
        for name in ("prop-a", "prop-b", "prop-base"):
            version, _ = model_version_register(model_name=name, source_dir=demo_model_dir)
            deployment_create(name=name, version=version, max_loras=int(name == "prop-base"))
            versions[name] = version
        built = demo_adapter_build(
            base_dir=demo_model_dir, out_dir=tmp_path_factory.mktemp("prop") / "lora", seed=5
        )
        versions["prop-lora"], _ = model_version_register(
            model_name="prop-lora", source_dir=built, base=versions["prop-base"]
        )
        Deployment.objects.filter(name__in=MODELS).update(state=DeploymentState.READY)
        alias = alias_set(name=PROP_ALIAS, version=versions["prop-a"])
        alias_split_set(alias=alias, version=versions["prop-b"], percent=100)
        tenants = dict(Tenant.objects.filter(slug__in=TENANTS).values_list("slug", "id"))
    yield Universe(
        versions={name: v.version for name, v in versions.items()},
        tenants=tenants,
    )
    with django_db_blocker.unblock():
        Alias.objects.filter(name=PROP_ALIAS).delete()
        Deployment.objects.filter(name__in=MODELS).delete()
        Model.objects.filter(name__in=MODELS).update(owner=None, limited=False)
        ModelGrant.objects.filter(model__name__in=MODELS).delete()
        ApiKey.objects.filter(tenant__slug__in=TENANTS, name="prop-key").delete()


ACCESS_STATES = st.one_of(
    st.just(("open", None)),
    st.tuples(st.just("limited"), st.frozensets(st.sampled_from(TENANTS))),
    st.tuples(st.just("owned"), st.sampled_from(TENANTS)),
)
NARROWABLE = [*MODELS, PROP_ALIAS, ALIAS, "nope-x"]


def _may_use(access: dict[str, Any], model: str, tenant: str) -> bool:
    """The rules, written again from the manual, independent of the code under test."""
    kind, who = access[model]
    model_ok = {"open": True, "limited": tenant in (who or ()), "owned": who == tenant}[kind]
    return model_ok and (model != "prop-lora" or _may_use(access, "prop-base", tenant))


def _expected(universe: Universe, access: dict[str, Any], tenant: str, narrowed: list[str]):
    """The names of the universe the key may call."""

    def allowed(name: str) -> bool:
        return not narrowed or name in narrowed or name.partition("@")[0] in narrowed

    expected = {ALIAS} if allowed(ALIAS) else set()
    for model, version in universe.versions.items():
        if _may_use(access, model, tenant):
            expected |= {n for n in (model, f"{model}@{version}") if allowed(n)}
    if _may_use(access, "prop-a", tenant) and allowed(PROP_ALIAS):
        expected.add(PROP_ALIAS)
    return expected


def _apply(universe: Universe, access: dict[str, Any]) -> None:
    """Set who may call each model directly (states a revocation can reach whatever the
    configuration rules allow), then drop the frontend's routes as the change message does."""
    ids = universe.tenants
    ModelGrant.objects.filter(model__name__in=MODELS).delete()
    for model, (kind, who) in access.items():
        owner = ids[who] if kind == "owned" else None
        Model.objects.filter(name=model).update(owner_id=owner, limited=kind == "limited")
        for slug in who if kind == "limited" else ():
            ModelGrant.objects.create(model=Model.objects.get(name=model), tenant_id=ids[slug])
    change_received(ACCESS)


async def _answers(key: str, names: list[str]) -> tuple[set[str], dict[str, Any]]:
    client = AsyncClient()
    auth = {"Authorization": f"Bearer {key}"}
    listed = await client.get("/v1/models", headers=auth)
    assert listed.status_code == 200, listed.content
    called = {}
    for name in names:
        for model in (name, UNKNOWN + name):
            called[model] = await client.post(
                "/tokenize",
                json.dumps({"model": model, "prompt": "hi"}),
                content_type="application/json",
                headers=auth,
            )
    return {card["id"] for card in listed.json()["data"]}, called


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    access=st.fixed_dictionaries({model: ACCESS_STATES for model in MODELS}),
    tenant=st.sampled_from(TENANTS),
    narrowed=st.lists(st.sampled_from(NARROWABLE), unique=True, max_size=3),
)
def test_the_model_list_is_exactly_what_a_request_can_call(
    universe: Universe, django_db_blocker: Any, access: dict[str, Any], tenant: str, narrowed
) -> None:
    names = universe.names()
    with django_db_blocker.unblock():
        _apply(universe, access)
        key = api_key_issue(
            tenant=Tenant.objects.get(slug=tenant), name="prop-key", allowed_models=narrowed
        ).token
        listed, called = asyncio.run(_answers(key, names))
    expected = _expected(universe, access, tenant, narrowed)
    assert listed & set(names) == expected
    for name in names:
        answer, unknown = called[name], called[UNKNOWN + name]
        if name in listed:
            assert answer.status_code == 200, (name, answer.content)
        else:
            assert answer.status_code == 404, (name, answer.content)
            assert answer.content == unknown.content.replace(UNKNOWN.encode(), b"")
    if PROP_ALIAS in listed:
        # The split takes every user, but not to a version the tenant may not use.
        served = "prop-b" if _may_use(access, "prop-b", tenant) else "prop-a"
        assert called[PROP_ALIAS][VERSION_HEADER] == universe.versions[served]
