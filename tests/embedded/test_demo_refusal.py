"""A second `manage.py demo` refuses at once with one clear line instead of half-starting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from embedded.management.commands.demo import demo_lock

ROOT = Path(__file__).resolve().parents[2]


def _demo(data_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.dev",
        "ROUNDHOUSE_DATA_DIR": str(data_dir),
    }
    return subprocess.run(
        [sys.executable, "manage.py", "demo", "--port", str(port), "--no-celery"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _listening() -> socket.socket:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    return held


def test_it_refuses_to_start_beside_a_demo_running_from_the_same_data_dir(tmp_path):
    running = demo_lock(tmp_path)  # what the first demo holds while it runs
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    try:
        done = _demo(tmp_path, port)
    finally:
        running.close()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"CommandError: a demo already runs from {tmp_path} (pid {os.getpid()}): stop it with "
        f"Ctrl-C in its terminal, or `kill {os.getpid()}`"
    ]
    assert done.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == ["demo.lock"]  # nothing else was started


def test_it_refuses_to_start_when_its_port_is_taken(tmp_path):
    with _listening() as held:
        port = held.getsockname()[1]
        done = _demo(tmp_path, port)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"CommandError: port {port} is in use: a demo may already run (stop it with Ctrl-C in "
        "its terminal), or choose another with --port or ROUNDHOUSE_PORT"
    ]
    assert done.stdout == ""


def test_the_lock_is_free_again_once_the_demo_holding_it_ends(tmp_path):
    demo_lock(tmp_path).close()
    demo_lock(tmp_path).close()
