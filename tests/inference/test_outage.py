"""With its Redis unreachable, the API answers at once with a 503 the client may retry."""

from __future__ import annotations

import socket
import time

import pytest
from django.test import AsyncClient

from inference import services
from tests.conftest import ALIAS

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


async def test_an_unreachable_queue_store_is_a_fast_503_not_a_500(world, settings, monkeypatch):
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    # This process's data-plane clients are made anew against the dead address.
    monkeypatch.setattr(services, "_dispatch", None)
    client = AsyncClient()
    started = time.monotonic()
    response = await client.post(
        "/v1/chat/completions",
        {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        content_type="application/json",
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 503, response.content
    body = response.json()["error"]
    assert (body["code"], body["type"]) == ("service_unavailable", "service_unavailable_error")
    assert int(response["Retry-After"]) >= 1
    print(f"answered in {elapsed * 1000:.0f} ms")  # measured, not asserted
