"""Cheap checks before expensive work: key, body size and request rate before parsing.

A frontend (uvicorn, no engine) is fed over real sockets: a body over the limit is refused
while it is still being sent, a keyless one before any of it is read, and a tenant's flood
of bad requests runs out of that tenant's own requests. An oversized prompt is refused
without running the tokenizer, and made-up keys cannot grow a frontend's key cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import re
import secrets
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from django.conf import settings
from django.urls import URLResolver, get_resolver

from config.db import db_call
from inference.base.errors import ApiError
from inference.body.fields import CHAT
from inference.body.parser import generation_parse
from inference.edge.asgi import counted_paths
from inference.pipeline import auth
from inference.pipeline.submission import generation_submit
from inference.pipeline.tokenization import Tokenizer
from tenants.keys import PREFIX, token_parse
from tenants.services import api_key_issue, tenant_create
from tests.conftest import (
    ALIAS,
    CONTEXT,
    Process,
    _free_port,
    _http_ok,
    _spawn,
    _wait_for,
    roomy_key,
)

FLOODER_RPM = 3


@pytest.fixture(scope="module")
def flooder_key(world: Any, django_db_blocker: Any) -> str:
    """A tenant of its own with a few requests a minute, so the test owns its bucket."""
    with django_db_blocker.unblock():
        tenant = tenant_create(slug="flooder")
        tenant.quota.requests_per_minute = FLOODER_RPM
        tenant.quota.save()
        return api_key_issue(tenant=tenant, name="tests").token


@pytest.fixture(scope="module")
def one_a_minute_key(world: Any, django_db_blocker: Any) -> str:
    """A tenant of its own allowed one request a minute."""
    with django_db_blocker.unblock():
        tenant = tenant_create(slug="cheap-one-a-minute")
        tenant.quota.requests_per_minute = 1
        tenant.quota.save()
        return api_key_issue(tenant=tenant, name="tests").token


# The large-body bytes a tenant may send a minute, on this module's frontend.
BODY_BYTES_PER_MINUTE = 4 * 1024 * 1024
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def large_body_keys(world: Any, django_db_blocker: Any) -> list[str]:
    """Tenants of their own, so each test owns its large-body bytes."""
    with django_db_blocker.unblock():
        return [
            api_key_issue(tenant=tenant_create(slug=f"cheap-bytes-{i}"), name="tests").token
            for i in range(3)
        ]


# This module's frontend cuts a client that reads none of its answer for this long.
WRITE_TIMEOUT_SECONDS = 2


@pytest.fixture(scope="module")
def frontend_process(
    world: Any, flooder_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Process]]:
    """A frontend alone: these checks all happen before any engine is asked."""
    port = _free_port()
    process = _spawn(
        "frontend-cheap-checks",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path_factory.mktemp("cheap-checks"),
        env_extra={
            "ROUNDHOUSE_LARGE_BODY_BYTES_PER_MINUTE": str(BODY_BYTES_PER_MINUTE),
            "ROUNDHOUSE_WRITE_TIMEOUT_SECONDS": str(WRITE_TIMEOUT_SECONDS),
        },
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(process, lambda: _http_ok(f"{base_url}/healthz"), timeout=120)
        yield base_url, process
    finally:
        process.popen.terminate()
        process.popen.wait(timeout=30)


@pytest.fixture(scope="module")
def frontend(frontend_process: tuple[str, Process]) -> str:
    return frontend_process[0]


def _send_until_answered(
    base_url: str, head: str, chunks: Iterator[bytes], timeout: float = 30.0
) -> tuple[bytes, int]:
    """Send a request's head, then its chunks until the server answers; return (answer, sent)."""
    port = int(base_url.rsplit(":", 1)[1])
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode())
        sock.setblocking(False)
        pending = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock] if chunks else [], [], 0.5)
            if readable:
                sock.setblocking(True)
                sock.settimeout(5)
                return _answer_read(sock), sent
            if writable:
                if not pending:
                    try:
                        pending = next(chunks)
                    except StopIteration:
                        chunks = iter(())  # everything sent: wait for the answer
                        continue
                try:
                    n = sock.send(pending)
                except BlockingIOError:
                    continue
                sent += n
                pending = pending[n:]
    raise AssertionError(f"no answer within {timeout}s after sending {sent} bytes")


def _answer_read(sock: socket.socket) -> bytes:
    """Read a whole answer: its head, then its body (the server may send the two apart)."""
    answer = b""
    while not _answer_complete(answer):
        try:
            part = sock.recv(65536)
        except TimeoutError:
            break
        if not part:
            break
        answer += part
    return answer


def _answer_complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    headers = head.lower()
    if b"transfer-encoding: chunked" in headers:
        return body.endswith(b"0\r\n\r\n")
    for line in headers.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return True


def _chunked(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    """A chunked body of `total` bytes of JSON-ish text, then its last chunk."""
    data = b"a" * size
    for _ in range(total // size):
        yield f"{size:x}\r\n".encode() + data + b"\r\n"
    yield b"0\r\n\r\n"


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _head(path: str, key: str | None, length: int | None = None) -> str:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    return "\r\n".join(lines) + "\r\n\r\n"


def test_it_refuses_a_chunked_body_over_the_limit_before_reading_it_all(frontend, world):
    limit = settings.MAX_REQUEST_BYTES
    total = 64 * limit  # 256 MB: the test fails unless the answer comes long before the end
    answer, sent = _send_until_answered(
        frontend, _head("/v1/chat/completions", world.acme_key), _chunked(total)
    )
    assert _status(answer) == 413, answer[:300]
    assert b"request_too_large" in answer
    # What the kernel buffers on both sides is a few MB at most; the rest was never sent.
    assert sent < 4 * limit, sent


def test_it_refuses_a_declared_length_over_the_limit_before_reading_any_of_it(frontend, world):
    head = _head("/v1/chat/completions", world.acme_key, length=1 << 30)
    answer, sent = _send_until_answered(frontend, head, iter(()))
    assert _status(answer) == 413 and sent == 0


@pytest.mark.parametrize("key", [None, "sy-notarealkeyatall0000000000000000"])
def test_it_answers_a_body_without_a_valid_key_with_401_before_reading_it(frontend, key):
    # Chunked, so no declared length gives the game away; nothing of the body is sent.
    answer, sent = _send_until_answered(frontend, _head("/v1/completions", key), iter(()))
    assert _status(answer) == 401, answer[:300]
    # The head may arrive before the body: its content type says the body is the JSON error.
    assert b"content-type: application/json" in answer.lower() and sent == 0


def test_a_tenant_flooding_bad_requests_runs_out_of_its_own_requests_only(
    frontend, world, flooder_key
):
    bad = {"model": ALIAS, "prompt": 3}  # a 400: the prompt must be text or token ids
    with httpx.Client(base_url=frontend, timeout=30) as client:

        def post(key: str) -> httpx.Response:
            return client.post(
                "/v1/completions", json=bad, headers={"Authorization": f"Bearer {key}"}
            )

        answers = [post(flooder_key) for _ in range(FLOODER_RPM + 2)]
        other = post(world.globex_key)
    codes = [a.status_code for a in answers]
    assert codes[:FLOODER_RPM] == [400] * FLOODER_RPM, codes
    assert codes[FLOODER_RPM:] == [429, 429], codes
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["Retry-After"]) >= 1
    remaining = [int(a.headers["x-ratelimit-remaining-requests"]) for a in answers]
    assert remaining[:FLOODER_RPM] == list(range(FLOODER_RPM - 1, -1, -1)), remaining
    assert other.status_code == 400 and other.json()["error"]["param"] == "prompt"


def test_a_tenant_past_its_requests_per_minute_gets_its_429_before_its_body_is_read(
    frontend, one_a_minute_key
):
    """A throttled tenant's flood of large bodies costs the frontend their heads only."""
    with httpx.Client(base_url=frontend, timeout=30) as client:
        first = client.post(
            "/v1/chat/completions",
            json={"model": ALIAS, "messages": "not a list"},
            headers={"Authorization": f"Bearer {one_a_minute_key}"},
        )
    assert first.status_code == 400, first.text  # counted, then refused for its body
    # Chunked, so its length tells nothing: the 429 comes with none of the body sent.
    head = _head("/v1/chat/completions", one_a_minute_key)
    answer, sent = _send_until_answered(frontend, head, _chunked(64 * settings.MAX_REQUEST_BYTES))
    assert _status(answer) == 429, answer[:300]
    assert b"rate_limit_exceeded" in answer and b"retry-after:" in answer.lower()
    assert sent < 4 * settings.MAX_REQUEST_BYTES, sent  # the kernel's buffers, not the body


def _answered_unsent(base_url: str, head: str) -> bytes:
    """Send a request's head only, and read the answer: one that needs no body."""
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode())
        sock.settimeout(10)
        return _answer_read(sock)


def test_a_tenants_large_bodies_past_its_bytes_a_minute_get_429_before_they_are_read(
    frontend, large_body_keys
):
    """A tenant posting megabytes in a loop costs a frontend their heads once its share of
    large-body bytes for the minute is spent; another tenant's share is its own."""
    key, other, _ = large_body_keys
    body = b'{"model": "none", "messages": "' + b"a" * (3 * MIB) + b'"}'
    with httpx.Client(base_url=frontend, timeout=30) as client:
        read = client.post(
            "/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert read.status_code == 400, read.text  # read, and refused for what it holds
    # The next one's length alone is over what is left: answered with none of it sent.
    answer = _answered_unsent(frontend, _head("/v1/chat/completions", key, length=len(body)))
    assert _status(answer) == 429, answer[:300]
    assert b"body_bytes_exceeded" in answer and b"retry-after:" in answer.lower()
    assert b"x-should-retry: true" in answer.lower()
    # A small body is no large body: it goes on as ever.
    with httpx.Client(base_url=frontend, timeout=30) as client:
        small = client.post(
            "/v1/chat/completions",
            json={"model": "none", "messages": "x"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert small.status_code == 400, small.text
    # Another tenant's large body is read.
    with httpx.Client(base_url=frontend, timeout=30) as client:
        theirs = client.post(
            "/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {other}"}
        )
        assert theirs.status_code == 400, theirs.text


@pytest.fixture(scope="module")
def own_bytes_keys(world: Any, django_db_blocker: Any) -> dict[int, str]:
    """Tenants whose quota sets their own large-body bytes a minute (0: no limit)."""
    keys = {}
    with django_db_blocker.unblock():
        for per_minute in (0, 8 * MIB):
            tenant = tenant_create(slug=f"cheap-own-bytes-{per_minute}")
            tenant.quota.large_body_bytes_per_minute = per_minute
            tenant.quota.save()
            keys[per_minute] = api_key_issue(tenant=tenant, name="tests").token
    return keys


def test_a_tenants_quota_sets_its_own_large_body_bytes(frontend, own_bytes_keys):
    """The frontend's setting (4 MiB here) is the default; a tenant's quota overrides it."""
    body = b'{"model": "none", "messages": "' + b"a" * (3 * MIB) + b'"}'

    def sent(key: str) -> list[int]:
        with httpx.Client(base_url=frontend, timeout=30) as client:
            return [
                client.post(
                    "/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {key}"}
                ).status_code
                for _ in range(3)
            ]

    assert sent(own_bytes_keys[0]) == [400, 400, 400]  # no limit: every body is read
    assert sent(own_bytes_keys[8 * MIB]) == [400, 400, 429]  # 8 MiB: two bodies of 3 MiB


def test_a_chunked_large_body_counts_once_it_is_read(frontend, large_body_keys):
    """A body of unknown length is read, then counted: the tenant's next one waits."""
    key = large_body_keys[2]
    answer, _ = _send_until_answered(
        frontend, _head("/v1/chat/completions", key), _chunked(3 * MIB), timeout=30
    )
    assert _status(answer) == 400, answer[:300]
    answer = _answered_unsent(frontend, _head("/v1/chat/completions", key, length=2 * MIB))
    assert _status(answer) == 429 and b"body_bytes_exceeded" in answer, answer[:300]


def _stalled(base_url: str, key: str) -> socket.socket:
    """Open a chunked chat request with a key and send part of its body, then stop sending."""
    port = int(base_url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(_head("/v1/chat/completions", key).encode() + b'5\r\n{"mod\r\n')
    return sock


def test_a_tenants_stalled_large_body_holds_its_own_next_one_and_nobody_elses(frontend, world):
    """Large bodies (here chunked: of unknown size) are read one per tenant at a time."""
    body = b'{"model": "none", "messages": []}'
    complete = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    first = _stalled(frontend, world.acme_key)
    try:
        time.sleep(0.5)  # the frontend has begun reading it: acme's turn is taken
        # Another tenant's large body is read and answered meanwhile.
        answer, _ = _send_until_answered(
            frontend, _head("/v1/chat/completions", world.globex_key), iter([complete]), timeout=30
        )
        assert _status(answer) in (400, 404), answer[:300]
        # Acme's next large body waits for acme's turn, unread and unanswered...
        port = int(frontend.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as second:
            second.sendall(_head("/v1/chat/completions", world.acme_key).encode() + complete)
            readable, _, _ = select.select([second], [], [], 2.0)
            assert not readable, "acme's second large body was answered during its first"
            # ...until the first one ends (its client gives up).
            first.close()
            second.settimeout(30)
            assert _status(_answer_read(second)) in (400, 404)
    finally:
        first.close()


def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout}s")
        time.sleep(0.1)


def test_a_client_that_stops_reading_its_answer_is_cut_after_the_write_timeout(
    frontend_process, django_db_blocker
):
    """A file's 16 MB, asked for by a socket that then reads nothing: the frontend's sends
    stall once the kernel's buffers are full, and it closes the connection after the write
    timeout instead of holding the answer for as long as the client likes."""
    base_url, process = frontend_process
    with django_db_blocker.unblock():
        key = roomy_key("cheap-slow-reader", large_body_bytes_per_minute=0)
    auth = {"Authorization": f"Bearer {key}"}
    line = b'{"custom_id": "%d", "method": "POST", "url": "/v1/embeddings", "body": "%s"}\n'
    content = b"".join(line % (i, b"a" * 8000) for i in range(2000))
    uploaded = httpx.post(
        f"{base_url}/v1/files",
        files={"file": ("slow.jsonl", content)},
        data={"purpose": "batch"},
        headers=auth,
        timeout=120,
    )
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, before connect
    with sock:
        sock.connect(("127.0.0.1", int(base_url.rsplit(":", 1)[1])))
        sock.sendall(
            f"GET /v1/files/{file_id}/content HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
        port = sock.getsockname()[1]
        server = psutil.Process(process.popen.pid)

        def held() -> bool:
            return any(c.raddr and c.raddr.port == port for c in server.net_connections("tcp"))

        _until(held, 30, "accepted")
        _until(lambda: not held(), 120, "cut")  # the frontend let go of its socket
        sock.settimeout(30)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while part := sock.recv(1 << 20):
                answer += part
    assert _status(answer) == 200, answer[:300]
    assert not _answer_complete(answer) and len(answer) < len(content)
    scraped = httpx.get(f"{base_url}/metrics", timeout=30).text
    cut = re.search(r"^roundhouse_write_timeouts_total ([0-9.]+)$", scraped, re.MULTILINE)
    assert cut is not None and float(cut.group(1)) >= 1
    assert httpx.get(f"{base_url}/healthz", timeout=30).status_code == 200


@pytest.mark.django_db
async def test_an_oversized_prompt_is_refused_without_running_the_tokenizer(world, monkeypatch):
    """Nor the chat template: rendering megabytes holds the interpreter for every request."""
    public_id = token_parse(world.acme_key).public_id  # type: ignore[union-attr]
    principal = await db_call(auth.principal_of_key, public_id)
    encoded: list[int] = []
    rendered: list[int] = []
    encode_text, render_chat = Tokenizer.encode_text, Tokenizer.render_chat

    def counting(self: Tokenizer, text: str) -> list[int]:
        encoded.append(len(text))
        return encode_text(self, text)

    def counting_renders(self: Tokenizer, messages: Any, **kwargs: Any) -> str:
        rendered.append(len(messages))
        return render_chat(self, messages, **kwargs)

    monkeypatch.setattr(Tokenizer, "encode_text", counting)
    monkeypatch.setattr(Tokenizer, "render_chat", counting_renders)
    huge = {"role": "user", "content": "hello world " * 350_000}  # 4.2 MB
    request = generation_parse({"model": ALIAS, "messages": [huge]}, endpoint=CHAT)
    with pytest.raises(ApiError) as refused:
        await generation_submit(principal=principal, request=request, request_id="huge")
    assert refused.value.code == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT} tokens" in refused.value.message
    assert refused.value.param == "messages"
    assert encoded == [] and rendered == []
    # In parts as well (a template that loops over them may trim each: their words stay).
    halves = [{"type": "text", "text": "hello world " * 175_000}] * 2
    parts = {"role": "user", "content": halves}
    request = generation_parse({"model": ALIAS, "messages": [parts]}, endpoint=CHAT)
    with pytest.raises(ApiError) as refused:
        await generation_submit(principal=principal, request=request, request_id="huge-parts")
    assert refused.value.code == "context_length_exceeded"
    assert encoded == [] and rendered == []
    # A prompt that may fit is tokenised as before (and refused, at its exact length, if not).
    near = {"role": "user", "content": "hello world " * CONTEXT}
    request = generation_parse({"model": ALIAS, "messages": [near]}, endpoint=CHAT)
    with pytest.raises(ApiError) as refused:
        await generation_submit(principal=principal, request=request, request_id="near")
    assert refused.value.code == "context_length_exceeded"
    assert len(encoded) == 1 and len(rendered) == 1


@pytest.mark.django_db
async def test_made_up_keys_do_not_grow_the_key_cache(world, monkeypatch):
    # The process's bounds, and the behaviour at shelves a hundredth their size (each made-up
    # key costs a database lookup: 20,000 of them took most of a minute).
    assert (auth._keys._max_entries, auth._keys._max_missing) == (10_000, 1_024)
    monkeypatch.setattr(auth._keys, "_max_entries", 100)
    monkeypatch.setattr(auth._keys, "_max_missing", 10)
    await auth.authenticate(f"Bearer {world.acme_key}", scope="inference")
    made_up = [f"{PREFIX}{secrets.token_hex(6)}{secrets.token_urlsafe(24)}" for _ in range(300)]

    async def attempt(token: str) -> None:
        with pytest.raises(ApiError):
            await auth.authenticate(f"Bearer {token}", scope="inference")

    for start in range(0, len(made_up), 50):
        await asyncio.gather(*(attempt(t) for t in made_up[start : start + 50]))
    assert len(auth._keys._missing) == 10
    assert len(auth._keys) <= 100 + 10
    # The key in use kept its place: made-up keys evict only made-up keys.
    assert token_parse(world.acme_key).public_id in auth._keys._entries  # type: ignore[union-attr]


@pytest.mark.django_db
async def test_a_request_larger_than_its_deployments_queue_is_a_400_before_admission(
    world, monkeypatch
):
    """The queue refuses such a request whatever waits ahead of it: a 503 queue_full would be
    retried for ever. It is a 400 naming what to lower, and nothing is reserved."""
    from inference.pipeline import submission

    public_id = token_parse(world.acme_key).public_id  # type: ignore[union-attr]
    principal = await db_call(auth.principal_of_key, public_id)
    routing_get = submission.routing_get

    async def small_queue(name: str, *, principal: Any) -> Any:
        routing = await routing_get(name, principal=principal)

        class Small:
            fallback = ""

            def pick(self, **kwargs: Any) -> Any:
                return dataclasses.replace(routing.pick(**kwargs), max_queued_tokens=120)

            def shadow_for(self, **kwargs: Any) -> Any:
                return None

        return Small()

    admitted: list[str] = []
    admit = submission.admit

    async def counting_admit(**kwargs: Any) -> Any:
        admitted.append(kwargs["request_id"])
        return await admit(**kwargs)

    monkeypatch.setattr(submission, "routing_get", small_queue)
    monkeypatch.setattr(submission, "admit", counting_admit)
    hello = [{"role": "user", "content": "hello"}]
    cases: dict[str, dict[str, Any]] = {
        # One choice's max_tokens alone overflows the queue: lower max_tokens.
        "max_tokens": {"max_tokens": 150},
        # Each choice fits; four of them do not: lower n.
        "n": {"max_tokens": 40, "n": 4, "temperature": 1.0},
    }
    for param, fields in cases.items():
        body = {"model": ALIAS, "messages": hello, **fields}
        request = generation_parse(body, endpoint=CHAT)
        with pytest.raises(ApiError) as refused:
            await generation_submit(principal=principal, request=request, request_id=param)
        error = refused.value
        assert (error.status, error.code, error.param) == (400, "exceeds_queue_capacity", param)
        assert "queues at once (120 tokens)" in error.message
        assert error.response()["x-should-retry"] == "false"
    assert admitted == []


def test_the_endpoints_that_count_requests_are_read_from_their_views_marks():
    # The handler counts these before their bodies are read; the views mark them, once.
    assert counted_paths() == {
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/conversations",
        "/v1/conversations/<str:conversation_id>",
        "/v1/conversations/<str:conversation_id>/items",
        "/v1/conversations/<str:conversation_id>/items/<str:item_id>",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/files",
        "/v1/files/<str:file_id>",
        "/v1/files/<str:file_id>/content",
        "/v1/batches",
        "/v1/batches/<str:batch_id>",
        "/v1/batches/<str:batch_id>/cancel",
        "/v1/responses/<str:response_id>",
        "/v1/responses/<str:response_id>/input_items",
        "/v1/responses/<str:response_id>/cancel",
        "/v1/requests/<str:target>/stream",
        "/v1/requests/<str:target>/cancel",
        "/v1/models",
        "/v1/models/<path:name>",
        "/tokenize",
        "/detokenize",
    }


def test_every_endpoint_that_takes_a_key_counts_its_requests():
    # A read costs a frontend and PostgreSQL as a write does: any view that authenticates a
    # key counts the request; only the keyless ones (health, metrics, the API's document) and
    # the 404 of an unknown path do not.
    keyed, uncounted = set(), set()

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
                continue
            view = getattr(pattern.callback, "__wrapped__", None)
            if view is None or "request_principal(" not in inspect.getsource(view):
                continue
            path = "/" + prefix + str(pattern.pattern)
            keyed.add(path)
            if path not in counted_paths():
                uncounted.add(path)

    walk(get_resolver().url_patterns, "")
    assert "/v1/responses/<str:response_id>" in keyed and "/tokenize" in keyed
    assert uncounted == set()
