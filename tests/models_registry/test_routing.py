"""Weighted, sticky traffic splits of an alias, and pinned versions."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from billing.services import price_current
from models_registry.models import BUCKETS, Alias, Deployment, DeploymentState
from models_registry.selectors import Route, Routing, bucket_of, route_resolve, routing_resolve
from models_registry.services import (
    alias_set,
    alias_split_set,
    deployment_create,
    model_version_register,
)
from tenants.models import AuditEvent
from tenants.services import tenant_create, tenant_delete

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


# --- tenant targeting ------------------------------------------------------------------------


@pytest.fixture
def third(canary, tmp_path):
    """A third version of the small model, deployed and ready."""
    source = tmp_path / "three"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (source / "weights.bin").write_text("three")
    version, _ = model_version_register(model_name="small", source_dir=source, label="three")
    deployment_create(name="small-three", version=version)
    Deployment.objects.filter(name="small-three").update(state=DeploymentState.READY)
    return version


def test_a_split_targeting_a_tenant_moves_that_tenant_alone(canary, world):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=100, tenants=[world.acme])
    assert set(_served("small-chat", range(300), tenant_id=world.acme.pk)) == {new.version}
    assert set(_served("small-chat", range(300), tenant_id=world.globex.pk)) == {base.version}


def test_a_targeted_tenants_users_are_sticky_and_keep_their_version_as_its_share_grows(
    canary, world
):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=10, tenants=[world.acme])
    first = _served_each("small-chat", world.acme.pk)
    assert 0.05 < sum(v == new.version for v in first.values()) / len(first) < 0.15
    assert first == _served_each("small-chat", world.acme.pk)  # the same, asked again
    alias_split_set(alias=alias, version=new, percent=40, tenants=[world.acme])
    grown = _served_each("small-chat", world.acme.pk)
    assert all(grown[u] == new.version for u, v in first.items() if v == new.version)
    # Another tenant's users never see the targeted version, however many ask.
    assert set(_served_each("small-chat", world.globex.pk).values()) == {base.version}


def _served_each(name: str, tenant_id: int, users: int = 2000) -> dict[str, str]:
    routing = routing_resolve(name=name, price_of=price_current)
    assert routing is not None
    return {f"u{i}": routing.pick(tenant_id=tenant_id, user=f"u{i}").version for i in range(users)}


def test_a_targeted_tenant_follows_its_own_splits_not_everyones(canary, third, world):
    alias, base, new = canary
    alias_split_set(alias=alias, version=third, percent=100)  # every tenant not targeted
    alias_split_set(alias=alias, version=new, percent=30, tenants=[world.acme])
    acme = Counter(_served_each("small-chat", world.acme.pk).values())
    assert set(acme) == {base.version, new.version}  # third's 100 % is not acme's
    assert abs(acme[new.version] / 2000 - 0.30) < 0.04
    assert set(_served_each("small-chat", world.globex.pk).values()) == {third.version}


def test_rolling_back_one_tenant_leaves_another_tenants_targeting(canary, world):
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=100, tenants=[world.acme, world.globex])
    alias_split_set(
        alias=alias, version=new, percent=0, tenants=[world.acme], reason="acme saw regressions"
    )
    assert set(_served("small-chat", range(100), tenant_id=world.acme.pk)) == {base.version}
    assert set(_served("small-chat", range(100), tenant_id=world.globex.pk)) == {new.version}
    event = AuditEvent.objects.filter(action="alias.split", target_id="small-chat").latest("id")
    assert event.reason == "acme saw regressions"
    assert event.data["tenants"] == ["acme"]
    assert event.before == {"acme": {new.public_name: 100.0}}
    assert event.after == {"acme": {}}


def test_a_tenants_splits_cannot_pass_100_percent_and_a_deleted_tenant_is_refused(
    canary, third, world
):
    alias, _base, new = canary
    alias_split_set(alias=alias, version=new, percent=70, tenants=[world.acme])
    alias_split_set(alias=alias, version=third, percent=70)  # everyone else's: its own 100 %
    with pytest.raises(ValidationError, match="splits of acme"):
        alias_split_set(alias=alias, version=third, percent=40, tenants=[world.acme])
    gone = tenant_create(slug="gone-targeted")
    tenant_delete(tenant=gone)
    with pytest.raises(ValidationError, match="deleted"):
        alias_split_set(alias=alias, version=new, percent=10, tenants=[gone])


def test_a_routing_says_which_versions_each_tenant_can_be_sent_to(canary, world):
    """What a check on every version a tenant may get (model access) reads."""
    alias, base, new = canary
    alias_split_set(alias=alias, version=new, percent=25, tenants=[world.acme])
    routing = routing_resolve(name="small-chat", price_of=price_current)
    assert routing is not None
    assert [r.version for r in routing.routes_for(tenant_id=world.acme.pk)] == [
        base.version,
        new.version,
    ]
    assert [r.version for r in routing.routes_for(tenant_id=world.globex.pk)] == [base.version]
    assert routing.weights_for(tenant_id=world.acme.pk) == {new.version: 25.0, base.version: 75.0}
    # Another tenant is shown its own traffic: acme's targeting does not show.
    assert routing.weights_for(tenant_id=world.globex.pk) == {base.version: 100.0}


def test_a_targeted_tenant_whose_version_is_not_ready_stays_on_the_primary(canary, third, world):
    alias, base, new = canary
    alias_split_set(alias=alias, version=third, percent=100)
    alias_split_set(alias=alias, version=new, percent=100, tenants=[world.acme])
    Deployment.objects.filter(version=new).update(state=DeploymentState.WARMING)
    # Not the untargeted split's version: acme's targeting still holds, on the primary.
    assert set(_served("small-chat", range(200), tenant_id=world.acme.pk)) == {base.version}


def _route(version: str) -> Route:
    return Route(
        requested="a", model_name="m", version=version, version_digest=version, deployment=version,
        context_length=1, artifact_dir=Path("/"), sampling_defaults={},
        price_input_per_1k=Decimal(0), price_output_per_1k=Decimal(0), max_queued=1,
        max_queued_tokens=1,
    )  # fmt: skip


def test_pick_divides_a_targeted_tenants_buckets_among_its_own_splits_only():
    base, everyone, mine, second = (_route(v) for v in ("base", "all", "mine", "second"))
    routing = Routing(
        primary=base,
        splits=((BUCKETS, everyone),),
        targets={7: ((BUCKETS // 2, mine), (BUCKETS // 2 + BUCKETS // 4, second)), 8: ()},
    )
    by_bucket = {}
    for i in range(3000):
        bucket = bucket_of(alias="a", tenant_id=7, user=f"u{i}")
        by_bucket[bucket] = routing.pick(tenant_id=7, user=f"u{i}").version
    for bucket, version in by_bucket.items():
        expected = "mine" if bucket < 5000 else "second" if bucket < 7500 else "base"
        assert version == expected, bucket
    assert routing.pick(tenant_id=8, user="x").version == "base"  # targeted, nothing ready
    assert routing.pick(tenant_id=9, user="x").version == "all"
