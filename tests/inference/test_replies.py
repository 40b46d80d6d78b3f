"""Reply streams followed over one connection per deployment, against a real Valkey server."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aredis
from django.conf import settings

from inference import replies
from inference.dispatch import Dispatch, reply_key
from inference.replies import Follower
from inference.types import Delta, Event, encode


@pytest.fixture
async def client():
    client = aredis.Redis.from_url(settings.REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
def dispatch(client) -> Dispatch:
    return Dispatch(client, reply_ttl=60)


async def _write(client: aredis.Redis, deployment: str, request_id: str, text: str) -> str:
    entry_id = await client.xadd(
        reply_key(deployment, request_id), {"e": encode(Delta(text=text, tokens=1))}
    )
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


async def _texts(follower: Follower, count: int) -> list[str]:
    """Read until `count` entries came (each read blocks at most 5 s), return their texts."""
    texts: list[str] = []
    for _ in range(50):
        if len(texts) >= count:
            break
        texts += [_text(event) for _, event in await follower.read(block_ms=5000)]
    return texts


def _text(event: Event) -> str:
    assert isinstance(event, Delta)
    return event.text


async def test_every_followed_stream_of_a_deployment_is_read_over_one_connection(client, dispatch):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    ids = [uuid.uuid4().hex for _ in range(20)]
    followers = [
        dispatch.follow_replies(deployment=deployment, request_id=rid, after="0-0") for rid in ids
    ]
    try:
        readers = [asyncio.create_task(_texts(f, 1)) for f in followers]
        await asyncio.sleep(0.2)  # every reader is waiting now
        # Twenty clients waiting for their streams hold one connection between them.
        assert len(client.connection_pool._in_use_connections) == 1
        for rid in ids:
            await _write(client, deployment, rid, f"{rid}:1")
        assert await asyncio.gather(*readers) == [[f"{rid}:1"] for rid in ids]
    finally:
        for follower in followers:
            follower.close()


async def test_a_stream_followed_while_the_reader_waits_is_read_at_once(
    client, dispatch, monkeypatch
):
    # The reader's XREAD would otherwise wait a minute: only its wake stream brings it back.
    monkeypatch.setattr(replies, "BLOCK_MS", 60_000)
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    first = dispatch.follow_replies(deployment=deployment, request_id="a", after="0-0")
    try:
        await _write(client, deployment, "a", "a1")
        assert await _texts(first, 1) == ["a1"]  # the reader now blocks on "a" alone
        second = dispatch.follow_replies(deployment=deployment, request_id="b", after="0-0")
        await _write(client, deployment, "b", "b1")
        assert await _texts(second, 1) == ["b1"]
        second.close()
    finally:
        first.close()


async def test_two_followers_of_one_stream_each_get_every_entry_after_their_own_position(
    client, dispatch
):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    first_id = await _write(client, deployment, "same", "1")
    await _write(client, deployment, "same", "2")
    whole = dispatch.follow_replies(deployment=deployment, request_id="same", after="0-0")
    resumed = dispatch.follow_replies(deployment=deployment, request_id="same", after=first_id)
    try:
        assert await _texts(whole, 2) == ["1", "2"]
        assert await _texts(resumed, 1) == ["2"]
        await _write(client, deployment, "same", "3")
        assert await _texts(whole, 1) == ["3"]
        assert await _texts(resumed, 1) == ["3"]
    finally:
        whole.close()
        resumed.close()


async def test_a_follower_that_reads_slowly_is_paused_and_loses_nothing(
    client, dispatch, monkeypatch
):
    monkeypatch.setattr(replies, "PAUSE_AT", 3)
    monkeypatch.setattr(replies, "READ_COUNT", 2)
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    follower = dispatch.follow_replies(deployment=deployment, request_id="slow", after="0-0")
    try:
        for n in range(12):
            await _write(client, deployment, "slow", str(n))
        texts = await _texts(follower, 12)
        assert texts == [str(n) for n in range(12)]
    finally:
        follower.close()


async def test_a_closed_follower_is_no_longer_read(client, dispatch):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    kept = dispatch.follow_replies(deployment=deployment, request_id="kept", after="0-0")
    gone = dispatch.follow_replies(deployment=deployment, request_id="gone", after="0-0")
    gone.close()
    try:
        await _write(client, deployment, "gone", "x")
        await _write(client, deployment, "kept", "y")
        assert await _texts(kept, 1) == ["y"]
        assert gone.entries == []
    finally:
        kept.close()
