"""Degrading before refusing, over HTTP: an alias nobody serves answers through its fallback.

`fb-e2e` names a version whose deployment has no worker; its fallback is the session's chat
alias, which the session's worker serves.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.conftest import ALIAS, own_deployment, roomy_key

NAMED = "fb-e2e"


@pytest.fixture(scope="module")
def key(stack: Any, world: Any, demo_model_dir: Any, django_db_blocker: Any) -> str:
    from models_registry.models import Alias
    from models_registry.services import alias_fallback_set, alias_set

    with django_db_blocker.unblock():
        version = own_deployment(f"{NAMED}-d", NAMED, Decimal("0.91"), demo_model_dir)
        named = alias_set(name=NAMED, version=version)
        alias_fallback_set(alias=named, fallback=Alias.objects.get(name=ALIAS))
        return roomy_key("fb-e2e")


@pytest.fixture
def client(stack: Any):
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _body(**fields: Any) -> dict[str, Any]:
    return {
        "model": NAMED,
        "messages": [{"role": "user", "content": "Say something"}],
        "max_tokens": 8,
        "temperature": 0,
        **fields,
    }


def test_a_chat_for_an_alias_nobody_serves_is_answered_by_its_fallback(
    client, key, world, usage_of
):
    response = client.post(
        "/v1/chat/completions", json=_body(), headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-roundhouse-fallback-from"] == NAMED
    assert response.headers["x-roundhouse-fallback-reason"] == "model_unavailable"
    # The answer names the version that gave it, not the alias the client asked for.
    assert response.json()["model"] == world.version.public_name
    assert response.headers["x-roundhouse-model-version"] == world.version.version
    assert response.json()["choices"][0]["message"]["content"]
    (record,) = usage_of(response.headers["x-request-id"])
    assert (record.status, record.deployment) == ("ok", world.deployment.name)
    assert record.model_version_id == world.version.pk
    assert record.fallback_from == NAMED


def test_a_stream_falls_back_the_same_way(client, key, world, usage_of):
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json=_body(stream=True),
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-roundhouse-fallback-from"] == NAMED
        chunks = [
            json.loads(line[6:])
            for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    assert chunks and {c["model"] for c in chunks} == {world.version.public_name}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    (record,) = usage_of(response.headers["x-request-id"])
    assert (record.deployment, record.fallback_from) == (world.deployment.name, NAMED)


def test_flex_work_waits_for_its_own_model_and_is_refused_as_before(client, key):
    response = client.post(
        "/v1/chat/completions",
        json=_body(service_tier="flex"),
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unavailable"
    assert "x-roundhouse-fallback-from" not in response.headers
