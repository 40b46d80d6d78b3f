"""Weighted, sticky traffic splits of an alias, and pinned versions."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.core.exceptions import ValidationError

from billing.services import price_current
from models_registry.models import Alias, Deployment, DeploymentState
from models_registry.selectors import bucket_of, route_resolve, routing_resolve
from models_registry.services import (
    alias_set,
    alias_split_set,
    deployment_create,
    model_version_register,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def canary(tmp_path, world):
    """A second version of a small model with a ready deployment, and an alias on the first."""
    versions = []
    for content in ("one", "two"):
        source = tmp_path / content
        source.mkdir()
        (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
        (source / "weights.bin").write_text(content)
        version, _ = model_version_register(model_name="small", source_dir=source, label=content)
        deployment_create(name=f"small-{content}", version=version)
        versions.append(version)
    Deployment.objects.filter(name__startswith="small-").update(state=DeploymentState.READY)
    alias = alias_set(name="small-chat", version=versions[0])
    return alias, versions[0], versions[1]


def _served(name: str, users: range, tenant_id: int = 1) -> Counter[str]:
    routing = routing_resolve(name=name, price_of=price_current)
    assert routing is not None
    return Counter(routing.pick(tenant_id=tenant_id, user=f"u{i}").version for i in users)


def test_a_split_sends_its_share_of_users_to_the_canary(canary):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=25)
    served = _served("small-chat", range(4000))
    assert abs(served[new.version] / 4000 - 0.25) < 0.03
    assert served[base.version] + served[new.version] == 4000


def test_assignment_is_sticky_and_a_growing_share_keeps_its_users(canary):
    alias, _base, new = canary
    alias_split_set(alias=alias, version=new, percent=5)
    routing = routing_resolve(name="small-chat", price_of=price_current)
    assert routing is not None
    first = {u: routing.pick(tenant_id=7, user=f"u{u}").version for u in range(2000)}
    again = routing_resolve(name="small-chat", price_of=price_current)
    assert again is not None
    assert first == {u: again.pick(tenant_id=7, user=f"u{u}").version for u in range(2000)}
    alias_split_set(alias=alias, version=new, percent=25)
    grown = routing_resolve(name="small-chat", price_of=price_current)
    assert grown is not None
    for user, version in first.items():
        if version == new.version:  # in the canary at 5 %: still there at 25 %
            assert grown.pick(tenant_id=7, user=f"u{user}").version == new.version


def test_the_bucket_depends_on_tenant_and_user_only():
    assert bucket_of(alias="a", tenant_id=1, user="x") == bucket_of(
        alias="a", tenant_id=1, user="x"
    )
    spread = {bucket_of(alias="a", tenant_id=t, user="x") for t in range(50)}
    assert len(spread) > 40


def test_a_version_whose_workers_are_not_ready_takes_no_traffic(canary):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=50)
    Deployment.objects.filter(version=new).update(state=DeploymentState.WARMING)
    assert set(_served("small-chat", range(200))) == {base.version}


def test_a_pinned_version_bypasses_the_split(canary):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=100)
    for name in (f"small@{base.version}", "small@one"):
        route = route_resolve(name=name, price_of=price_current, tenant_id=1, user="u1")
        assert route is not None and route.version == base.version


def test_splits_cannot_pass_100_percent_or_name_the_primary(canary, tmp_path):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=60)
    with pytest.raises(ValidationError, match="primary"):
        alias_split_set(alias=alias, version=base, percent=10)
    with pytest.raises(ValidationError, match="percent"):
        alias_split_set(alias=alias, version=new, percent=101)
    alias_split_set(alias=alias, version=new, percent=0)
    assert not Alias.objects.get(pk=alias.pk).splits.exists()


def test_a_route_carries_the_tool_parser_of_its_version(world):
    route = route_resolve(name="tiny-chat", price_of=price_current)
    assert route is not None and route.tool_parser == "hermes"


def test_an_adapters_route_carries_its_bases_tool_parser(tmp_path, world):
    adapter_dir = tmp_path / "tool-lora"
    adapter_dir.mkdir()
    (adapter_dir / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (adapter_dir / "adapter_model.safetensors").write_text("weights")
    adapter, _ = model_version_register(
        model_name="tiny-tool-lora", source_dir=adapter_dir, base=world.version
    )
    deployment_create(name="tiny-tool-lora-host", version=world.version, max_loras=1)
    route = route_resolve(name=adapter.public_name, price_of=price_current)
    assert route is not None and route.adapter == adapter.digest
    assert route.tool_parser == "hermes"


def test_a_version_served_by_several_deployments_routes_to_all_its_pools(canary):
    _alias, base, new = canary
    deployment_create(
        name="small-one-l4", version=base, accelerator="l4", spot=True, max_model_len=128
    )
    route = route_resolve(name="small-chat", price_of=price_current)
    assert route is not None and route.deployment == "small-one"
    assert [(p.deployment, p.spot, p.accelerator) for p in route.pools] == [
        ("small-one", False, ""),
        ("small-one-l4", True, "l4"),
    ]
    # A request must fit every pool it may join.
    assert route.context_length == 128
    # A version with one deployment has no pools to choose among.
    pinned = route_resolve(name=f"small@{new.version}", price_of=price_current)
    assert pinned is not None and pinned.pools == ()
