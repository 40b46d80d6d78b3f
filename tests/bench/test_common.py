"""The benchmarks' shared helpers."""

from __future__ import annotations

import pytest

from bench.common import ROOT, progress


def test_a_progress_line_names_paths_in_the_checkout_from_its_root(
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress(f"wrote {ROOT / 'docs' / 'benchmarks.md'} and /elsewhere/x.png")
    assert capsys.readouterr().out == "[bench] wrote docs/benchmarks.md and /elsewhere/x.png\n"
