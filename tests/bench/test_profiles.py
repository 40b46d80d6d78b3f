"""bench/profiles.py reads py-spy's collapsed stacks into per-frame samples."""

# One sample line of py-spy's raw output per line: long lines are kept here.
# ruff: noqa: E501

from __future__ import annotations

from bench.profiles import ROOT, Sampled, frames_counted

RAW = f"""\
<module> (manage.py:22);run (uvloop/__init__.py:96);Runner.run (/usr/lib/python3.11/asyncio/runners.py:118) 7
<module> (manage.py:22);run (uvloop/__init__.py:96);_flush_loop ({ROOT}/workers/runner.py:420);writelines (/x/.venv/lib/python3.11/site-packages/redis/asyncio/connection.py:510) 3
<module> (manage.py:22);run (uvloop/__init__.py:96);_flush_loop ({ROOT}/workers/runner.py:431);_flush_loop ({ROOT}/workers/runner.py:433) 2
not a sample line
"""


def test_samples_count_by_the_frame_running_and_every_frame_on_the_stack():
    total, running, within = frames_counted(RAW)
    assert total == 12
    assert running["Runner.run (asyncio/runners.py)"] == 7
    assert running["writelines (redis/asyncio/connection.py)"] == 3
    # A frame is counted once per sample however deep it recurses; its lines are one frame.
    assert running["_flush_loop (workers/runner.py)"] == 2
    assert within["_flush_loop (workers/runner.py)"] == 5
    assert within["<module> (manage.py)"] == 12


def test_cpu_per_token_is_the_samples_seconds_over_the_tokens_made_meanwhile():
    sampled = Sampled("worker", samples=500, seconds=10.0, rate=100)
    # 5 CPU seconds over 10 s of 1,000 tokens a second: 0.5 ms a token.
    assert sampled.ms_per_1k_tokens(1000.0) == 500.0
