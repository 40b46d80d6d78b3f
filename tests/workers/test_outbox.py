from __future__ import annotations

import time
import uuid

from dataplane.types import Delta, Finished, Job, Sampling, Started
from workers.outbox import FLUSH_SHARES, Outbox, share_of


def _job() -> Job:
    now = time.time()
    return Job(
        request_id=uuid.uuid4().hex,
        tenant_id=1,
        api_key_id=1,
        deployment="d",
        model_version="v",
        endpoint="completions",
        prompt_token_ids=[1, 2, 3],
        sampling=Sampling(max_tokens=8),
        enqueued_at=now,
        deadline=now + 60,
    )


def _events(items):
    return [(job.request_id, event) for job, event, *_ in items]


def test_a_first_token_goes_out_with_its_request_ahead_of_other_requests_deltas():
    outbox = Outbox()
    busy, newcomer = _job(), _job()
    outbox.put(busy, Delta(text="a", tokens=1))
    outbox.put(newcomer, Started(at=1.0))
    outbox.put(busy, Delta(text="b", tokens=1))
    outbox.put(newcomer, Delta(text="x", tokens=1), urgent=True)
    assert outbox.urgent.is_set()
    taken = outbox.take(urgent_only=True)
    assert _events(taken) == [
        (newcomer.request_id, Started(at=1.0)),
        (newcomer.request_id, Delta(text="x", tokens=1)),
    ]
    assert not outbox.urgent.is_set() and outbox.ready.is_set()
    outbox.put(busy, Delta(text="c", tokens=1))  # still merges with what stayed behind
    assert _events(outbox.take()) == [(busy.request_id, Delta(text="abc", tokens=3))]
    assert not outbox.ready.is_set()


def test_events_that_failed_to_write_go_out_first_and_at_once():
    outbox = Outbox()
    first, second = _job(), _job()
    outbox.put(first, Delta(text="a", tokens=1))
    failed = outbox.take()
    outbox.put(second, Delta(text="b", tokens=1))
    outbox.restore(failed)
    assert outbox.urgent.is_set()
    assert _events(outbox.take(urgent_only=True)) == [
        (first.request_id, Delta(text="a", tokens=1)),
        (second.request_id, Delta(text="b", tokens=1)),
    ]


def test_streams_are_written_a_share_at_a_time_and_urgent_ones_with_any_share():
    outbox = Outbox()
    jobs = [_job() for _ in range(16)]
    for job in jobs:
        outbox.put(job, Delta(text="a", tokens=1))
    urgent = jobs[0]
    outbox.put(urgent, Delta(text="b", tokens=1), urgent=True)
    taken: list[str] = []
    for share in range(FLUSH_SHARES):
        batch = [rid for rid, _ in _events(outbox.take(share=(share, FLUSH_SHARES)))]
        assert all(
            share_of(rid, FLUSH_SHARES) == share for rid in batch if rid != urgent.request_id
        )
        taken += batch
    assert sorted(taken) == sorted(job.request_id for job in jobs)  # each once
    assert taken.count(urgent.request_id) == 1 and taken[0] == urgent.request_id
    assert not outbox.ready.is_set()


def test_each_choice_keeps_one_pending_delta_and_none_passes_the_end():
    outbox = Outbox()
    job = _job()
    outbox.put(job, Started(at=1.0))
    for text, index in (("a", 0), ("x", 1), ("b", 0), ("y", 1)):
        outbox.put(job, Delta(text=text, tokens=1, index=index))
    outbox.put(job, Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=5))
    outbox.put(job, Delta(text="late", tokens=1, index=0))  # after the end: joins nothing
    assert [event for _, event in _events(outbox.take())] == [
        Started(at=1.0),
        Delta(text="ab", tokens=2, index=0),
        Delta(text="xy", tokens=2, index=1),
        Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=5),
        Delta(text="late", tokens=1, index=0),
    ]


def test_a_choice_merges_with_what_a_failed_write_put_back():
    outbox = Outbox()
    job = _job()
    outbox.put(job, Delta(text="a", tokens=1, index=1))
    outbox.restore(outbox.take())
    outbox.put(job, Delta(text="b", tokens=1, index=1))
    assert _events(outbox.take()) == [(job.request_id, Delta(text="ab", tokens=2, index=1))]
