"""The benchmarks' shared helpers."""

from __future__ import annotations

import pytest

from bench.common import ROOT, progress


def test_a_progress_line_names_paths_in_the_checkout_from_its_root(
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress(f"wrote {ROOT / 'docs' / 'benchmarks.md'} and /elsewhere/x.png")
    assert capsys.readouterr().out == "[bench] wrote docs/benchmarks.md and /elsewhere/x.png\n"


def test_text_times_are_the_first_chunk_then_the_gaps_between_the_rest(monkeypatch):
    from bench import common

    clock = iter([10.004, 10.006, 10.0065])
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    times = common.TextTimes(started=10.0)
    for _ in range(3):
        times.text()
    assert times.ttft_ms == pytest.approx(4.0)
    assert times.gaps_ms == pytest.approx([2.0, 0.5])
