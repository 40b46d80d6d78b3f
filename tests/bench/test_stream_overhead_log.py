"""The streaming benchmark's results rebuilt from a run that stopped early (its progress lines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.stream_overhead import _from_log

FIGURES = {
    "vllm": "TTFT p50 10.0 ms p99 20.0 ms, ITL p50 3.0 ms p99 5.0 ms",
    "roundhouse": "TTFT p50 12.0 ms p99 22.0 ms, ITL p50 20.0 ms p99 21.0 ms",
}


def _level(target: str, streams: int, tokens_per_s: str, errors: int = 0) -> str:
    """One level's progress line, as the benchmark prints it."""
    return (
        f"[bench] {target}: c={streams} {tokens_per_s} tok/s, {FIGURES[target]} "
        f"(load 1.0, {errors} errors)"
    )


LOG = "\n".join(
    [
        "[bench] 16 CPU cores, processor: Some Xeon; avx2; GPU: NVIDIA H100 80GB HBM3; vLLM 0.26.0",
        "[bench] building the tiny demo model",
        "[bench] round 1/3: (a) vLLM's own OpenAI server",
        "[bench] vllm: concurrency 1, 128 requests",
        _level("vllm", 1, "300"),
        "[bench] vllm: concurrency 8, 128 requests",
        _level("vllm", 8, "1,600"),
        "[bench] running round 1 again: vLLM at 1 streams moved +20% from 250",
        "[bench] round 1/3: (a) vLLM's own OpenAI server",
        _level("vllm", 1, "320"),
        _level("vllm", 8, "1,600"),
        "[bench] round 1/3: (b) Roundhouse end to end",
        _level("roundhouse", 1, "288", errors=2),
        _level("roundhouse", 8, "1,760"),
        "[bench] round 2/3: (a) vLLM's own OpenAI server",
        _level("vllm", 1, "310"),
        _level("vllm", 8, "1,650"),
        "[bench] round 2/3: (b) Roundhouse end to end",
        _level("roundhouse", 1, "290"),
    ]
)


def _args(log: Path, docs: Path) -> argparse.Namespace:
    return argparse.Namespace(
        from_log=log,
        docs=docs,
        measured="2026-11-26",
        requests_per_level=16,
        min_requests=256,
        rounds=3,
        stream_interval_ms=None,
    )


def test_a_cut_short_run_is_published_with_the_rounds_it_finished(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(LOG)
    _from_log(_args(log, tmp_path / "docs"))

    section = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "<!-- bench:stream_overhead_gpu -->" in section
    assert "one NVIDIA H100 80GB HBM3, 16 CPU cores" in section
    assert "1 of 3 rounds (the run stopped before the rest)" in section
    assert "128 at least" in section
    # The try that was kept (320 tok/s), not the one that drifted and ran again.
    assert "| 1 | 320 / 288 | **0.90** |" in section
    assert "| 8 | 1,600 / 1,760 | **1.10** |" in section
    assert "running round 1 again: vLLM at 1 streams moved +20% from 250" in section
    assert "stage split and the CPU use are written only by a run that finishes" in section

    data = tmp_path / "docs" / "bench-data" / "stream_overhead_gpu.json"
    results = json.loads(data.read_text())
    assert results["settings"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert results["settings"]["from_log"] is True
    assert [lvl["throughput_ratio"] for lvl in results["summary"]["levels"]] == [0.9, 1.1]
    assert results["summary"]["levels"][0]["errors"] == 2
    assert len(results["rounds"]["roundhouse"]) == 1
    assert (tmp_path / "docs" / "img" / "stream_overhead_gpu.png").stat().st_size > 0


def test_a_run_with_more_api_processes_is_rebuilt_into_its_own_section(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(LOG)
    args = _args(log, tmp_path / "docs")
    args.api_processes = 2
    _from_log(args)

    section = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "<!-- bench:stream_overhead_gpu_api2 -->" in section
    assert "<!-- bench:stream_overhead_gpu -->" not in section
    assert (tmp_path / "docs" / "bench-data" / "stream_overhead_gpu_api2.json").exists()


def test_a_log_without_a_finished_round_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(LOG.split("[bench] round 1/3: (b)")[0])
    with pytest.raises(SystemExit, match="no round finished both targets"):
        _from_log(_args(log, tmp_path / "docs"))


def test_a_file_that_is_not_this_benchmarks_log_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "other.log"
    log.write_text("hello\n")
    with pytest.raises(SystemExit, match="no 'processor:' line"):
        _from_log(_args(log, tmp_path / "docs"))
