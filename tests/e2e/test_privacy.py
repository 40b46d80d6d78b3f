"""What the platform's processes log: never a key's secret, never a prompt or a completion."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from privacy.models import RetainedContent
from privacy.selectors import content_get
from tenants.services import api_key_issue, tenant_create, tenant_privacy_update
from tests.conftest import ALIAS

PROMPT = "Quietly remember the violet heron 7731"

# An API key, current (rh-) or issued before the rename (sy-): prefix, public id, secret.
KEY_SHAPE = r"(rh|sy)-[a-z0-9]{12}[A-Za-z0-9_-]{16,}"
# Columns that hold text sealed with the content keys (privacy.crypto).
SEALED = {("privacy_retainedcontent", "ciphertext"), ("inference_storedresponse", "sealed")}


@pytest.mark.run_last
def test_logs_carry_no_key_secret_and_no_prompt_or_completion(stack, world):
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        answered = client.post(
            "/v1/chat/completions",
            json={
                "model": ALIAS,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 8,
            },
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
        # A refused key and a malformed body are what a server is tempted to echo.
        client.post("/v1/completions", json={"model": ALIAS, "prompt": PROMPT},
                    headers={"Authorization": f"Bearer {world.revoked_key}"})  # fmt: skip
        client.post("/v1/completions", json={"model": ALIAS, "prompt": PROMPT, "n": "x"},
                    headers={"Authorization": f"Bearer {world.acme_key}"})  # fmt: skip
    assert answered.status_code == 200, answered.text
    completion = answered.json()["choices"][0]["message"]["content"]
    # Everything the frontend, worker and ingester logged in the whole run (this test runs last).
    logs = "\n".join(p.tail(1_000_000) for p in (stack.frontend, stack.worker, stack.ingester))
    assert "engine ready" in logs  # the logs are really there
    secrets = [world.acme_key, world.globex_key, world.revoked_key, world.expired_key,
               world.models_only_key, *world.limited_keys.values()]  # fmt: skip
    for token in secrets:
        assert token not in logs
        assert token[16:] not in logs  # not even the secret part alone
    # Nor any key another test issued: no key-shaped secret at all.
    assert not re.search(KEY_SHAPE, logs)
    assert PROMPT not in logs
    if len(completion.strip()) >= 12:
        assert completion not in logs


@pytest.mark.run_last
def test_the_database_holds_no_key_secret_in_plain_text(stack, world, django_db_blocker):
    """Every text, JSON and binary column of every table, after the whole run, searched."""
    from django.db import connection

    secrets = [world.acme_key, world.globex_key, world.revoked_key, world.expired_key,
               world.models_only_key, *world.limited_keys.values()]  # fmt: skip
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'public' "
            "AND data_type IN ('text', 'character varying', 'jsonb', 'json', 'bytea')"
        )
        columns = cursor.fetchall()
        assert len(columns) > 50  # the platform's tables are really there
        found = []
        for table, column, kind in columns:
            name = f'"{table}"."{column}"'
            name = f"encode({name}, 'escape')" if kind == "bytea" else f"{name}::text"
            # Ciphertext is url-safe base64: a key's shape turns up in it by chance (about once
            # a megabyte), so sealed columns are searched for the run's own secrets only.
            own = [f"%{t[16:]}%" for t in secrets]
            params: list[Any]
            if (table, column) in SEALED:
                query, params = f'SELECT count(*) FROM "{table}" WHERE {name} LIKE ANY(%s)', [own]
            else:
                query = f'SELECT count(*) FROM "{table}" WHERE {name} ~ %s OR {name} LIKE ANY(%s)'
                params = [KEY_SHAPE, own]
            cursor.execute(query, params)
            if cursor.fetchone()[0]:
                found.append(name)
    assert not found, f"key secrets stored in plain text in {found}"


def _retaining_tenant(slug: str, days: int) -> tuple[Any, str]:
    tenant = tenant_create(slug=slug)
    tenant_privacy_update(tenant=tenant, retention_days=days)
    return tenant, api_key_issue(tenant=tenant, name="tests").token


def test_a_retaining_tenant_keeps_its_text_encrypted_and_others_keep_none(
    stack, world, django_db_blocker, usage_of
):
    with django_db_blocker.unblock():
        keeper, token = _retaining_tenant("stark", 7)
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        kept = client.post(
            "/v1/chat/completions",
            json={"model": ALIAS, "messages": [{"role": "user", "content": PROMPT}],
                  "max_tokens": 8, "stream": True},
            headers={"Authorization": f"Bearer {token}"},
        )  # fmt: skip
        plain = client.post(
            "/v1/completions",
            json={"model": ALIAS, "prompt": PROMPT, "max_tokens": 8},
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
    assert kept.status_code == plain.status_code == 200
    streamed = [
        json.loads(line[6:]) for line in kept.text.splitlines() if line.startswith("data: {")
    ]
    answer = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in streamed if c["choices"]
    )
    kept_id, plain_id = kept.headers["x-request-id"], plain.headers["x-request-id"]
    usage_of(kept_id, plain_id)
    with django_db_blocker.unblock():
        deadline = time.monotonic() + 10
        while (text := content_get(tenant=keeper, request_id=kept_id)) is None:
            assert time.monotonic() < deadline, "the text was never retained"
            time.sleep(0.1)
        assert json.loads(text.prompt) == [{"role": "user", "content": PROMPT}]
        assert text.completion == answer
        raw = RetainedContent.objects.get(request_id=kept_id).ciphertext
        assert PROMPT.encode() not in bytes(raw)
        # A tenant without retention keeps nothing; another tenant cannot read the text.
        assert not RetainedContent.objects.filter(request_id=plain_id).exists()
        assert content_get(tenant=world.acme, request_id=kept_id) is None
