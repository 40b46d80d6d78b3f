"""A reasoning model's usage record counts the thinking its answer reported."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.cases import CHAT, HELLO, PATHS, G
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
