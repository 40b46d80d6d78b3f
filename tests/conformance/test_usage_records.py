"""A reasoning model's usage record counts the thinking its answer reported, and a replay by
Idempotency-Key reports it as the original did."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.conformance.cases import CHAT, HELLO, PATHS, RUNNING, THINK, G
from tests.conformance.conftest import THINKING

pytestmark = pytest.mark.django_db(transaction=False)


def test_a_reasoning_answers_record_counts_its_thinking(thinking_targets: Any, usage_of: Any):
    body = {**G, "model": THINKING, "messages": HELLO}
    answer = thinking_targets.platform.post(PATHS[CHAT], json=body)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    thought = usage["completion_tokens_details"]["reasoning_tokens"]
    assert 0 < thought <= usage["completion_tokens"]
    [record] = usage_of(answer.headers["x-request-id"])
    assert (record.completion_tokens, record.reasoning_tokens) == (
        usage["completion_tokens"],
        thought,
    )
    written = usage["prompt_tokens_details"]["created_cache_tokens"]
    assert record.cache_created_tokens == written


def _running_usages(text: str) -> list[dict[str, Any]]:
    """The usage each chunk of an SSE answer carries, in order (the last chunk's is the total)."""
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return [chunk["usage"] for chunk in chunks if chunk.get("usage")]


def test_a_replayed_stream_counts_its_thinking_so_far_as_the_original_did(thinking_targets: Any):
    body = {
        **G,
        **THINK,
        "model": THINKING,
        "messages": HELLO,
        "stream": True,
        "stream_options": RUNNING,
    }
    headers = {"Idempotency-Key": f"think-{uuid.uuid4()}"}
    first = thinking_targets.platform.post(PATHS[CHAT], json=body, headers=headers)
    assert first.status_code == 200, first.text
    again = thinking_targets.platform.post(PATHS[CHAT], json=body, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    ours, replayed = _running_usages(first.text), _running_usages(again.text)
    assert ours[-1]["completion_tokens_details"]["reasoning_tokens"] > 0
    # A replay may read at once entries the original got one by one: every chunk still counts
    # the thinking so far, and the counts end where the original's did.
    assert all("completion_tokens_details" in usage for usage in replayed)
    assert replayed[-2:] == ours[-2:]
