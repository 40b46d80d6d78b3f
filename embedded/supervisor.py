"""Run the platform's processes side by side with prefixed logs, and stop them together."""

from __future__ import annotations

import contextlib
import os
import signal

# Supervises the demo's own processes.
import subprocess  # nosec B404
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_COLORS = ["36", "35", "33", "32", "34", "31"]


@dataclass
class Child:
    name: str
    args: list[str]
    popen: subprocess.Popen[bytes] | None = None
    lines: list[str] = field(default_factory=list)


class Supervisor:
    """Start child processes, relay their output line by line, and end them all on stop()."""

    def __init__(self, *, cwd: Path, env: dict[str, str], out: IO[str] = sys.stdout) -> None:
        self.cwd = cwd
        self.env = env
        self.out = out
        self.children: list[Child] = []
        self._lock = threading.Lock()
        self._width = 8

    def start(self, name: str, args: list[str]) -> Child:
        child = Child(name=name, args=args)
        # The demo's own manage.py commands.
        child.popen = subprocess.Popen(  # nosec B603
            args,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.children.append(child)
        self._width = max(self._width, len(name))
        color = _COLORS[(len(self.children) - 1) % len(_COLORS)]
        threading.Thread(target=self._relay, args=(child, color), daemon=True).start()
        return child

    def say(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _relay(self, child: Child, color: str) -> None:
        assert child.popen is not None and child.popen.stdout is not None
        tty = self.out.isatty()
        prefix = child.name.ljust(self._width)
        prefix = f"\033[{color}m{prefix} |\033[0m" if tty else f"{prefix} |"
        for raw in child.popen.stdout:
            line = raw.decode(errors="replace").rstrip()
            child.lines.append(line)
            del child.lines[:-200]
            self.say(f"{prefix} {line}")

    def wait_until(
        self, ready: Callable[[], bool], *, what: str, timeout: float, every: float = 5.0
    ) -> bool:
        """Wait for a condition while every child stays up, reporting progress."""
        started = time.monotonic()
        last_note = started
        while time.monotonic() - started < timeout:
            if self.dead() is not None:
                return False
            if ready():
                return True
            if time.monotonic() - last_note >= every:
                last_note = time.monotonic()
                self.say(f"... waiting for {what} ({time.monotonic() - started:.0f}s)")
            time.sleep(0.2)
        return False

    def dead(self) -> Child | None:
        """Return a child that exited, if any."""
        for child in self.children:
            if child.popen is not None and child.popen.poll() is not None:
                return child
        return None

    def stop(self, grace: float = 20.0) -> None:
        """Send SIGTERM to every child's process group, then SIGKILL what is left."""
        for child in reversed(self.children):
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            if child.popen is None:
                continue
            try:
                child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.popen.wait()
        # Engine subprocesses live in the worker's group; make sure none outlives it.
        for child in self.children:
            _signal_group(child, signal.SIGKILL)


def _signal_group(child: Child, sig: signal.Signals) -> None:
    if child.popen is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.popen.pid, sig)
