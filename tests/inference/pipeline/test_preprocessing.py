"""A request's heavy preparation runs off the event loop, a few of each tenant's at a time."""

from __future__ import annotations

import asyncio
import sys
import threading

from inference.pipeline import preprocessing
from inference.pipeline.preprocessing import preprocessed


async def test_a_step_runs_on_a_preprocessing_thread_and_answers_its_result():
    loop_thread = threading.get_ident()
    ran_on, result = await preprocessed(1, lambda x: (threading.get_ident(), x * 2), 21)
    assert result == 42 and ran_on != loop_thread
    # Beside busy threads the loop gets the interpreter back within a millisecond, not five.
    assert sys.getswitchinterval() <= preprocessing.SWITCH_INTERVAL_SECONDS


async def test_a_tenants_steps_wait_for_its_own_turns_and_not_for_another_tenants(settings):
    settings.ROUNDHOUSE_PREPROCESS_PER_TENANT = 1
    release = threading.Event()
    first = asyncio.create_task(preprocessed(7, release.wait, 10))
    second = asyncio.create_task(preprocessed(7, lambda: "second"))
    other = await asyncio.wait_for(preprocessed(8, lambda: "other"), timeout=10)
    assert other == "other"  # tenant 8 is not held behind tenant 7
    await asyncio.sleep(0.05)
    assert not second.done()  # tenant 7's second step waits for its first
    release.set()
    assert await asyncio.wait_for(second, timeout=10) == "second"
    assert await first
    assert preprocessing.tenants_waiting() == set()


async def test_a_step_whose_caller_gave_up_keeps_its_tenants_turn_until_it_ends(settings):
    """Hanging up does not let a tenant run more steps at once than its share."""
    settings.ROUNDHOUSE_PREPROCESS_PER_TENANT = 1
    started, release = threading.Event(), threading.Event()

    def held() -> None:
        started.set()
        release.wait(10)

    abandoned = asyncio.create_task(preprocessed(9, held))
    while not started.is_set():
        await asyncio.sleep(0.01)
    abandoned.cancel()
    await asyncio.gather(abandoned, return_exceptions=True)
    waiting = asyncio.create_task(preprocessed(9, lambda: "next"))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the abandoned step still runs, in the tenant's one turn
    release.set()
    assert await asyncio.wait_for(waiting, timeout=10) == "next"


async def test_a_large_body_is_parsed_and_read_off_the_event_loop(rf):
    """JSON of many small values costs the parser about a millisecond every 16 KiB: a large
    body is parsed, and its fields read, on a preprocessing thread; a small one inline."""
    from inference.edge.endpoint import INLINE_BODY_BYTES, request_read

    loop_thread = threading.get_ident()

    def read(body: dict[str, object]) -> int:
        return threading.get_ident()

    messages = [{"role": "user", "content": "a"}] * 2000
    large = rf.post("/v1/chat/completions", {"messages": messages}, content_type="application/json")
    assert len(large.body) > INLINE_BODY_BYTES
    body, read_on = await request_read(large, read)
    assert body["messages"] == messages and read_on != loop_thread
    small = rf.post("/v1/chat/completions", {"model": "m"}, content_type="application/json")
    body, read_on = await request_read(small, read)
    assert body == {"model": "m"} and read_on == loop_thread
