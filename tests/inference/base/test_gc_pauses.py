"""The garbage collector's callback records pauses and never touches a metric.

It runs wherever a collection starts, prometheus_client's own locked code included: a
callback that observed the histogram there deadlocked a frontend (its thread waited for the
lock it held, and the event loop waited behind it). The loop's watcher observes them.
"""

from __future__ import annotations

from typing import Any

import pytest

from inference.base import metrics


def test_the_callback_only_records_and_the_flush_observes(monkeypatch: pytest.MonkeyPatch):
    observed: list[tuple[str, float]] = []

    class Series:
        def __init__(self, generation: str) -> None:
            self.generation = generation

        def observe(self, seconds: float) -> None:
            observed.append((self.generation, seconds))

    def labels(**kwargs: Any) -> Series:
        if not flushing:
            raise AssertionError("the GC callback touched a metric")
        return Series(kwargs["generation"])

    monkeypatch.setattr(metrics.gc_pause_seconds, "labels", labels)
    flushing = True
    metrics.gc_pauses_flush()  # whatever earlier collections left
    observed.clear()
    flushing = False
    metrics._gc_observe("start", {"generation": 2, "collected": 0, "uncollectable": 0})
    metrics._gc_observe("stop", {"generation": 2, "collected": 5, "uncollectable": 0})
    assert observed == []
    flushing = True
    metrics.gc_pauses_flush()
    assert [generation for generation, _ in observed] == ["2"]
    assert observed[0][1] >= 0
    metrics.gc_pauses_flush()
    assert len(observed) == 1  # each pause is observed once
