"""Reply streams followed over one connection per deployment, against a real Valkey server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
import redis.asyncio as aredis
from django.test import AsyncClient
from prometheus_client import REGISTRY
from redis.exceptions import ResponseError, SlotNotCoveredError

from dataplane import background, replies
from dataplane.background import loops_failing
from dataplane.keys import reply_key
from dataplane.redis_client import cluster_of, redis_client_new
from dataplane.replies import Follower, ReaderFailed
from dataplane.types import Delta, Event, Failed, encode
from inference.pipeline import relay
from tests.dataplane.roles import Roles, roles


@pytest.fixture
async def client():
    client = redis_client_new()
    yield client
    await client.aclose()


@pytest.fixture
def dispatch(client) -> Roles:
    return roles(client, reply_ttl=60)


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
        dispatch.front.follow_replies(deployment=deployment, request_id=rid, after="0-0")
        for rid in ids
    ]
    try:
        readers = [asyncio.create_task(_texts(f, 1)) for f in followers]
        key = reply_key(deployment, ids[0])
        # The deployment's reader is waiting once it holds a connection (on a loaded machine
        # that can take longer than any fixed sleep); then no follower opens another.
        for _ in range(200):
            with contextlib.suppress(SlotNotCoveredError):  # a cluster client not yet mapped
                if _in_use(client, key) >= 1:
                    break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        # Twenty clients waiting for their streams hold one connection between them.
        assert _in_use(client, key) == 1
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
    first = dispatch.front.follow_replies(deployment=deployment, request_id="a", after="0-0")
    try:
        await _write(client, deployment, "a", "a1")
        assert await _texts(first, 1) == ["a1"]  # the reader now blocks on "a" alone
        second = dispatch.front.follow_replies(deployment=deployment, request_id="b", after="0-0")
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
    whole = dispatch.front.follow_replies(deployment=deployment, request_id="same", after="0-0")
    resumed = dispatch.front.follow_replies(
        deployment=deployment, request_id="same", after=first_id
    )
    try:
        assert await _texts(whole, 2) == ["1", "2"]
        assert await _texts(resumed, 1) == ["2"]
        await _write(client, deployment, "same", "3")
        assert await _texts(whole, 1) == ["3"]
        assert await _texts(resumed, 1) == ["3"]
    finally:
        whole.close()
        resumed.close()


async def test_a_follower_that_joins_while_a_read_is_out_misses_no_entry(
    client, dispatch, monkeypatch
):
    """An Idempotency-Key retry attaches to a stream its first client already reads.

    The reader's XREAD is out, sent from the first client's position, when the retry joins
    from the start; what that read brings back must not be handed to the retry, which would
    then skip every entry before it.
    """
    monkeypatch.setattr(replies, "BLOCK_MS", 60_000)
    # No wake: the read sent before the retry joined is the one that returns its entry.
    monkeypatch.setattr(replies._DeploymentReader, "wake", lambda self: None)
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    await _write(client, deployment, "same", "1")
    await _write(client, deployment, "same", "2")
    first = dispatch.front.follow_replies(deployment=deployment, request_id="same", after="0-0")
    try:
        assert await _texts(first, 2) == ["1", "2"]
        await asyncio.sleep(0.1)  # the reader's XREAD now waits after "2"
        retry = dispatch.front.follow_replies(deployment=deployment, request_id="same", after="0-0")
        await _write(client, deployment, "same", "3")
        assert await _texts(first, 1) == ["3"]
        assert await _texts(retry, 3) == ["1", "2", "3"]
        retry.close()
    finally:
        first.close()


async def test_a_follower_that_reads_slowly_is_paused_and_loses_nothing(
    client, dispatch, monkeypatch
):
    monkeypatch.setattr(replies, "PAUSE_AT", 3)
    monkeypatch.setattr(replies, "READ_COUNT", 2)
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    follower = dispatch.front.follow_replies(deployment=deployment, request_id="slow", after="0-0")
    try:
        for n in range(12):
            await _write(client, deployment, "slow", str(n))
        texts = await _texts(follower, 12)
        assert texts == [str(n) for n in range(12)]
    finally:
        follower.close()


async def test_a_closed_follower_is_no_longer_read(client, dispatch):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    kept = dispatch.front.follow_replies(deployment=deployment, request_id="kept", after="0-0")
    gone = dispatch.front.follow_replies(deployment=deployment, request_id="gone", after="0-0")
    gone.close()
    try:
        await _write(client, deployment, "gone", "x")
        await _write(client, deployment, "kept", "y")
        assert await _texts(kept, 1) == ["y"]
        assert gone.entries == []
    finally:
        kept.close()


def _in_use(client: aredis.Redis, key: str) -> int:
    """Connections in use to the server holding `key` (with a cluster, its slot's node)."""
    cluster = cluster_of(client)
    if cluster is None:
        return len(client.connection_pool._in_use_connections)
    node = cluster.get_node_from_key(key)
    assert node is not None
    return len(node._connections) - len(node._free)


class _FailingReads:
    """XREAD that raises while `failing` is set (each raise counted), as a bug in it would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failing = True
        self.raised = 0
        real = aredis.Redis.xread  # the same command on the cluster client

        async def xread(client: aredis.Redis, *args: object, **kwargs: object) -> object:
            if self.failing:
                self.raised += 1
                raise ResponseError("injected failure")
            return await real(client, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(aredis.Redis, "xread", xread)
        monkeypatch.setattr(aredis.RedisCluster, "xread", xread)


def _failures() -> float:
    return REGISTRY.get_sample_value("roundhouse_loop_failures_total", {"loop": "replies"}) or 0.0


async def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "after",
    [
        "99999999999999999999-99999999999999999999",  # 20 digits, past 64 bits
        "18446744073709551616-0",
        "1-",
        "-1",
        "1",
        "1-2-3",
        "１-2",  # a digit, but not an ASCII one
    ],
)
async def test_it_refuses_to_follow_from_an_entry_id_redis_would_refuse(client, dispatch, after):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    other = dispatch.front.follow_replies(deployment=deployment, request_id="other", after="0-0")
    try:
        with pytest.raises(ValueError):
            dispatch.front.follow_replies(deployment=deployment, request_id="bad", after=after)
        await _write(client, deployment, "other", "still read")
        assert await _texts(other, 1) == ["still read"]
    finally:
        other.close()


async def test_the_largest_entry_id_redis_takes_is_followed_without_harm_to_others(
    client, dispatch
):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    largest = f"{2**64 - 1}-{2**64 - 1}"
    edge = dispatch.front.follow_replies(deployment=deployment, request_id="edge", after=largest)
    other = dispatch.front.follow_replies(deployment=deployment, request_id="other", after="0-0")
    try:
        await _write(client, deployment, "other", "read")
        assert await _texts(other, 1) == ["read"]
        assert await edge.read(block_ms=100) == []
    finally:
        edge.close()
        other.close()


async def test_a_failed_reader_ends_its_followers_with_an_error_and_serves_new_ones(
    client, dispatch, monkeypatch
):
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    before = _failures()
    reads = _FailingReads(monkeypatch)
    followers = [
        dispatch.front.follow_replies(deployment=deployment, request_id=rid, after="0-0")
        for rid in ("a", "b")
    ]
    for follower in followers:
        with pytest.raises(ReaderFailed):
            await follower.read(block_ms=5000)
        with pytest.raises(ReaderFailed):  # every read after, not once: the end is terminal
            await follower.read(block_ms=10)
        follower.close()
    assert _failures() >= before + 1
    assert f"replies:{deployment}" in loops_failing("replies")

    reads.failing = False
    later = dispatch.front.follow_replies(deployment=deployment, request_id="c", after="0-0")
    try:
        await _write(client, deployment, "c", "served")
        assert await _texts(later, 1) == ["served"]
        assert f"replies:{deployment}" not in loops_failing("replies")
    finally:
        later.close()


async def test_a_relay_whose_reader_failed_ends_with_one_terminal_error(dispatch, monkeypatch):
    _FailingReads(monkeypatch)
    events = [
        event
        async for event in relay.attach(
            dispatch.front,
            deployment=f"r-{uuid.uuid4().hex[:8]}",
            request_id="x",
            deadline=time.time() + 30,
        )
    ]
    assert len(events) == 1
    assert isinstance(events[0], Failed) and events[0].code == relay.RELAY_FAILED


@pytest.mark.django_db
async def test_the_frontend_is_unready_while_a_reply_reader_fails(client, dispatch, monkeypatch):
    # Readers failed by earlier tests in this process recover or end in their own time.
    monkeypatch.setattr(background, "_failing", {})
    api = AsyncClient()
    assert (await api.get("/readyz")).status_code == 200
    reads = _FailingReads(monkeypatch)
    deployment = f"r-{uuid.uuid4().hex[:8]}"
    follower = dispatch.front.follow_replies(deployment=deployment, request_id="a", after="0-0")
    with pytest.raises(ReaderFailed):
        await follower.read(block_ms=5000)
    response = await api.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "not_ready"
    reads.failing = False
    await _until(lambda: not loops_failing("replies"))
    assert (await api.get("/readyz")).status_code == 200


async def test_a_cancel_that_lands_as_an_entry_arrives_is_not_lost():
    """The relay's read is cancelled when its client cancels or goes away. On Python 3.11
    asyncio.wait_for swallowed a cancel that landed in the same turn of the loop as the entry
    it waited for: the read returned, the relay went on, and the request ran to its end."""

    class Idle:
        def add(self, follower: Follower) -> None:
            return None

    follower = Follower(Idle(), "key", "0-0")  # type: ignore[arg-type]
    read = asyncio.create_task(follower.read(block_ms=5000))
    await asyncio.sleep(0)  # waiting for an entry
    follower.entries.append(("1-0", Delta(text="x", tokens=1)))
    follower.ready.set()
    read.cancel()  # in the same turn as the entry
    with pytest.raises(asyncio.CancelledError):
        await read
