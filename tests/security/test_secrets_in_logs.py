"""API keys never reach a log line, whoever writes it: the server's own lines included."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import _free_port, _http_ok, _spawn, _wait_for

SECRET = "Zq8VtW3kLmN5pR7sT9uX1yA2bC4dE6fG"
KEY = f"rh-abcdefghijkl{SECRET}"  # shaped like a real key: its public id may be logged
LEGACY_KEY = f"sy-mnopqrstuvwx{SECRET}"  # a key issued before the rename


async def test_it_never_logs_a_key_sent_in_a_query_string(
    django_db_setup: None, tmp_path: Path
) -> None:
    port = _free_port()
    # Access log on, as an operator may run it; the WebSocket lines are logged regardless.
    frontend = _spawn(
        "frontend-logs",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path,
        env_extra={"ROUNDHOUSE_LOG_FORMAT": "plain"},
    )
    try:
        _wait_for(frontend, lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), timeout=120)
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/ws?key={KEY}"):
                pass
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/ws?v=1&key=other-{SECRET}"):
                pass
        httpx.get(f"http://127.0.0.1:{port}/v1/models?key={KEY}", timeout=10)
        httpx.get(f"http://127.0.0.1:{port}/v1/models?api_key={LEGACY_KEY}", timeout=10)
        frontend.popen.send_signal(signal.SIGTERM)
        frontend.popen.wait(timeout=30)
        log = frontend.log.read_text(errors="replace")
    finally:
        if frontend.popen.poll() is None:
            frontend.popen.kill()
            frontend.popen.wait()
    assert "/v1/ws?key=rh-abcdefghijkl[redacted]" in log, log
    assert "/v1/ws?v=1&key=[redacted]" in log, log
    assert "/v1/models?key=rh-abcdefghijkl[redacted]" in log, log
    assert "/v1/models?api_key=sy-mnopqrstuvwx[redacted]" in log, log
    assert SECRET not in log
