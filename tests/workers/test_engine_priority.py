from __future__ import annotations

import multiprocessing
import os
import time

from workers.engine import _processes_deprioritise


def _idle(seconds: float) -> None:
    time.sleep(seconds)


def test_the_engines_processes_run_below_the_worker_loop():
    child = multiprocessing.get_context("spawn").Process(target=_idle, args=(30,))
    child.start()
    try:
        assert child.pid is not None
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        _processes_deprioritise(5)
        threads = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {min(mine + 5, 19)}
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the worker itself is untouched
    finally:
        child.kill()
        child.join()
