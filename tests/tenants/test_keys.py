from __future__ import annotations

import itertools

import pytest
from django.core.exceptions import ValidationError

from tenants.keys import PREFIX, public_id_of, token_hash, token_parse
from tenants.models import ApiKey, AppendOnlyError, AuditEvent
from tenants.services import GENESIS_HASH, api_key_issue, api_key_revoke, tenant_create

pytestmark = pytest.mark.django_db


def test_it_stores_only_the_hash_of_a_new_key(world):
    issued = api_key_issue(tenant=world.acme, name="ci")
    stored = ApiKey.objects.get(pk=issued.key.pk)
    assert PREFIX == "rh-" and issued.token.startswith("rh-" + stored.public_id)
    assert stored.secret_hash == token_hash(issued.token)
    assert issued.token not in str(stored.__dict__)


def test_it_parses_only_well_formed_tokens():
    assert token_parse("sk-abc") is None
    assert token_parse("sy-short") is None
    assert token_parse("sy-ABCDEFGHIJKL" + "x" * 40) is None
    parsed = token_parse("rh-abcdefghijkl" + "x" * 40)
    assert parsed is not None and parsed.public_id == "abcdefghijkl"


def test_a_key_issued_before_the_rename_still_parses_whole():
    # Keys issued as `sy-...` keep working: the same public id, and the whole token as presented
    # (its stored hash covers the prefix it was issued with).
    token = "sy-abcdefghijkl" + "x" * 40
    parsed = token_parse(token)
    assert parsed is not None and parsed.public_id == "abcdefghijkl" and parsed.token == token
    assert token_parse("xy-abcdefghijkl" + "x" * 40) is None


def test_a_key_is_named_by_its_public_id_with_either_prefix_or_none():
    for named in ("rh-abcdefghijkl", "sy-abcdefghijkl", "abcdefghijkl"):
        assert public_id_of(named) == "abcdefghijkl"


def test_it_rejects_unknown_scopes(world):
    with pytest.raises(ValidationError):
        api_key_issue(tenant=world.acme, name="bad", scopes=["root"])


def test_revoking_twice_is_a_no_op(world):
    key = api_key_issue(tenant=world.acme, name="twice").key
    first = api_key_revoke(key=key).revoked_at
    assert api_key_revoke(key=key).revoked_at == first


def test_it_refuses_a_duplicate_tenant(world):
    with pytest.raises(ValidationError):
        tenant_create(slug="acme")


def test_audit_events_form_an_unbroken_hash_chain(world):
    api_key_issue(tenant=world.globex, name="audited")
    events = list(AuditEvent.objects.order_by("id"))
    assert events[0].prev_hash == GENESIS_HASH
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash


def test_audit_events_cannot_be_changed(world):
    event = AuditEvent.objects.order_by("id")[0]
    event.action = "tampered"
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()


def test_a_key_narrowed_to_models_keeps_its_list_through_rotation_and_refuses_bad_names(world):
    from tenants.services import api_key_models_set, api_key_rotate

    issued = api_key_issue(tenant=world.acme, name="narrow", allowed_models=["tiny-chat"] * 2)
    assert issued.key.allowed_models == ["tiny-chat"]
    assert api_key_rotate(key=issued.key).key.allowed_models == ["tiny-chat"]
    for bad in (["tiny-llama@v1"], [""], ["a" * 101], [f"m{i}" for i in range(101)]):
        with pytest.raises(ValidationError, match="allowed_models"):
            api_key_issue(tenant=world.acme, name="bad", allowed_models=bad)
    api_key_revoke(key=issued.key)
    with pytest.raises(ValidationError, match="revoked key"):
        api_key_models_set(key=issued.key, models=[])
