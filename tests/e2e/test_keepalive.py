"""Keep-alives through a proxy that cuts idle connections (ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS).

A relay stands where a load balancer would, closing a connection that carries nothing either
way for longer than the keep-alive period plus 2 s. The session's worker is stopped (SIGSTOP)
for longer than that, so a stream sent meanwhile waits in the queue with nothing to say: the
frontend with keep-alives keeps it open through the relay until the worker comes back and it
ends; the frontend with them off has it cut.
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.conftest import ALIAS, _free_port, _http_ok, _spawn, _wait_for

KEEPALIVE = 0.25
IDLE_CUT = KEEPALIVE + 1
# Longer than the relay's idle limit, shorter than anything that would end a queued request:
# than a lease above all (3 s in the tests). The stopped worker's wait for work still claims
# a job when it is queued (the claim goes behind the wait, and Valkey runs it), and a lease
# that lapsed before the worker went on would be reaped as the worker lost, just as it starts.
STOPPED = IDLE_CUT + 1


class IdleCuttingRelay:
    """A TCP relay to `upstream` that closes a connection idle for more than `idle` seconds."""

    def __init__(self, upstream: int, idle: float) -> None:
        self.upstream = upstream
        self.idle = idle
        self.cut = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._carry, args=(client, upstream), daemon=True).start()

    def _carry(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            last = time.monotonic()
            try:
                while True:
                    if time.monotonic() - last > self.idle:
                        self.cut += 1
                        return
                    for key, _ in selector.select(timeout=0.05):
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        peers[key.fileobj].sendall(data)  # type: ignore[index]
                        last = time.monotonic()
            finally:
                for sock in peers:
                    sock.close()

    def close(self) -> None:
        self._closing = True
        self._listener.close()


@dataclass
class Heard:
    lines: list[str] = field(default_factory=list)
    error: str = ""


def _listen(url: str, key: str, body: dict, heard: Heard) -> None:
    try:
        with httpx.stream(
            "POST", url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as response:
            for line in response.iter_lines():
                heard.lines.append(line)
    except httpx.HTTPError as exc:
        heard.error = type(exc).__name__


@pytest.fixture
def frontends(stack, tmp_path) -> Iterator[dict[str, int]]:
    """Two frontends: keep-alives every KEEPALIVE seconds, and none."""
    ports = {"kept alive": _free_port(), "silent": _free_port()}
    seconds = {"kept alive": str(KEEPALIVE), "silent": "0"}
    processes = [
        _spawn(
            f"frontend-{name.replace(' ', '-')}",
            ["-m", "uvicorn", "config.asgi:application", "--port", str(port)],
            tmp_path,
            {"ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS": seconds[name]},
        )
        for name, port in ports.items()
    ]
    try:
        for process, port in zip(processes, ports.values(), strict=True):
            _wait_for(process, lambda port=port: _http_ok(f"http://127.0.0.1:{port}/healthz"), 120)
        yield ports
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.popen.kill()
            process.popen.wait(timeout=30)


CHAT = {
    "model": ALIAS,
    "messages": [{"role": "user", "content": "Wait for it."}],
    "max_tokens": 4,
    "stream": True,
}
MESSAGES = {
    "model": ALIAS,
    "messages": [{"role": "user", "content": "Wait for it."}],
    "max_tokens": 4,
    "stream": True,
}


def _queued_streams(stack, world, port: int) -> tuple[IdleCuttingRelay, Heard, Heard]:
    """A chat and a Messages stream through a relay to PORT while the worker is stopped."""
    relay = IdleCuttingRelay(port, IDLE_CUT)
    base = f"http://127.0.0.1:{relay.port}/v1"
    chat, messages = Heard(), Heard()
    worker = stack.worker.popen
    worker.send_signal(signal.SIGSTOP)
    try:
        key = world.acme_key
        listeners = [
            threading.Thread(target=_listen, args=(f"{base}/{path}", key, body, heard))
            for path, body, heard in (
                ("chat/completions", CHAT, chat),
                ("messages", MESSAGES, messages),
            )
        ]
        for listener in listeners:
            listener.start()
        time.sleep(STOPPED)  # queued, or claimed by the stopped worker: nothing starts
    finally:
        worker.send_signal(signal.SIGCONT)
    for listener in listeners:
        listener.join(timeout=60)
    relay.close()
    return relay, chat, messages


def test_keepalives_carry_a_queued_stream_through_an_idle_cutting_proxy(stack, world, frontends):
    relay, chat, messages = _queued_streams(stack, world, frontends["kept alive"])
    assert relay.cut == 0
    assert not chat.error and not messages.error
    assert ": keep-alive" in chat.lines  # sent while it waited
    assert [line for line in chat.lines if line][-1] == "data: [DONE]"  # then the whole answer
    assert "event: ping" in messages.lines  # Anthropic's own keep-alive event
    assert 'data: {"type":"ping"}' in messages.lines or 'data: {"type": "ping"}' in messages.lines
    assert "event: message_stop" in messages.lines


def test_without_keepalives_the_proxy_cuts_the_queued_stream(stack, world, frontends):
    relay, chat, messages = _queued_streams(stack, world, frontends["silent"])
    assert relay.cut == 2
    assert ": keep-alive" not in chat.lines and "event: ping" not in messages.lines
    assert "data: [DONE]" not in chat.lines
    assert "event: message_stop" not in messages.lines
