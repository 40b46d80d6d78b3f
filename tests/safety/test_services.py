"""Packs, assignments and interventions: loading, auditing, recording, the admin."""

from __future__ import annotations

import io
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from prometheus_client import REGISTRY

from models_registry.models import Alias, AliasSplit, Model, ModelVersion
from safety.detectors import Finding
from safety.models import Intervention, PolicyAssignment, PolicyPack
from safety.selectors import policy_load
from safety.services import (
    interventions_record,
    policy_assign,
    policy_pack_delete,
    policy_pack_save,
    policy_unassign,
)
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db


def _pack(**settings) -> PolicyPack:
    return policy_pack_save(name=f"pack-{uuid.uuid4().hex[:8]}", **settings)


def _counted(stage: str, detector: str, action: str) -> float:
    labels = {"stage": stage, "detector": detector, "action": action}
    return REGISTRY.get_sample_value("roundhouse_safety_interventions_total", labels) or 0.0


def _version(model_name: str) -> ModelVersion:
    """A version of a model of its own (no deployment: a pack's cover is the registry's)."""
    model, _ = Model.objects.get_or_create(name=model_name)
    return ModelVersion.objects.create(
        model=model, digest=uuid.uuid4().hex * 2, manifest={}, max_model_len=2048
    )


def test_a_tenant_without_a_pack_has_no_policy(world):
    assert policy_load(tenant_id=world.acme.pk, version=world.version.version) is None


def test_the_tenant_default_applies_to_every_model(world):
    pack = _pack(deny_terms=["falcon"])
    policy_assign(tenant=world.acme, pack=pack)
    policy = policy_load(tenant_id=world.acme.pk, version=world.version.version)
    assert policy is not None and policy.pack_id == pack.pk
    assert policy.check_input("about falcon").action == "block"
    other = policy_load(tenant_id=world.acme.pk, version=_version("other-model").digest)
    assert other is not None and other.pack_id == pack.pk
    assert policy_load(tenant_id=world.globex.pk, version=world.version.version) is None


def test_a_pack_on_an_alias_covers_its_model_by_every_name(world):
    # tiny-chat routes to tiny-llama: `tiny-chat`, `tiny-llama` and `tiny-llama@<version>`
    # are served by one version, so they run under one policy, found by that version.
    pack = _pack(pii_kinds=["email"], pii_action="block")
    policy_assign(tenant=world.globex, pack=pack, alias="tiny-chat")
    for version in (world.version.version, world.version.digest):
        policy = policy_load(tenant_id=world.globex.pk, version=version)
        assert policy is not None and policy.pack_id == pack.pk
    older = _version("tiny-llama")  # another version of the model: the same pack
    assert policy_load(tenant_id=world.globex.pk, version=older.version) is not None
    assert policy_load(tenant_id=world.globex.pk, version=_version("other-model").digest) is None


def test_a_pack_on_a_model_covers_the_aliases_that_route_to_it(world):
    pack = _pack(deny_terms=["falcon"])
    policy_assign(tenant=world.globex, pack=pack, alias="tiny-llama")
    policy = policy_load(tenant_id=world.globex.pk, version=world.version.version)
    assert policy is not None and policy.pack_id == pack.pk


def test_an_alias_split_brings_the_model_it_sends_to_under_the_aliases_pack(world):
    canary = _version("canary-model")
    alias = Alias.objects.get(name="tiny-chat")
    AliasSplit.objects.create(alias=alias, version=canary, buckets=100)
    policy_assign(tenant=world.globex, pack=_pack(deny_terms=["x"]), alias="tiny-chat")
    assert policy_load(tenant_id=world.globex.pk, version=canary.version) is not None


def test_every_pack_that_covers_a_model_applies_together(world, django_assert_max_num_queries):
    denying = _pack(deny_terms=["falcon"])
    redacting = _pack(pii_kinds=["email"], pii_action="redact", apply_to_output=False)
    policy_assign(tenant=world.acme, pack=denying, alias="tiny-chat")
    policy_assign(tenant=world.acme, pack=redacting, alias="tiny-llama")
    with django_assert_max_num_queries(3):
        policy = policy_load(tenant_id=world.acme.pk, version=world.version.version)
    assert policy is not None and policy.apply_to_input and policy.apply_to_output
    assert policy.check_input("about falcon").action == "block"
    verdict = policy.check_input("mail bob@example.com")
    assert (verdict.action, verdict.text) == ("redact", "mail [REDACTED:email]")
    # The output: the deny list stops it; the PII pack reads input only, so it passes e-mail.
    screen = policy.output_filter()
    sent = screen.feed("write to bob@example.com. ").text + screen.finish().text
    assert sent == "write to bob@example.com. "
    screen = policy.output_filter()
    sent = screen.feed("the falcon flies. ").text + screen.finish().text
    assert screen.stopped is not None and "falcon" not in sent


def test_a_named_pack_beats_the_tenant_default(world):
    default = _pack(deny_terms=["falcon"])
    strict = _pack(pii_kinds=["email"], pii_action="block")
    policy_assign(tenant=world.acme, pack=default)
    policy_assign(tenant=world.acme, pack=strict, alias="tiny-chat")
    policy = policy_load(tenant_id=world.acme.pk, version=world.version.version)
    assert policy is not None and policy.name == strict.name
    other = policy_load(tenant_id=world.acme.pk, version=_version("other-model").version)
    assert other is not None and other.name == default.name


@pytest.mark.parametrize(
    ("name", "says"),
    [("tiny-llama@v1", "not to a pinned version"), ("no-such-model", "no alias or model")],
)
def test_a_pack_is_assigned_only_to_a_name_that_covers_a_model(world, name, says):
    with pytest.raises(ValidationError) as refused:
        policy_assign(tenant=world.acme, pack=_pack(), alias=name)
    assert says in str(refused.value.message_dict["alias"])
    assert not PolicyAssignment.objects.filter(tenant=world.acme, alias=name).exists()


def test_assigning_a_pack_is_audited(world):
    first, second = _pack(), _pack()
    policy_assign(tenant=world.acme, pack=first, alias="tiny-chat", actor=world.alice)
    policy_assign(tenant=world.acme, pack=second, alias="tiny-chat", actor=world.alice)
    event = AuditEvent.objects.filter(action="policy.assign").latest("id")
    assert (event.tenant, event.actor, event.target_id) == (world.acme, world.alice, "acme")
    assert event.data == {"alias": "tiny-chat", "pack": second.name}
    assert (event.before, event.after) == ({"pack": first.name}, {"pack": second.name})


def test_assigning_the_same_pack_again_changes_nothing(world):
    pack = _pack()
    policy_assign(tenant=world.acme, pack=pack)
    events = AuditEvent.objects.count()
    policy_assign(tenant=world.acme, pack=pack)
    assert AuditEvent.objects.count() == events


def test_unassigning_is_audited_and_removes_the_policy(world):
    pack = _pack()
    policy_assign(tenant=world.acme, pack=pack)
    policy_unassign(tenant=world.acme, actor=world.alice)
    assert policy_load(tenant_id=world.acme.pk, version=world.version.version) is None
    event = AuditEvent.objects.filter(action="policy.unassign").latest("id")
    assert event.data == {"alias": "", "pack": pack.name}


def test_saving_a_pack_is_audited_with_before_and_after(world):
    pack = _pack(toxicity_threshold=0.9)
    policy_pack_save(name=pack.name, toxicity_threshold=0.7, pii_kinds=["email"], actor=world.alice)
    event = AuditEvent.objects.filter(action="policy_pack.save").latest("id")
    assert event.target_id == pack.name
    assert event.before is not None and event.after is not None
    assert (event.before["toxicity_threshold"], event.after["toxicity_threshold"]) == (0.9, 0.7)
    assert event.after["pii_kinds"] == ["email"]
    assert PolicyPack.objects.get(pk=pack.pk).toxicity_threshold == 0.7


def test_a_pattern_that_does_not_compile_is_a_validation_error_naming_the_field(world):
    with pytest.raises(ValidationError) as caught:
        _pack(deny_patterns=[r"fine-\d+", r"(unclosed"])
    errors = caught.value.message_dict
    assert list(errors) == ["deny_patterns"]
    assert "pattern 2 ('(unclosed') does not compile" in errors["deny_patterns"][0]


def test_a_pattern_that_backtracks_catastrophically_is_refused(world):
    with pytest.raises(ValidationError) as caught:
        _pack(deny_patterns=[r"^(\w+\s?)+$"])
    assert "backtracks" in caught.value.message_dict["deny_patterns"][0]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"toxicity_threshold": 0.0}, "toxicity_threshold"),
        ({"toxicity_threshold": 1.5}, "toxicity_threshold"),
        ({"pii_kinds": ["ssn"]}, "pii_kinds"),
        ({"pii_action": "shout"}, "pii_action"),
        ({"deny_terms": ["  "]}, "deny_terms"),
    ],
)
def test_invalid_settings_are_refused_by_field(world, settings, field):
    with pytest.raises(ValidationError) as caught:
        _pack(**settings)
    assert list(caught.value.message_dict) == [field]


def test_a_pack_in_use_cannot_be_deleted(world):
    pack = _pack()
    policy_assign(tenant=world.globex, pack=pack)
    with pytest.raises(ValidationError, match="assigned to globex"):
        policy_pack_delete(pack=pack)
    policy_unassign(tenant=world.globex)
    policy_pack_delete(pack=pack)
    assert not PolicyPack.objects.filter(pk=pack.pk).exists()


def test_interventions_are_recorded_without_text_and_counted(world):
    findings = [Finding("pii", "email", 5, 20), Finding("pii", "card", 30, 49)]
    before = _counted("input", "pii", "redact")
    interventions_record(
        tenant_id=world.acme.pk,
        request_id="req-redact-1",
        stage="input",
        findings=findings,
        action="redact",
    )
    rows = Intervention.objects.filter(request_id="req-redact-1").order_by("kind")
    assert [(r.tenant_id, r.stage, r.detector, r.kind, r.action) for r in rows] == [
        (world.acme.pk, "input", "pii", "card", "redact"),
        (world.acme.pk, "input", "pii", "email", "redact"),
    ]
    assert "excerpt" not in {f.name for f in Intervention._meta.get_fields()}  # never text
    assert _counted("input", "pii", "redact") == before + 2


def test_recording_no_findings_writes_nothing(world):
    interventions_record(
        tenant_id=world.acme.pk, request_id="req-none", stage="input", findings=[], action="block"
    )
    assert not Intervention.objects.filter(request_id="req-none").exists()


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser(f"safety-operator-{uuid.uuid4().hex[:6]}"))
    return client


def test_the_admin_pages_render(operator, world):
    pack = _pack(deny_terms=["falcon"])
    assignment = policy_assign(tenant=world.acme, pack=pack)
    interventions_record(
        tenant_id=world.acme.pk,
        request_id="req-admin",
        stage="input",
        findings=[Finding("deny_list", "term", 0, 6)],
        action="block",
    )
    intervention = Intervention.objects.get(request_id="req-admin")
    for name, obj in [
        ("policypack", pack),
        ("policyassignment", assignment),
        ("intervention", intervention),
    ]:
        assert operator.get(reverse(f"admin:safety_{name}_changelist")).status_code == 200
        change = reverse(f"admin:safety_{name}_change", args=[obj.pk])
        assert operator.get(change).status_code == 200


def test_a_pack_saved_in_the_admin_is_validated_and_audited(operator, world):
    url = reverse("admin:safety_policypack_add")
    form = {
        "name": "admin-pack",
        "description": "",
        "toxicity_threshold": "0.8",
        "pii_kinds": '["email"]',
        "pii_action": "redact",
        "deny_terms": "[]",
        "deny_patterns": '["(bad"]',
        "apply_to_input": "on",
        "apply_to_output": "on",
    }
    refused = operator.post(url, form)
    assert refused.status_code == 200
    assert "does not compile" in refused.content.decode()
    assert operator.post(url, {**form, "deny_patterns": '["acme-\\\\d+"]'}).status_code == 302
    event = AuditEvent.objects.filter(action="policy_pack.save").latest("id")
    assert event.target_id == "admin-pack"
    assert event.after is not None and event.after["deny_patterns"] == [r"acme-\d+"]


def test_an_assignment_made_in_the_admin_is_audited(operator, world):
    pack = _pack()
    url = reverse("admin:safety_policyassignment_add")
    response = operator.post(url, {"tenant": world.globex.pk, "alias": "", "pack": pack.pk})
    assert response.status_code == 302
    assert PolicyAssignment.objects.get(tenant=world.globex, alias="").pack == pack
    event = AuditEvent.objects.filter(action="policy.assign").latest("id")
    assert event.tenant == world.globex


@pytest.mark.django_db
def test_the_command_saves_assigns_lists_and_explains_bad_input(world):
    out = io.StringIO()
    call_command(
        "safety_policy", "pack", "strict", "--toxicity", "0.8", "--pii", "email,card",
        "--pii-action", "block", "--deny-terms", "alpha, beta", "--deny-pattern", r"\bsecret-\d+",
        stdout=out,
    )  # fmt: skip
    call_command("safety_policy", "assign", "globex", "strict", "--alias", "tiny-chat", stdout=out)
    call_command("safety_policy", "list", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["pack strict saved", "globex for tiny-chat uses strict"]
    assert any(
        line.startswith("strict: toxicity>0.8; pii email,card (block); deny 2 terms, 1 patterns")
        and line.endswith("-> globex/tiny-chat")
        for line in lines
    )
    with pytest.raises(CommandError, match=r"pattern"):
        call_command("safety_policy", "pack", "broken", "--deny-pattern", "(unclosed")
    with pytest.raises(CommandError, match="no tenant 'nobody'"):
        call_command("safety_policy", "assign", "nobody", "strict")
    call_command("safety_policy", "unassign", "globex", "--alias", "tiny-chat", stdout=out)
    assert out.getvalue().splitlines()[-1] == "globex has no pack for tiny-chat"
