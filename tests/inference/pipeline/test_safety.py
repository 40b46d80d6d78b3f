"""A tool call's arguments are screened by the tenant's output policy like the content."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dataplane.types import Delta, Event, Finished, ToolCallDelta
from inference.pipeline import safety as content_policy
from inference.pipeline.safety import output_filtered
from safety.detectors import DenyList, Pii
from safety.policy import Policy


def _filtered(
    policy: Policy, events: AsyncIterator[Event], monkeypatch
) -> tuple[list[Event], list[bool]]:
    """The events as the policy lets them out, and whether it stopped the request."""
    monkeypatch.setattr(content_policy, "_record", lambda *args: None)
    stopped: list[bool] = []

    async def stop() -> None:
        stopped.append(True)

    async def collect() -> list[Event]:
        filtered = output_filtered(
            events, policy=policy, tenant_id=1, request_id="r", prompt_tokens=3, stop=stop
        )
        return [event async for event in filtered]

    return asyncio.run(collect()), stopped


def _run(policy: Policy, pieces: list[str], monkeypatch) -> tuple[list[Event], list[bool]]:
    """A tool call's arguments, a piece per delta."""

    async def events() -> AsyncIterator[Event]:
        for i, piece in enumerate(pieces):
            call = ToolCallDelta(index=0, id="c" if i == 0 else None, name="f" if i == 0 else None,
                                 arguments=piece)  # fmt: skip
            yield Delta(text="", tokens=1, tool_calls=[call])
        yield Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=len(pieces))

    return _filtered(policy, events(), monkeypatch)


def _arguments(events: list[Event]) -> str:
    return "".join(
        call.arguments for e in events if isinstance(e, Delta) for call in e.tool_calls or []
    )


def test_a_denied_term_split_across_argument_pieces_never_goes_out(monkeypatch):
    policy = Policy(detectors=(DenyList(terms=["project falcon"]),))
    events, _ = _run(policy, ['{"q": "about proj', "ect fal", 'con now"}'], monkeypatch)
    # Held back until it can be read whole: the term never goes out, and the call ends there.
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "content_filter"
    assert "falcon" not in _arguments(events)


def test_pii_in_arguments_is_redacted_and_every_argument_comes_out(monkeypatch):
    policy = Policy(detectors=(Pii(["email"]),), pii_action="redact")
    events, stopped = _run(policy, ['{"to": "bob.smi', 'th@example.com", "n": 1}'], monkeypatch)
    assert not stopped
    arguments = _arguments(events)
    assert "bob.smith@example.com" not in arguments and arguments.endswith('"n": 1}')
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "stop"


def test_clean_arguments_come_through_whole(monkeypatch):
    policy = Policy(detectors=(DenyList(terms=["falcon"]),))
    pieces = ['{"city": ', '"Paris", ', '"unit": "celsius"}']
    events, stopped = _run(policy, pieces, monkeypatch)
    assert not stopped and _arguments(events) == "".join(pieces)


def test_a_denied_term_in_a_long_call_stops_the_request_at_once(monkeypatch):
    policy = Policy(detectors=(DenyList(terms=["falcon"]),))
    tail = [" and more words follow here."] * 6
    pieces = ['{"notes": "', *(["plain words go here. "] * 60), "now falcon", *tail, '"}']
    events, stopped = _run(policy, pieces, monkeypatch)
    assert stopped == [True]  # aborted in the engine, not at its end
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "content_filter"
    assert "falcon" not in _arguments(events) and "and more" not in _arguments(events)


def _thought(policy: Policy, pieces: list[str], monkeypatch) -> tuple[list[Event], list[bool]]:
    """A reasoning model's thinking, a piece per delta, then its answer."""

    async def events() -> AsyncIterator[Event]:
        for piece in pieces:
            yield Delta(text="", tokens=1, reasoning=piece)
        yield Delta(text="Done.", tokens=1)
        yield Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=len(pieces) + 1)

    return _filtered(policy, events(), monkeypatch)


def _thinking(events: list[Event]) -> str:
    return "".join(e.reasoning for e in events if isinstance(e, Delta))


def test_a_reasoning_models_thinking_is_screened_like_its_answer(monkeypatch):
    # The client reads the thinking too: a denied term there stops the request.
    policy = Policy(detectors=(DenyList(terms=["project falcon"]),))
    events, _ = _thought(policy, ["I recall proj", "ect fal", "con details"], monkeypatch)
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "content_filter"
    assert "falcon" not in _thinking(events)
    # PII in it is redacted, and the whole thinking and answer come out.
    policy = Policy(detectors=(Pii(["email"]),), pii_action="redact")
    events, stopped = _thought(policy, ["mail bob.smi", "th@example.com then"], monkeypatch)
    assert not stopped
    assert "bob.smith@example.com" not in _thinking(events)
    assert _thinking(events).endswith("then")
    assert "".join(e.text for e in events if isinstance(e, Delta)) == "Done."


def test_thinking_held_for_checking_goes_out_before_the_answer(monkeypatch):
    # The screen holds the thinking's last words back to read them whole; when the answer
    # begins, the thinking is over, and they go out ahead of it.
    policy = Policy(detectors=(Pii(["email"]),), pii_action="redact")
    events, stopped = _thought(policy, ["I will write to bob.smi", "th@example.com"], monkeypatch)
    assert not stopped
    deltas = [e for e in events if isinstance(e, Delta)]
    first_answer = next(i for i, d in enumerate(deltas) if d.text)
    before = "".join(d.reasoning for d in deltas[: first_answer + 1])
    assert before == _thinking(events) and before.startswith("I will write to ")
    assert "bob.smith@example.com" not in before
    assert all(not d.reasoning for d in deltas[first_answer + 1 :])
