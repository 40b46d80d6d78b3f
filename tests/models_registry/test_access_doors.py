"""The operators' ways to change who may call a model, and a key's models: CLI and /api/."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from models_registry.models import Model
from models_registry.services import model_version_register
from tenants.models import ApiKey, AuditEvent
from tenants.services import api_key_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("oscar", is_staff=True))
    return client


def _source(tmp_path: Path, name: str) -> Path:
    source = tmp_path / name
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (source / "weights.bin").write_text(name)
    return source


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_an_operator_registers_a_model_for_a_tenant_and_limits_grants_and_revokes(tmp_path, world):
    said = _run("register_model", "acme-ft", str(_source(tmp_path, "acme-ft")), "--tenant", "acme")
    assert "acme's alone" in said
    assert Model.objects.get(name="acme-ft").owner == world.acme
    _run("register_model", "shared", str(_source(tmp_path, "shared")))
    assert _run("model_access", "show", "shared") == "shared: every tenant\n"
    said = _run("model_access", "limit", "shared", "--grant", "acme", "--reason", "pilot")
    assert said == "shared: granted: acme\n"
    assert _run("model_access", "grant", "shared", "globex") == "shared: granted: acme, globex\n"
    assert _run("model_access", "revoke", "shared", "acme") == "shared: granted: globex\n"
    assert "acme had no grant" in _run("model_access", "revoke", "shared", "acme")
    assert _run("model_access", "open", "shared") == "shared: every tenant\n"
    assert _run("model_access", "owner", "shared", "--tenant", "globex") == "shared: globex alone\n"
    with pytest.raises(CommandError, match="globex's alone"):
        _run("model_access", "grant", "shared", "acme")
    with pytest.raises(CommandError, match="no tenant 'initek'"):
        _run("model_access", "owner", "shared", "--tenant", "initek")
    with pytest.raises(CommandError, match="no model"):
        _run("model_access", "show", "nothing-here")
    actions = AuditEvent.objects.filter(target_id="shared", target_type="model")
    assert [e.action for e in actions] == [
        "model.limit",
        "model.grant",
        "model.revoke",
        "model.open",
        "model.owner",
    ]


def test_a_key_is_issued_narrowed_and_widened_from_the_command_line(world):
    out = _run("issue_key", "acme", "--name", "narrow", "--model", "tiny-chat", "--quiet")
    key = ApiKey.objects.get(tenant=world.acme, name="narrow")
    assert out.strip().startswith("rh-") and key.allowed_models == ["tiny-chat"]
    said = _run(
        "key_models", "acme", key.public_id, "--model", "tiny-llama", "--model", "tiny-chat"
    )
    assert said.endswith("calls tiny-chat, tiny-llama\n")
    assert "every model its tenant may call" in _run("key_models", "acme", key.public_id, "--all")
    with pytest.raises(CommandError, match="not a model or alias name"):
        _run("key_models", "acme", key.public_id, "--model", "tiny-llama@v1")
    with pytest.raises(CommandError, match="no key"):
        _run("key_models", "globex", key.public_id, "--all")  # another tenant's key


def test_staff_read_and_change_who_may_call_a_model_through_the_api(staff, tmp_path, world):
    model_version_register(model_name="api-model", source_dir=_source(tmp_path, "api-model"))
    body = staff.get("/api/models/api-model/access").json()
    assert body == {
        "model": "api-model",
        "owner": None,
        "limited": False,
        "grants": [],
        "adapter_on": [],
        "aliases": [],
    }
    refused = staff.put("/api/models/api-model/grants/acme", {}, format="json")
    assert refused.status_code == 400 and "limit it" in refused.json()["model"][0]
    changed = staff.patch("/api/models/api-model/access", {"limited": True}, format="json")
    assert changed.status_code == 200 and changed.json()["limited"] is True
    granted = staff.put("/api/models/api-model/grants/acme", {"reason": "pilot"}, format="json")
    assert granted.json()["grants"] == ["acme"]
    assert staff.delete("/api/models/api-model/grants/acme").json()["grants"] == []
    owned = staff.patch("/api/models/api-model/access", {"owner": "globex"}, format="json")
    assert owned.json()["owner"] == "globex" and owned.json()["limited"] is False
    unknown = staff.patch("/api/models/api-model/access", {"owner": "initek"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["owner"] == "no tenant 'initek'"
    assert staff.get("/api/models/no-such-model/access").status_code == 404
    assert staff.put("/api/models/api-model/grants/initek", {}, format="json").status_code == 404
    event = AuditEvent.objects.filter(action="model.grant", target_id="api-model").get()
    assert (event.tenant, event.reason, event.actor and event.actor.username) == (
        world.acme,
        "pilot",
        "oscar",
    )


def test_staff_narrow_a_key_through_the_api_and_a_bad_name_is_a_400_naming_the_field(staff, world):
    key = api_key_issue(tenant=world.acme, name="api-narrowed").key
    path = f"/api/tenants/acme/keys/{key.public_id}/models"
    assert staff.get(path).json() == {"key": key.public_id, "allowed_models": []}
    put = staff.put(path, {"allowed_models": ["tiny-chat", "tiny-chat"]}, format="json")
    assert put.json() == {"key": key.public_id, "allowed_models": ["tiny-chat"]}
    for bad in (["tiny chat"], ["x" * 101], "tiny-chat", [7]):
        answer = staff.put(path, {"allowed_models": bad}, format="json")
        assert answer.status_code == 400, answer.content
        assert "allowed_models" in answer.json()
    assert staff.get(f"/api/tenants/globex/keys/{key.public_id}/models").status_code == 404
    event = AuditEvent.objects.get(action="api_key.models", target_id=key.public_id)
    assert (event.before, event.after) == (
        {"allowed_models": []},
        {"allowed_models": ["tiny-chat"]},
    )


def test_tenant_users_cannot_change_model_access(world):
    client = APIClient()
    client.force_login(world.alice)
    assert client.get("/api/models/tiny-llama/access").status_code == 403
    assert client.put("/api/models/tiny-llama/grants/acme", {}, format="json").status_code == 403
