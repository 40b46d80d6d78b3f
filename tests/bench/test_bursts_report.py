"""The bursts benchmark shows each level's median round and every round's ratios."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.bursts import Level, _publish, headline, median_round, tables


def _level(target: str, wait_ms: float, frontend_ms: float = 1.0) -> Level:
    cpu = {"api server": 2.0} if target == "vllm" else {"frontend": frontend_ms, "worker": 1.0}
    return Level(target, 8, [wait_ms] * 5, [wait_ms / 2] * 40, cpu, 0)


def _round(ours: float, alone: float, vllm: float = 100.0) -> dict[str, Level]:
    return {
        "vllm": _level("vllm", vllm),
        "roundhouse": _level("roundhouse", ours, 1.6),
        "roundhouse_alone": _level("roundhouse_alone", alone, 2.0),
    }


def test_the_median_round_is_the_one_whose_burst_ratio_is_the_median() -> None:
    rounds = [_round(130, 150), _round(90, 120), _round(110, 140)]
    assert median_round(rounds)["roundhouse"].wait_p50 == 110


def test_the_tables_list_every_round_and_the_headline_the_median_one() -> None:
    by_level = {8: [_round(130, 150), _round(90, 120), _round(110, 140)]}
    text = tables(by_level)
    assert "| 8 | Roundhouse | 110.0 / 110.0 |" in text
    assert "| 8 | 1.30 · 0.90 · 1.10 | 1.15 · 1.33 · 1.27 | 0.80 · 0.80 · 0.80 |" in text
    rows = {row["measure"]: row for row in headline(by_level, "")}
    burst = rows["Burst of 8 streams: the last first token, Roundhouse ÷ vLLM (median burst)"]
    assert burst["value"] == 1.1


def test_a_run_cut_short_keeps_the_rounds_it_finished(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    args = argparse.Namespace(
        levels=[8, 32],
        bursts=5,
        tokens=16,
        rounds=3,
        docs=docs,
        gpu="",
        vllm="0.32.0",
        cpu="avx2",
        cores=2,
        section="bursts",
    )
    _publish(args, {8: [_round(110, 140)], 32: [_round(120, 160)]})
    saved = json.loads((docs / "bench-data" / "bursts.json").read_text())
    assert [len(r) for r in saved["rounds"].values()] == [1, 1]
    assert "to warm up, 1 round." in (docs / "benchmarks.md").read_text()
    assert (docs / "img" / "bursts.png").exists()
