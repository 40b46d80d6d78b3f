"""Calls made in one turn of the event loop share one round trip, each answered as its own."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from dataplane.coalesce import Coalescer
from dataplane.redis_client import pipeline_execute, redis_client_new, script_into
from tests import services_plugin

# On a cluster every call goes on its own (dataplane.coalesce): these are one server's.
pytestmark = pytest.mark.skipif(
    services_plugin.cluster is not None, reason="calls are gathered on a single server only"
)

ECHO = "return {KEYS[1], ARGV[1]}"
FAIL = "return redis.error_reply('no such thing')"
SET = "redis.call('SET', KEYS[1], ARGV[1]); return 1"


@pytest.fixture
async def client():
    made = redis_client_new()
    yield made
    await made.aclose()


async def test_a_turns_calls_go_in_one_round_trip_each_with_its_own_answer(client):
    turns = Coalescer(client)
    echo = client.register_script(ECHO)
    keys = [f"coalesce:{uuid.uuid4().hex}" for _ in range(20)]
    answers = await asyncio.gather(
        *(turns.script(echo, keys=[key], args=[n]) for n, key in enumerate(keys))
    )
    assert [[k.decode(), int(n)] for k, n in answers] == [[k, n] for n, k in enumerate(keys)]
    assert (turns.batches, turns.carried) == (1, 20)


async def test_a_call_alone_in_its_turn_is_sent_by_its_caller(client):
    turns = Coalescer(client)
    echo = client.register_script(ECHO)
    for n in range(3):
        found = await turns.script(echo, keys=["coalesce:alone"], args=[n])
        assert found == [b"coalesce:alone", str(n).encode()]
    assert turns.batches == 0


async def test_a_commands_error_goes_to_its_own_caller_only(client):
    turns = Coalescer(client)
    echo, fail = client.register_script(ECHO), client.register_script(FAIL)
    answers = await asyncio.gather(
        turns.script(echo, keys=["coalesce:a"], args=[1]),
        turns.script(fail, keys=["coalesce:b"], args=[]),
        turns.script(echo, keys=["coalesce:c"], args=[3]),
        return_exceptions=True,
    )
    assert answers[0] == [b"coalesce:a", b"1"] and answers[2] == [b"coalesce:c", b"3"]
    assert isinstance(answers[1], redis.ResponseError)
    assert "no such thing" in str(answers[1])
    assert turns.batches == 1


async def test_a_fill_that_raises_fails_its_caller_and_not_the_turn(client):
    turns = Coalescer(client)
    echo = client.register_script(ECHO)

    def broken(pipe):
        pipe.set("coalesce:half", "1")
        raise ValueError("cannot encode this")

    answers = await asyncio.gather(
        turns.script(echo, keys=["coalesce:d"], args=[4]),
        turns.run(broken),
        return_exceptions=True,
    )
    assert answers[0] == [b"coalesce:d", b"4"]
    assert isinstance(answers[1], ValueError)
    # What the broken fill queued before it raised was taken back, not sent.
    assert await client.get("coalesce:half") is None


async def test_a_caller_cancelled_before_its_turn_ends_sends_nothing(client):
    turns = Coalescer(client)
    setter = client.register_script(SET)
    kept, dropped = (f"coalesce:{uuid.uuid4().hex}" for _ in range(2))
    first = asyncio.ensure_future(turns.script(setter, keys=[kept], args=["1"]))
    second = asyncio.ensure_future(turns.script(setter, keys=[dropped], args=["1"]))
    await asyncio.sleep(0)  # both wait for their turn's round trip
    second.cancel()
    assert await first == 1
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await client.get(kept) == b"1"
    assert await client.get(dropped) is None


async def test_a_broken_round_trip_fails_every_call_of_the_turn():
    unreachable = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    turns = Coalescer(unreachable)
    echo = unreachable.register_script(ECHO)
    try:
        answers = await asyncio.gather(
            *(turns.script(echo, keys=[f"k{n}"], args=[n]) for n in range(3)),
            return_exceptions=True,
        )
    finally:
        await unreachable.aclose()
    assert all(isinstance(a, redis.ConnectionError) for a in answers)
    assert turns.batches == 1


async def test_turned_off_every_call_goes_on_its_own(client, settings):
    settings.ROUNDHOUSE_REDIS_COALESCE = False
    turns = Coalescer(client)
    echo = client.register_script(ECHO)
    answers = await asyncio.gather(
        *(turns.script(echo, keys=["coalesce:off"], args=[n]) for n in range(5))
    )
    assert [int(n) for _, n in answers] == list(range(5))
    assert turns.batches == 0


INCR = "return redis.call('INCR', KEYS[1])"


async def _calls(client, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_turns_scripts_go_by_their_hash(client):
    turns = Coalescer(client)
    echo = client.register_script(ECHO)
    await client.script_load(ECHO)
    by_hash, by_text = await _calls(client, "evalsha"), await _calls(client, "eval")
    await asyncio.gather(*(turns.script(echo, keys=["coalesce:h"], args=[n]) for n in range(8)))
    assert turns.batches == 1
    # The text goes once per script a server has not seen, not with every call.
    assert await _calls(client, "evalsha") - by_hash >= 8
    assert await _calls(client, "eval") == by_text


async def test_a_script_the_server_forgot_runs_once_by_its_text(client):
    turns = Coalescer(client)
    counter, fail = client.register_script(INCR), client.register_script(FAIL)
    keys = [f"coalesce:{uuid.uuid4().hex}" for _ in range(6)]
    await client.script_flush()  # as a restarted server, or a replica promoted, knows none
    answers = await asyncio.gather(
        *(turns.script(counter, keys=[key], args=[]) for key in keys),
        turns.script(fail, keys=["coalesce:f"], args=[]),
        return_exceptions=True,
    )
    assert turns.batches == 1
    assert answers[:6] == [1] * 6  # each ran, and ran once
    assert [int(await client.get(key)) for key in keys] == [1] * 6
    assert isinstance(answers[6], redis.ResponseError) and "no such thing" in str(answers[6])
    # Run by its text, the script is known by its hash again.
    assert await client.script_exists(counter.sha) == [True]


async def test_a_pipeline_of_forgotten_scripts_keeps_its_order_and_raises_as_a_pipeline_does(
    client,
):
    counter, fail = client.register_script(INCR), client.register_script(FAIL)
    key = f"coalesce:{uuid.uuid4().hex}"
    await client.script_flush()
    async with client.pipeline(transaction=False) as pipe:
        script_into(pipe, counter, keys=[key], args=[])
        pipe.get(key)
        script_into(pipe, counter, keys=[key], args=[])
        found = await pipeline_execute(pipe, raise_on_error=False)
    # The plain command ran in the first round trip, before the scripts that ran again.
    assert found == [1, None, 2]
    async with client.pipeline(transaction=False) as pipe:
        script_into(pipe, fail, keys=[key], args=[])
        with pytest.raises(redis.ResponseError, match="no such thing"):
            await pipeline_execute(pipe)


async def test_a_broken_second_trip_fails_only_the_scripts_it_carried(client, monkeypatch):
    counter = client.register_script(INCR)
    key, plain = (f"coalesce:{uuid.uuid4().hex}" for _ in range(2))
    await client.script_flush()
    async with client.pipeline(transaction=False) as pipe:
        script_into(pipe, counter, keys=[key], args=[])
        pipe.set(plain, "1")
        sent = pipe.execute

        async def once_then_broken(**kwargs):
            monkeypatch.setattr(pipe, "execute", _broken)
            return await sent(**kwargs)

        async def _broken(**kwargs):
            raise redis.ConnectionError("the connection dropped")

        monkeypatch.setattr(pipe, "execute", once_then_broken)
        found = await pipeline_execute(pipe, raise_on_error=False)
    assert isinstance(found[0], redis.ConnectionError) and found[1] is True
    assert await client.get(plain) == b"1" and await client.get(key) is None
