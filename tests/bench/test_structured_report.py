"""The structured-output benchmark writes its results after every level: a cut run keeps them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.structured import SCENARIOS, FrontendTimes, Level, _report


def _level(scenario: str, streams: int, tokens_per_s: float) -> Level:
    return Level(
        scenario=scenario,
        concurrency=streams,
        tokens_per_s=tokens_per_s,
        ttft_p50_ms=10.0,
        ttft_p99_ms=20.0,
        errors=0,
        short=0,
        shaped=16,
        requests=16,
        load_1m=1.0,
    )


def _times() -> dict[str, FrontendTimes]:
    return {
        name: FrontendTimes(name, 100, 30, [ms] * 10, [ms / 2] * 10, [ms / 2] * 10)
        for name, ms in (("plain", 0.3), ("20 tools", 4.0))
    }


def test_a_run_stopped_after_its_first_level_keeps_that_level(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    args = argparse.Namespace(
        levels=[1, 8],
        rounds=3,
        requests_per_level=4,
        iterations=10,
        docs=docs,
        gpu="",
        vllm="0.32.0",
        section="structured",
    )
    measured = {
        target: {s: {1: [_level(s, 1, rate) for rate in rates]} for s in SCENARIOS}
        for target, rates in (("vllm", (100.0, 110.0, 90.0)), ("roundhouse", (95.0, 99.0, 93.0)))
    }
    _report(args, measured, _times(), [1])
    section = (docs / "benchmarks.md").read_text()
    assert "Levels of 8 streams are missing: the run stopped before them." in section
    results = json.loads((docs / "bench-data" / "structured.json").read_text())
    assert results["settings"]["levels"] == [1]
    # The round whose ratio is the median: 95 / 100 (the others 0.90 and 1.03).
    ratios = [h["value"] for h in results["headline"] if "plain" in h["measure"]]
    assert ratios == [0.95]
    assert (docs / "img" / "structured.png").exists()
