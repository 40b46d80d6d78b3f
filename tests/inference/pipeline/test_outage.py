"""With its Redis unreachable, the API answers at once with a 503 the client may retry; with
its PostgreSQL unreachable, what it serves from its caches it still serves."""

from __future__ import annotations

import socket
import time

import pytest
import redis
from django.db import OperationalError
from django.test import AsyncClient

from config import db
from dataplane.frontdoor import FrontDoor
from inference.pipeline import clients
from tests.conftest import ALIAS

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


async def test_an_unreachable_queue_store_is_a_fast_503_not_a_500(world, settings, monkeypatch):
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    # This process's data-plane clients are made anew against the dead address, and all of
    # them are put back afterwards (a client left behind would point at the dead address).
    for name in ("_dispatch", "_quotas", "_idempotency", "_responses"):
        monkeypatch.setattr(clients, name, None)
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


async def test_the_model_list_is_served_from_the_cache_while_postgres_is_down(world, monkeypatch):
    client = AsyncClient()
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    before = await client.get("/v1/models", headers=auth)  # the key and the list are cached
    assert before.status_code == 200, before.content

    def refused(*args: object, **kwargs: object) -> None:
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(db, "_fresh", refused)
    during = await client.get("/v1/models", headers=auth)
    assert during.status_code == 200, during.content
    assert during.json() == before.json()
    assert ALIAS in [model["id"] for model in during.json()["data"]]


async def test_what_no_cache_holds_is_a_fast_503_while_postgres_is_down(world, monkeypatch):
    """A key never seen before needs the database: with it down that is a 503, not a 500."""

    def refused(*args: object, **kwargs: object) -> None:
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(db, "_fresh", refused)
    response = await AsyncClient().get(
        "/v1/models", headers={"Authorization": f"Bearer {world.globex_key}"}
    )
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "service_unavailable"
    assert int(response["Retry-After"]) >= 1


@pytest.mark.parametrize(
    "fault",
    [
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.SlotNotCoveredError("no node serves the slot"),
    ],
    ids=["clusterdown", "tryagain", "slot-not-covered"],
)
async def test_a_cluster_slot_without_a_primary_for_a_moment_is_a_503_not_a_500(
    world, monkeypatch, fault
):
    """A primary failing over: a pipeline reports CLUSTERDOWN as it is (a clean-clone run of
    the failover test answered it with a 500)."""

    async def down(*args: object, **kwargs: object) -> None:
        raise fault

    monkeypatch.setattr(FrontDoor, "enqueue", down)
    response = await AsyncClient().post(
        "/v1/chat/completions",
        {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        content_type="application/json",
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "service_unavailable"
    assert int(response["Retry-After"]) >= 1
