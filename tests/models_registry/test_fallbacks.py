"""An alias's fallback: set through the API and the service, checked, audited and routed."""

from __future__ import annotations

import itertools
import json

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from billing.services import price_current
from models_registry.models import Alias, Deployment, DeploymentState, Task
from models_registry.selectors import routing_resolve
from models_registry.services import (
    alias_fallback_set,
    alias_set,
    deployment_create,
    model_version_register,
)
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db


def _alias(tmp_path, name: str, *, task: str = Task.CHAT) -> Alias:
    source = tmp_path / name
    source.mkdir()
    config = {"max_position_embeddings": 256, "hidden_size": 8}
    (source / "config.json").write_text(json.dumps(config))
    (source / "weights.bin").write_text(name)
    version, _ = model_version_register(model_name=name, source_dir=source, task=task)
    deployment_create(name=f"{name}-d", version=version)
    Deployment.objects.filter(name=f"{name}-d").update(state=DeploymentState.READY)
    return alias_set(name=f"{name}-chat", version=version)


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("fbr-ops", is_staff=True))
    return client


def test_a_fallback_is_set_routed_audited_and_cleared_through_the_api(tmp_path, staff, world):
    big, small = _alias(tmp_path, "fbr-big"), _alias(tmp_path, "fbr-small")
    response = staff.put(
        "/api/aliases/fbr-big-chat/fallback",
        {"alias": "fbr-small-chat", "reason": "degrade, do not refuse"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["fallback"] == "fbr-small-chat"
    assert staff.get("/api/aliases/fbr-big-chat").json()["fallback"] == "fbr-small-chat"
    routing = routing_resolve(name="fbr-big-chat", price_of=price_current)
    assert routing is not None and routing.fallback == "fbr-small-chat"
    # The fallback's own routing has none: a chain ends where no alias names another.
    onward = routing_resolve(name="fbr-small-chat", price_of=price_current)
    assert onward is not None and onward.fallback == ""
    page = staff.get("/console/ops/aliases/fbr-big-chat").content.decode()
    assert '<a href="/console/ops/aliases/fbr-small-chat">fbr-small-chat</a> takes' in page
    event = AuditEvent.objects.filter(action="alias.fallback", target_id=big.name).get()
    assert event.before == {"fallback": None}
    assert event.after == {"fallback": small.name}
    assert event.reason == "degrade, do not refuse"

    cleared = staff.put("/api/aliases/fbr-big-chat/fallback", {"alias": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["fallback"] is None
    assert "Fallback: none" in staff.get("/console/ops/aliases/fbr-big-chat").content.decode()
    routing = routing_resolve(name="fbr-big-chat", price_of=price_current)
    assert routing is not None and routing.fallback == ""


def test_the_api_names_a_missing_alias_and_refuses_non_staff(tmp_path, staff, world):
    _alias(tmp_path, "fbr-one")
    missing = staff.put("/api/aliases/fbr-one-chat/fallback", {"alias": "nope"}, format="json")
    assert missing.status_code == 400 and "alias" in missing.json()
    assert (
        staff.put("/api/aliases/nope/fallback", {"alias": None}, format="json").status_code == 404
    )
    outsider = APIClient()
    outsider.force_login(world.alice)
    refused = outsider.put("/api/aliases/fbr-one-chat/fallback", {"alias": None}, format="json")
    assert refused.status_code == 403
    assert Alias.objects.get(name="fbr-one-chat").fallback is None


def test_a_fallback_to_itself_or_back_round_a_loop_is_refused(tmp_path, world):
    a, b, c = (_alias(tmp_path, f"fbr-loop-{x}") for x in "abc")
    with pytest.raises(ValidationError, match="itself"):
        alias_fallback_set(alias=a, fallback=a)
    alias_fallback_set(alias=a, fallback=b)
    alias_fallback_set(alias=b, fallback=c)
    loop = "a loop of fallbacks: fbr-loop-c-chat -> fbr-loop-a-chat -> fbr-loop-b-chat -> fbr-loop"
    with pytest.raises(ValidationError, match=loop):
        alias_fallback_set(alias=c, fallback=a)
    assert Alias.objects.get(pk=c.pk).fallback is None


def test_a_chain_longer_than_three_is_refused(tmp_path, world):
    chain = [_alias(tmp_path, f"fbr-chain-{i}") for i in range(5)]
    for here, there in itertools.pairwise(chain[1:]):
        alias_fallback_set(alias=here, fallback=there)  # 1 -> 2 -> 3 -> 4: three hops
    with pytest.raises(ValidationError, match="a chain of 4 fallbacks"):
        alias_fallback_set(alias=chain[0], fallback=chain[1])


def test_a_fallback_answers_the_same_kind_of_request(tmp_path, world):
    chat = _alias(tmp_path, "fbr-kind-chat")
    completion = _alias(tmp_path, "fbr-kind-text", task=Task.COMPLETION)
    encoder = _alias(tmp_path, "fbr-kind-vec", task=Task.EMBEDDING)
    other_encoder = _alias(tmp_path, "fbr-kind-vec2", task=Task.EMBEDDING)
    with pytest.raises(ValidationError, match="serves completion requests"):
        alias_fallback_set(alias=chat, fallback=completion)
    with pytest.raises(ValidationError, match="embedding"):
        alias_fallback_set(alias=encoder, fallback=other_encoder)
    assert not Alias.objects.filter(pk__in=[chat.pk, encoder.pk], fallback__isnull=False)


def test_an_alias_that_is_deleted_leaves_no_dangling_fallback(tmp_path, world):
    big, small = _alias(tmp_path, "fbr-del-big"), _alias(tmp_path, "fbr-del-small")
    alias_fallback_set(alias=big, fallback=small)
    small.delete()
    assert Alias.objects.get(pk=big.pk).fallback is None
    routing = routing_resolve(name=big.name, price_of=price_current)
    assert routing is not None and routing.fallback == ""


def test_the_console_sets_and_clears_a_fallback_and_says_why_not(tmp_path, staff, world):
    big, small = _alias(tmp_path, "fbr-con-big"), _alias(tmp_path, "fbr-con-small")
    page = "/console/ops/aliases/{}/fallback"
    set_ = staff.post(
        page.format("fbr-con-big-chat"),
        {"fallback": "fbr-con-small-chat", "reason": "degrade"},
        follow=True,
    )
    assert "fbr-con-small-chat now takes what fbr-con-big-chat cannot." in set_.content.decode()
    assert Alias.objects.get(pk=big.pk).fallback_id == small.pk
    assert AuditEvent.objects.filter(action="alias.fallback", reason="degrade").exists()
    loop = staff.post(page.format("fbr-con-small-chat"), {"fallback": big.name}, follow=True)
    assert "Fallback not changed: a loop of fallbacks" in loop.content.decode()
    assert Alias.objects.get(pk=small.pk).fallback is None
    cleared = staff.post(page.format("fbr-con-big-chat"), {"fallback": ""}, follow=True)
    assert "fbr-con-big-chat has no fallback now." in cleared.content.decode()
    assert Alias.objects.get(pk=big.pk).fallback is None


def test_the_consoles_form_names_a_hostile_alias_and_changes_nothing(tmp_path, staff, world):
    big = _alias(tmp_path, "fbr-nul-big")
    page = "/console/ops/aliases/fbr-nul-big-chat/fallback"
    for hostile in ("x" * 100_000, "../fbr-nul-big-chat"):
        answer = staff.post(page, {"fallback": hostile}, follow=True)
        assert answer.status_code == 200
        assert "Fallback not changed: no alias" in answer.content.decode()
    # A NUL is refused before any page reads the form (config.middleware).
    assert staff.post(page, {"fallback": "a\x00b"}).status_code == 400
    assert Alias.objects.get(pk=big.pk).fallback is None
