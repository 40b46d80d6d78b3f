"""Retained prompt and completion text: off by default, encrypted at rest, purged on time."""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import sys
import uuid

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from privacy.crypto import content_keys_check
from privacy.models import RetainedContent
from privacy.selectors import content_get
from privacy.services import content_purge, content_retain
from privacy.tasks import content_purge as content_purge_task
from tenants.services import tenant_create, tenant_delete, tenant_privacy_update

pytestmark = pytest.mark.django_db
PROMPT = "my card number is 4111 1111 1111 1111"
COMPLETION = "noted: the card ending 1111"


def _retain(tenant, *, days: int = 30, now: dt.datetime | None = None, request_id: str = ""):
    request_id = request_id or uuid.uuid4().hex
    stored = content_retain(
        tenant_id=tenant.pk,
        request_id=request_id,
        prompt=PROMPT,
        completion=COMPLETION,
        retention_days=days,
        now=now,
    )
    return request_id, stored


def _raw_ciphertext(request_id: str) -> bytes:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ciphertext FROM privacy_retainedcontent WHERE request_id = %s", [request_id]
        )
        return bytes(cursor.fetchone()[0])


def test_a_new_tenant_keeps_no_text_and_permits_no_training(world):
    tenant = tenant_create(slug="privacy-defaults")
    assert tenant.retention_days == 0 and tenant.no_training is True
    assert tenant.deleted_at is None and tenant.training_use == "not permitted"


def test_it_stores_nothing_when_retention_is_off(world):
    request_id, stored = _retain(world.acme, days=0)
    assert stored is False
    assert not RetainedContent.objects.filter(request_id=request_id).exists()
    assert content_get(tenant=world.acme, request_id=request_id) is None


def test_it_stores_the_text_encrypted_and_reads_it_back(world):
    request_id, stored = _retain(world.acme)
    assert stored is True
    raw = _raw_ciphertext(request_id)
    assert PROMPT.encode() not in raw and COMPLETION.encode() not in raw
    assert b"4111" not in raw and b"prompt" not in raw
    text = content_get(tenant=world.acme, request_id=request_id)
    assert text is not None
    assert (text.prompt, text.completion) == (PROMPT, COMPLETION)
    assert text.expires_at - text.created_at == dt.timedelta(days=30)
    assert PROMPT not in repr(text)


def test_another_tenants_request_is_none(world):
    request_id, _ = _retain(world.acme)
    assert content_get(tenant=world.globex, request_id=request_id) is None


def test_a_replayed_request_stores_nothing_new(world):
    request_id, first = _retain(world.acme)
    before = _raw_ciphertext(request_id)
    _, again = _retain(world.acme, request_id=request_id)
    _, elsewhere = _retain(world.globex, request_id=request_id)
    assert (first, again, elsewhere) == (True, False, False)
    assert RetainedContent.objects.filter(request_id=request_id).count() == 1
    assert _raw_ciphertext(request_id) == before


def test_a_deleted_tenant_stores_no_text(world):
    tenant = tenant_create(slug="privacy-gone")
    tenant_delete(tenant=tenant)
    request_id, stored = _retain(tenant)
    assert stored is False and not RetainedContent.objects.filter(request_id=request_id).exists()


def test_the_purge_removes_exactly_the_expired_rows(world):
    start = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
    _retain(world.acme, days=1, now=start)
    _retain(world.globex, days=2, now=start)  # expires at the very moment of the purge
    long, _ = _retain(world.acme, days=3, now=start)
    purged = content_purge(now=start + dt.timedelta(days=2))
    assert purged == 2
    assert list(RetainedContent.objects.values_list("request_id", flat=True)) == [long]
    assert content_purge(now=start + dt.timedelta(days=2)) == 0


def test_expired_text_is_hidden_before_the_purge_reaches_it(world):
    request_id, _ = _retain(world.acme, days=1, now=timezone.now() - dt.timedelta(days=2))
    assert RetainedContent.objects.filter(request_id=request_id).exists()
    assert content_get(tenant=world.acme, request_id=request_id) is None


def test_the_purge_task_runs_every_hour(world):
    _retain(world.acme, days=1, now=timezone.now() - dt.timedelta(days=2))
    assert content_purge_task() == 1
    entry = settings.CELERY_BEAT_SCHEDULE["privacy-content-purge"]
    assert entry["task"] == "privacy.tasks.content_purge" == content_purge_task.name
    assert entry["schedule"].remaining_estimate(timezone.now()) <= dt.timedelta(hours=1)


def test_a_shorter_retention_applies_to_text_already_kept(world):
    tenant = tenant_create(slug="privacy-shorter")
    tenant_privacy_update(tenant=tenant, retention_days=30)
    recent, _ = _retain(tenant, days=30)
    older, _ = _retain(tenant, days=30, now=timezone.now() - dt.timedelta(days=10))
    tenant_privacy_update(tenant=tenant, retention_days=7)
    assert content_get(tenant=tenant, request_id=recent) is not None
    assert content_get(tenant=tenant, request_id=older) is None
    tenant_privacy_update(tenant=tenant, retention_days=0)
    assert content_get(tenant=tenant, request_id=recent) is None
    assert content_purge() == 2


def test_text_sealed_with_an_old_key_is_readable_after_rotation(world):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(ROUNDHOUSE_CONTENT_KEYS=[old]):
        sealed_old, _ = _retain(world.acme)
    with override_settings(ROUNDHOUSE_CONTENT_KEYS=[new, old]):
        sealed_new, _ = _retain(world.acme)
        for request_id in (sealed_old, sealed_new):
            text = content_get(tenant=world.acme, request_id=request_id)
            assert text is not None and text.prompt == PROMPT
    # The first key encrypts: the new row opens with the new key alone.
    assert PROMPT in Fernet(new).decrypt(_raw_ciphertext(sealed_new)).decode()
    with override_settings(ROUNDHOUSE_CONTENT_KEYS=[new]), pytest.raises(InvalidToken):
        content_get(tenant=world.acme, request_id=sealed_old)


def test_a_malformed_content_key_is_refused_at_start():
    with override_settings(ROUNDHOUSE_CONTENT_KEYS=["not-a-fernet-key"]):
        with pytest.raises(ImproperlyConfigured) as raised:
            content_keys_check()
        assert "not-a-fernet-key" not in str(raised.value)
    with override_settings(ROUNDHOUSE_CONTENT_KEYS=[]), pytest.raises(ImproperlyConfigured):
        content_keys_check()


def test_the_text_is_never_logged(world, caplog):
    caplog.set_level(logging.DEBUG)
    _retain(world.acme, days=1, now=timezone.now() - dt.timedelta(days=2))
    kept, _ = _retain(world.acme)
    content_get(tenant=world.acme, request_id=kept)
    content_purge()
    assert caplog.records  # the purge says how many rows it removed
    assert "4111" not in caplog.text and "noted" not in caplog.text


@pytest.mark.parametrize("raw", [None, "", " , "])
def test_production_settings_refuse_to_start_without_a_content_key(monkeypatch, raw):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "k" * 50)
    monkeypatch.setenv("DJANGO_ALLOWED_HOSTS", "roundhouse.example")
    if raw is None:
        monkeypatch.delenv("ROUNDHOUSE_CONTENT_KEYS", raising=False)
    else:
        monkeypatch.setenv("ROUNDHOUSE_CONTENT_KEYS", raw)
    monkeypatch.delitem(sys.modules, "config.settings.prod", raising=False)
    with pytest.raises((KeyError, ImproperlyConfigured)):
        importlib.import_module("config.settings.prod")


def test_production_settings_take_the_content_keys_from_the_environment(monkeypatch):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    monkeypatch.setenv("DJANGO_SECRET_KEY", "k" * 50)
    monkeypatch.setenv("DJANGO_ALLOWED_HOSTS", "roundhouse.example")
    monkeypatch.setenv("ROUNDHOUSE_CONTENT_KEYS", f"{new}, {old}")
    monkeypatch.delitem(sys.modules, "config.settings.prod", raising=False)
    prod = importlib.import_module("config.settings.prod")
    assert [new, old] == prod.ROUNDHOUSE_CONTENT_KEYS
    sys.modules.pop("config.settings.prod", None)
