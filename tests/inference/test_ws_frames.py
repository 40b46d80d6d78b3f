"""The WebSocket's frames of a request's events: what each carries beyond text."""

from __future__ import annotations

from dataplane.types import Delta, Finished
from inference.openai_format import finished_usage
from inference.ws import _delta_message


def test_a_reasoning_models_thinking_rides_in_its_own_key():
    frame = _delta_message("c1", Delta(text="", tokens=2, reasoning="They greet me."))
    assert frame == {
        "type": "delta",
        "id": "c1",
        "text": "",
        "tokens": 2,
        "reasoning": "They greet me.",
    }
    assert "reasoning" not in _delta_message("c1", Delta(text="Hi", tokens=1))


def test_the_finished_frames_usage_counts_the_thinking_where_a_model_thinks():
    thinking = Finished(
        finish_reason="stop", prompt_tokens=4, completion_tokens=9, reasoning_tokens=6
    )
    assert finished_usage(thinking)["completion_tokens_details"] == {"reasoning_tokens": 6}
    plain = Finished(finish_reason="stop", prompt_tokens=4, completion_tokens=9)
    assert "completion_tokens_details" not in finished_usage(plain)
