"""The wire types across a rolling upgrade: a frontend and a worker of neighbouring releases
read each other's events."""

from __future__ import annotations

import msgspec

from dataplane.types import Finished, encode, event_decoder


class _FinishedBeforeStopReasons(msgspec.Struct, frozen=True, tag="finished", omit_defaults=True):
    """The terminal event as the release before `stop_reasons` wrote and read it."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reasons: list[str] = []
    reasoning_tokens: int | None = None
    stop_sequence: str | None = None
    cache_created_tokens: int = 0


def test_a_stop_string_reaches_a_frontend_of_the_release_before():
    new = Finished(
        finish_reason="stop",
        prompt_tokens=3,
        completion_tokens=2,
        finish_reasons=["stop", "stop"],
        stop_reasons=["Done", 7],
        stop_string="Done",
    )
    old = msgspec.msgpack.decode(encode(new), type=_FinishedBeforeStopReasons)
    assert old.stop_sequence == "Done"


def test_a_stop_string_from_a_worker_of_the_release_before_is_read():
    old = _FinishedBeforeStopReasons(
        finish_reason="stop", prompt_tokens=3, completion_tokens=2, stop_sequence="Done"
    )
    new = event_decoder.decode(msgspec.msgpack.encode(old))
    assert isinstance(new, Finished)
    assert (new.stop_reason(0), new.stop_sequence, new.stop_reason(1)) == ("Done", "Done", None)


def test_a_stop_token_is_not_read_as_a_stop_string():
    new = event_decoder.decode(
        encode(
            Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1, stop_reasons=[7])
        )
    )
    assert isinstance(new, Finished)
    assert (new.stop_reason(0), new.stop_sequence) == (7, None)
