"""A client whose frontend dies mid-stream resumes on another with Last-Event-ID."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import httpx

from tests.conftest import ALIAS, _free_port, _http_ok, _spawn, _wait_for


def _events(lines: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """The SSE events of a response as (id, data), data None for [DONE]."""
    found, ident = [], ""
    for line in lines:
        if line.startswith("id: "):
            ident = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
            found.append((ident, None if data == "[DONE]" else json.loads(data)))
    return found


def _text(events: list[tuple[str, dict[str, Any] | None]]) -> str:
    return "".join(
        (data["choices"][0]["delta"].get("content") or "")
        for _, data in events
        if data and data.get("choices")
    )


def test_a_stream_cut_by_a_dying_frontend_resumes_elsewhere_with_every_token_once(
    stack, world, tmp_path, usage_of
):
    port = _free_port()
    doomed = _spawn(
        "frontend-doomed",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path,
    )
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Tell a long story"}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        _wait_for(doomed, lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), timeout=120)
        seen: list[str] = []
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=body, headers=auth) as response,
        ):
            assert response.status_code == 200
            rid = response.headers["x-request-id"]
            for line in response.iter_lines():
                seen.append(line)
                if sum(1 for s in seen if s.startswith("data: {")) >= 4:
                    # The frontend dies as a crashed pod does: the request keeps running.
                    os.kill(doomed.popen.pid, signal.SIGKILL)
                    break
    finally:
        doomed.popen.kill()
        doomed.popen.wait(timeout=30)
    before = _events(seen)
    last_id = before[-1][0]
    assert last_id and len(before) >= 4

    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        resumed = client.get(
            f"/v1/requests/{rid}/stream", headers={**auth, "Last-Event-ID": last_id}
        )
        assert resumed.status_code == 200, resumed.text
        rest = _events(resumed.text.splitlines())
        # From its start, for comparison: the same reply stream, read whole.
        whole = _events(client.get(f"/v1/requests/{rid}/stream", headers=auth).text.splitlines())
        # Another tenant cannot resume it; a malformed id is a clear error.
        foreign = client.get(
            f"/v1/requests/{rid}/stream", headers={"Authorization": f"Bearer {world.globex_key}"}
        )
        malformed = client.get(
            f"/v1/requests/{rid}/stream", headers={**auth, "Last-Event-ID": "yesterday"}
        )
    assert rest[-1][1] is None  # [DONE]
    finish = rest[-2][1]
    assert finish is not None and finish["choices"][0]["finish_reason"] == "length"
    assert _text(before) + _text(rest) == _text(whole)
    ids = [i for i, _ in before + rest if i]
    assert ids == sorted(ids, key=lambda i: tuple(int(p) for p in i.split("-")))
    assert foreign.status_code == 404
    assert malformed.status_code == 400
    assert malformed.json()["error"]["param"] == "Last-Event-ID"
    # The request ran to its end once, billed once.
    (record,) = usage_of(rid)
    assert (record.status, record.completion_tokens) == ("ok", 200)


def test_a_frontend_stopped_gracefully_finishes_the_streams_it_relays(
    stack, world, tmp_path, usage_of
):
    port = _free_port()
    leaving = _spawn(
        "frontend-leaving",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path,
    )
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Tell a long story"}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        _wait_for(leaving, lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), timeout=120)
        lines: list[str] = []
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client,
            client.stream(
                "POST",
                "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {world.acme_key}"},
            ) as response,
        ):
            assert response.status_code == 200
            rid = response.headers["x-request-id"]
            for line in response.iter_lines():
                lines.append(line)
                if len(lines) == 2:
                    # A rolling update: SIGTERM, and the stream in flight still runs to its end.
                    leaving.popen.send_signal(signal.SIGTERM)
        # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
        assert leaving.popen.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Finished server process" in leaving.tail(20)
    finally:
        if leaving.popen.poll() is None:
            leaving.popen.kill()
            leaving.popen.wait(timeout=30)
    events = _events(lines)
    assert events[-1][1] is None  # [DONE]
    finish = events[-2][1]
    assert finish is not None and finish["choices"][0]["finish_reason"] == "length"
    (record,) = usage_of(rid)
    assert (record.status, record.completion_tokens) == ("ok", 200)
