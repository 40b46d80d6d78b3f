"""Who may call which model: owners, grants, adapters, aliases and what routing does with them.

Against the fixture world's tenants acme and globex, with small models registered and given
deployments here (routing needs one; no worker runs).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from billing.services import price_current
from models_registry.access import name_allowed, routing_for_tenant, version_audience
from models_registry.models import Deployment, DeploymentState, Model, ModelVersion
from models_registry.selectors import Routing, model_list_for_tenant, routing_resolve
from models_registry.services import (
    alias_fallback_set,
    alias_set,
    alias_shadow_set,
    alias_split_set,
    deployment_create,
    model_grant,
    model_limit_set,
    model_owner_set,
    model_revoke,
    model_version_register,
)
from tenants.models import AuditEvent, Tenant

pytestmark = pytest.mark.django_db


def _source(tmp_path: Path, name: str, *, adapter: bool = False) -> Path:
    source = tmp_path / name
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (source / "weights.bin").write_text(name)
    if adapter:
        (source / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return source


def _model(
    tmp_path: Path,
    name: str,
    *,
    owner: Tenant | None = None,
    base: ModelVersion | None = None,
    loras: int = 0,
) -> ModelVersion:
    """Register a small version (an adapter with `base`) and give it a ready deployment."""
    version, _ = model_version_register(
        model_name=name,
        source_dir=_source(tmp_path, name, adapter=base is not None),
        owner=owner,
        base=base,
    )
    if base is None:
        deployment_create(name=f"{name}-d", version=version, max_loras=loras)
        Deployment.objects.filter(name=f"{name}-d").update(state=DeploymentState.READY)
    return version


def _routing(name: str, tenant: Tenant, allowed: tuple[str, ...] = ()) -> Routing | None:
    routing = routing_resolve(name=name, price_of=price_current)
    assert routing is not None, f"{name} routes nowhere at all"
    return routing_for_tenant(routing, name=name, tenant_id=tenant.pk, allowed=allowed)


def test_a_model_registered_for_a_tenant_routes_for_that_tenant_alone(tmp_path, world):
    version = _model(tmp_path, "acme-llama", owner=world.acme)
    alias_set(name="acme-chat", version=version)
    for name in ("acme-llama", version.public_name, "acme-chat"):
        assert _routing(name, world.acme) is not None, name
        assert _routing(name, world.globex) is None, name
    # The platform's model stays everyone's.
    assert _routing("tiny-llama", world.globex) is not None


def test_a_limited_model_routes_for_the_tenants_granted_it_until_revoked(tmp_path, world):
    version = _model(tmp_path, "limited-llama")
    model = version.model
    assert _routing("limited-llama", world.globex) is not None  # open until limited
    model_limit_set(model=model, limited=True, grants=[world.acme])
    assert _routing("limited-llama", world.acme) is not None
    assert _routing("limited-llama", world.globex) is None
    model_grant(model=model, tenant=world.globex)
    assert _routing("limited-llama", world.globex) is not None
    assert model_revoke(model=model, tenant=world.globex)
    assert _routing("limited-llama", world.globex) is None
    assert not model_revoke(model=model, tenant=world.globex)  # twice: nothing changes
    model_limit_set(model=model, limited=False)
    assert _routing("limited-llama", world.globex) is not None
    assert not model.grants.exists()  # an open model keeps no grants


def test_an_adapter_built_for_a_tenant_routes_for_that_tenant_alone(tmp_path, world):
    base = _model(tmp_path, "lora-base", loras=1)
    adapter = _model(tmp_path, "acme-pirate", owner=world.acme, base=base)
    assert _routing("acme-pirate", world.acme) is not None
    assert _routing(adapter.public_name, world.acme) is not None
    assert _routing("acme-pirate", world.globex) is None
    assert _routing(adapter.public_name, world.globex) is None
    assert _routing("lora-base", world.globex) is not None  # the base stays the platform's


def test_an_adapter_on_a_limited_base_needs_the_base_too(tmp_path, world):
    """A tenant calls the base's weights through an adapter: the base's grants apply."""
    base = _model(tmp_path, "lora-limited-base", loras=1)
    adapter = _model(tmp_path, "open-adapter", base=base)
    model_limit_set(model=base.model, limited=True, grants=[world.acme])
    stored = ModelVersion.objects.select_related("model", "base__model").get(pk=adapter.pk)
    assert version_audience(stored) == frozenset({world.acme.pk})
    assert _routing("open-adapter", world.acme) is not None
    assert _routing("open-adapter", world.globex) is None


def test_a_split_a_tenant_may_not_use_sends_that_tenants_share_to_the_primary(tmp_path, world):
    primary = _model(tmp_path, "split-primary")
    canary = _model(tmp_path, "split-canary")
    alias = alias_set(name="split-chat", version=primary)
    alias_split_set(alias=alias, version=canary, percent=50)
    # Limited after the split was set: routing, not the configuration, keeps globex out.
    model_limit_set(model=canary.model, limited=True, grants=[world.acme])

    def served(tenant: Tenant) -> Counter[str]:
        routing = _routing("split-chat", tenant)
        assert routing is not None
        return Counter(routing.pick(tenant_id=tenant.pk, user=f"u{i}").version for i in range(400))

    assert served(world.acme)[canary.version] > 100  # acme still takes the canary's half
    assert served(world.globex) == {primary.version: 400}
    shown = _routing("split-chat", world.globex)
    assert shown is not None and shown.weights == {primary.version: 100.0}


def test_a_shadow_a_tenant_may_not_use_gets_no_copy_of_its_requests(tmp_path, world):
    primary = _model(tmp_path, "shadow-primary")
    candidate = _model(tmp_path, "shadow-candidate")
    alias = alias_set(name="shadow-chat", version=primary)
    alias_shadow_set(alias=alias, version=candidate, percent=100)
    model_limit_set(model=candidate.model, limited=True, grants=[world.acme])
    acme, globex = _routing("shadow-chat", world.acme), _routing("shadow-chat", world.globex)
    assert acme is not None and acme.shadow_for(request_id="r1") is not None
    assert globex is not None and globex.shadow_for(request_id="r1") is None


def test_a_key_narrowed_to_names_calls_those_and_a_models_pinned_versions(tmp_path, world):
    assert name_allowed("anything", ())
    assert name_allowed("tiny-chat", ("tiny-chat",))
    assert not name_allowed("tiny-llama", ("tiny-chat",))  # an alias does not cover its model
    assert name_allowed("tiny-llama@abcdef123456", ("tiny-llama",))
    assert not name_allowed("tiny-chat@abcdef123456", ("tiny-llama",))
    assert _routing("tiny-chat", world.acme, ("tiny-chat",)) is not None
    assert _routing("tiny-llama", world.acme, ("tiny-chat",)) is None


def test_a_new_version_of_a_tenants_model_is_that_tenants_too(tmp_path, world):
    _model(tmp_path, "owned-twice", owner=world.acme)
    for owner in (None, world.globex):
        with pytest.raises(ValidationError) as refused:
            model_version_register(
                model_name="owned-twice",
                source_dir=_source(tmp_path, f"owned-twice-{owner}"),
                owner=owner,
            )
        assert "tenant acme's" in str(refused.value)
    with pytest.raises(ValidationError, match="platform-wide"):
        model_version_register(
            model_name="tiny-llama", source_dir=_source(tmp_path, "mine"), owner=world.acme
        )


def test_an_adapter_on_a_tenants_model_must_be_that_tenants(tmp_path, world):
    base = _model(tmp_path, "acme-base", owner=world.acme, loras=1)
    for owner in (None, world.globex):
        with pytest.raises(ValidationError, match="an adapter on it is acme's too"):
            model_version_register(
                model_name=f"stray-{owner}",
                source_dir=_source(tmp_path, f"stray-{owner}", adapter=True),
                base=base,
                owner=owner,
            )
    assert _model(tmp_path, "acme-adapter", owner=world.acme, base=base).model.owner == world.acme


def test_an_alias_cannot_send_its_tenants_to_a_version_some_may_not_use(tmp_path, world):
    open_version = _model(tmp_path, "open-one")
    owned = _model(tmp_path, "acme-one", owner=world.acme)
    alias = alias_set(name="open-chat", version=open_version)
    for change in (
        lambda: alias_split_set(alias=alias, version=owned, percent=10),
        lambda: alias_shadow_set(alias=alias, version=owned, percent=10),
        lambda: alias_fallback_set(alias=alias, fallback=alias_set(name="acme-x", version=owned)),
    ):
        with pytest.raises(ValidationError, match="only acme"):
            change()
    assert not alias.splits.exists()
    # The other way round is fine: acme's alias may split to a platform version.
    mine = alias_set(name="acme-own-chat", version=owned)
    alias_split_set(alias=mine, version=open_version, percent=10)
    # And an alias repointed at acme's model may not keep an open alias falling back to it.
    alias_fallback_set(alias=alias, fallback=alias_set(name="open-two", version=open_version))
    with pytest.raises(ValidationError, match="falls back to open-two"):
        alias_set(name="open-two", version=owned)


def test_giving_a_model_to_a_tenant_is_refused_while_an_open_alias_splits_to_it(tmp_path, world):
    primary = _model(tmp_path, "keeps-primary")
    given = _model(tmp_path, "to-give")
    alias_split_set(alias=alias_set(name="keeps-chat", version=primary), version=given, percent=5)
    with pytest.raises(ValidationError, match="keeps-chat"):
        model_owner_set(model=given.model, owner=world.acme)
    assert Model.objects.get(pk=given.model.pk).owner is None


def test_a_grant_on_an_open_or_owned_model_is_refused(tmp_path, world):
    with pytest.raises(ValidationError, match="open to every tenant: limit it"):
        model_grant(model=world.version.model, tenant=world.acme)
    owned = _model(tmp_path, "acme-only", owner=world.acme)
    with pytest.raises(ValidationError, match="acme's alone"):
        model_grant(model=owned.model, tenant=world.globex)
    with pytest.raises(ValidationError, match="acme's alone"):
        model_limit_set(model=owned.model, limited=True)


def test_grants_revocations_limits_and_owners_are_audit_events(tmp_path, world, monkeypatch):
    published: list[str] = []
    monkeypatch.setattr(
        "models_registry.services.change_publish", lambda kind: published.append(kind)
    )
    model = _model(tmp_path, "audited").model
    start = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    model_limit_set(model=model, limited=True, grants=[world.acme], reason="trial")
    model_grant(model=model, tenant=world.globex, reason="signed")
    model_revoke(model=model, tenant=world.globex, reason="ended")
    model_limit_set(model=model, limited=False)
    model_owner_set(model=model, owner=world.globex, reason="their fine-tune")
    events = list(AuditEvent.objects.filter(id__gt=start, target_type="model"))
    assert [(e.action, e.target_id, e.reason) for e in events] == [
        ("model.limit", "audited", "trial"),
        ("model.grant", "audited", "signed"),
        ("model.revoke", "audited", "ended"),
        ("model.open", "audited", ""),
        ("model.owner", "audited", "their fine-tune"),
    ]
    assert events[0].after == {"owner": None, "limited": True, "grants": ["acme"]}
    assert events[2].tenant == world.globex
    assert events[4].before == {"owner": None, "limited": False, "grants": []}
    assert events[4].after == {"owner": "globex", "limited": False, "grants": []}
    # Every change of access tells the frontends to drop their routes at once.
    assert published.count("access") == 5


def test_a_tenants_console_list_shows_its_models_and_never_another_tenants(tmp_path, world):
    base = _model(tmp_path, "list-base", loras=1)
    _model(tmp_path, "acme-listed", owner=world.acme, base=base)
    _model(tmp_path, "globex-listed", owner=world.globex)
    acme = {row.model.name: row for row in model_list_for_tenant(tenant_id=world.acme.pk)}
    globex = {row.model.name for row in model_list_for_tenant(tenant_id=world.globex.pk)}
    assert acme["acme-listed"].access == "yours"
    assert acme["acme-listed"].bases == (base.public_name,)
    assert acme["tiny-llama"].access == "platform"
    assert "globex-listed" not in acme and "acme-listed" not in globex


# --- the migration -----------------------------------------------------------------------------

BEFORE = [("models_registry", "0012_tenant_targeting"), ("tenants", "0006_quota_large_body_bytes")]
AFTER = [("models_registry", "0013_model_access"), ("tenants", "0007_apikey_allowed_models")]


def _migrate(targets: list[tuple[str, str]]) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


def test_the_migration_keeps_every_existing_model_and_key_open_as_before(world):
    """Runs in the test's transaction (PostgreSQL's DDL is transactional): rolled back after."""
    old = _migrate(BEFORE)
    old.get_model("models_registry", "Model").objects.create(name="from-before", task="chat")
    old_key = old.get_model("tenants", "ApiKey").objects.create(
        tenant_id=world.acme.pk, name="before", public_id="b4b4b4b4b4b4", secret_hash="x"
    )
    new = _migrate(AFTER)
    model = new.get_model("models_registry", "Model").objects.get(name="from-before")
    assert (model.owner_id, model.limited) == (None, False)
    assert not new.get_model("models_registry", "ModelGrant").objects.exists()
    key = new.get_model("tenants", "ApiKey").objects.get(pk=old_key.pk)
    assert key.allowed_models == []


def test_a_canary_some_of_an_aliass_callers_may_not_use_is_refused(tmp_path, world):
    from rollouts.services import rollout_start

    alias = alias_set(name="canaried-chat", version=_model(tmp_path, "canaried"))
    owned = _model(tmp_path, "acme-canary", owner=world.acme)
    with pytest.raises(ValidationError, match="open to only acme, but canaried-chat to every"):
        rollout_start(alias=alias, canary=owned)
    assert not alias.splits.exists()


def test_a_split_targeted_at_a_tenant_may_send_it_alone_to_its_own_model(tmp_path, world):
    open_version = _model(tmp_path, "targeted-open")
    owned = _model(tmp_path, "acme-targeted", owner=world.acme)
    alias = alias_set(name="targeted-chat", version=open_version)
    with pytest.raises(ValidationError, match="only acme"):
        alias_split_set(alias=alias, version=owned, percent=100, tenants=[world.globex])
    alias_split_set(alias=alias, version=owned, percent=100, tenants=[world.acme])
    acme, globex = _routing("targeted-chat", world.acme), _routing("targeted-chat", world.globex)
    assert acme is not None
    assert acme.pick(tenant_id=world.acme.pk, user=None).version == owned.version
    assert globex is not None
    assert globex.pick(tenant_id=world.globex.pk, user=None).version == open_version.version
    # Given back to the platform and limited to globex (a revocation is never refused), acme's
    # targeted share goes to the primary, and what globex gets names no other tenant's split.
    model_owner_set(model=owned.model, owner=None)
    model_limit_set(model=owned.model, limited=True, grants=[world.globex])
    acme = _routing("targeted-chat", world.acme)
    assert acme is not None
    assert acme.pick(tenant_id=world.acme.pk, user=None).version == open_version.version
    assert acme.weights_for(tenant_id=world.acme.pk) == {open_version.version: 100.0}
    assert acme.targets == {}
