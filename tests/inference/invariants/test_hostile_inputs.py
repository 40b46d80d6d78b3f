"""Hostile input against every /v1 endpoint and the WebSocket protocol, over the real server.

Hypothesis picks an endpoint, one field of an otherwise valid request and a hostile value for it
(lone surrogates, NULs, deep nesting, huge numbers and strings, wrong types) or a hostile header
(huge, malformed ids, odd deadlines). Every answer must be a success or an OpenAI-shaped 4xx
with a short message, never a 5xx, and come back before the client's deadline. Afterwards the
fuzzing tenant's next normal requests are served in full: nothing it sent leaked a slot.
WebSocket frame floods and keys revoked while their sockets are open are fuzzed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenants.services import api_key_issue, api_key_revoke, tenant_create
from tests.conftest import ALIAS, ENCODER

TENANT = "zorg-hostile"
CONCURRENCY = 2  # small, so one leaked slot shows in the requests after the fuzzing
DEADLINE = 60.0  # seconds: an answer later than this is a hang
MAX_MESSAGE = 400  # characters an error message may have; inputs are never echoed whole
FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass(frozen=True)
class Raw:
    """JSON text sent as it is (what json.dumps cannot write: deep nesting, huge numbers)."""

    text: str


DEEP = 10_000
HOSTILE = [
    "\ud800",
    "a\udfffb",
    "\x00",
    "nul\x00inside",
    "\u202e\u0000\ufeff",
    "x" * 100_000,
    "😀" * 2_000,
    "",
    " ",
    -1,
    0,
    2**64,
    -(2**63) - 1,
    1e308,
    3.5,
    True,
    None,
    [],
    {},
    ["\ud800"],
    [{"\ud800": "\ud800"}],
    list(range(5_000)),
    # Many short messages: each is read, rendered and tokenised (a Responses truncation once
    # rendered them again for every turn it dropped).
    [{"role": "user", "content": "a"}] * 1_200,
    [{"role": "user", "content": "a"}] * 5_000,
    Raw("1" + "0" * 5_000),
    Raw("1e400"),
    Raw("-1e400"),
    Raw("[" * DEEP + "]" * DEEP),
    Raw('{"a":' * DEEP + "1" + "}" * DEEP),
    Raw('"\\ud800"'),
    Raw('"\\udc00\\ud800"'),
    Raw('"\\u0000"'),
]
MISSING = object()  # the field is left out


def _chat() -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stop": ["END"],
        "documents": [{"title": "Yard", "text": "Turntables turn engines."}],
    }


def _completion() -> dict[str, Any]:
    return {"model": ALIAS, "prompt": "The yard", "max_tokens": 4}


# endpoint -> (a valid body, the paths of the fields to spoil: dotted, ints index lists)
BODIES: dict[str, tuple[Any, list[str]]] = {
    "/v1/chat/completions": (
        _chat,
        [
            "model",
            "messages",
            "messages.0",
            "messages.0.content",
            "messages.0.role",
            "messages.0.name",
            "max_tokens",
            "temperature",
            "top_p",
            "stop",
            "stop.0",
            "user",
            "seed",
            "n",
            "stream",
            "stream_options",
            "logit_bias",
            "response_format",
            "repetition_detection",
            "return_prompt_text",
            "session_id",
            "metadata",
            "documents",
            "documents.0",
            "documents.0.text",
            "logprob_token_ids",
            "use_beam_search",
            "length_penalty",
            "reasoning_effort",
            "include_reasoning",
            "thinking_token_budget",
            "an_unknown_field",
            "",
        ],
    ),
    "/v1/responses": (
        lambda: {
            "model": ALIAS,
            "input": "hi",
            "max_output_tokens": 4,
            "store": False,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 1,
            "truncation": "auto",
        },
        [
            "input",
            "truncation",
            "include",
            "include.0",
            "top_logprobs",
            "max_tool_calls",
            "text",
            "tools",
            "reasoning",
            "",
        ],
    ),
    "/v1/messages": (
        lambda: {
            "model": ALIAS,
            "max_tokens": 4,
            "system": [
                {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {"c": "P"}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
                },
            ],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u"},
        },
        [
            "system",
            "system.0",
            "system.0.text",
            "messages",
            "messages.1.content",
            "messages.1.content.0",
            "messages.1.content.0.input",
            "messages.2.content.0.content",
            "messages.2.content.0.tool_use_id",
            "tools",
            "tools.0.input_schema",
            "tool_choice",
            "tool_choice.type",
            "stop_sequences",
            "metadata",
            "thinking",
            "output_config",
            "max_tokens",
            "",
        ],
    ),
    "/v1/completions": (
        _completion,
        ["model", "prompt", "max_tokens", "stop", "user", "echo", "best_of", "suffix", ""],
    ),
    "/v1/embeddings": (
        lambda: {"model": ALIAS, "input": ["hello"]},  # a list: "input.0" names its text
        ["model", "input", "input.0", "encoding_format", "dimensions", "user", ""],
    ),
    "/v1/batches": (
        lambda: {
            "input_file_id": "file-doesnotexist",
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        ["input_file_id", "endpoint", "completion_window", "metadata", ""],
    ),
}
HOSTILE_HEADERS = [
    ("Idempotency-Key", "k" * 8_000),
    ("x-request-timeout", "nan"),
    ("x-request-timeout", "1e400"),
    ("x-request-timeout", "-1"),
    ("x-request-timeout", "9" * 400),
    ("traceparent", "00-" + "f" * 4_000),
    ("Content-Type", "text/plain"),
    ("Authorization", "Bearer sy-" + "a" * 8_000),
    ("Authorization", "Bearer " + "\u00e9" * 50),
]
# Bytes no header value may hold (RFC 9110): the HTTP server refuses the request before the
# platform sees it, with its own plain 400.
PROTOCOL_VIOLATIONS = [
    ("Idempotency-Key", "\x7f" * 10),
    ("Authorization", "Bearer sy-\x01"),
]
HOSTILE_EVENT_IDS = [
    "99999999999999999999-99999999999999999999",
    "18446744073709551616-0",
    "18446744073709551615-18446744073709551615",
    "-1-0",
    "1-",
    "0-0" * 1_000,
    "1.5-2",
]


def _spoil(body: Any, path: str, value: Any) -> Any:
    """Set (or remove) one field of a body given its dotted path; '' replaces the whole body."""
    if path == "":
        return value
    *parents, last = path.split(".")
    node = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is MISSING:
        if isinstance(node, dict):
            node.pop(key, None)
    else:
        node[key] = value
    return body


def _encode(body: Any) -> bytes:
    """Write a body as JSON, each Raw value as its own text (surrogates kept as escapes)."""
    raws: list[str] = []

    def placeholder(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(value, dict):
            return {k: placeholder(v) for k, v in value.items()}
        if isinstance(value, list):
            return [placeholder(v) for v in value]
        return value

    text = json.dumps(placeholder(body))
    for index, raw in enumerate(raws):
        text = text.replace(f'"@@raw{index}@@"', raw)
    return text.encode()


def _check_answer(response: httpx.Response, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:500])
    if response.status_code < 400:
        return
    assert response.headers.get("content-type") == "application/json", (what, response.text[:200])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"], what
    assert len(error["message"]) <= MAX_MESSAGE, (what, error["message"][:500])
    assert {"type", "code", "param"} <= set(error), (what, error)


@dataclass(frozen=True)
class Fuzzing:
    key: str
    base_url: str


@pytest.fixture(scope="module")
def fuzzing(stack: Any, django_db_blocker: Any) -> Fuzzing:
    with django_db_blocker.unblock():
        tenant = tenant_create(slug=TENANT)
        quota = tenant.quota
        quota.max_concurrency = CONCURRENCY
        quota.requests_per_minute = 100_000
        quota.tokens_per_minute = 10_000_000
        quota.max_tokens_per_request = 8
        quota.save()
        key = api_key_issue(tenant=tenant, name="hostile").token
    return Fuzzing(key=key, base_url=stack.base_url)


@pytest.fixture(scope="module")
def http(fuzzing: Fuzzing) -> Any:
    headers = {"Authorization": f"Bearer {fuzzing.key}"}
    with httpx.Client(base_url=fuzzing.base_url, headers=headers, timeout=DEADLINE) as client:
        yield client


@st.composite
def _spoiled_requests(draw: Any) -> tuple[str, str, bytes]:
    endpoint = draw(st.sampled_from(sorted(BODIES)))
    make, paths = BODIES[endpoint]
    path = draw(st.sampled_from(paths))
    value = draw(st.sampled_from([*HOSTILE, MISSING]) if path else st.sampled_from(HOSTILE))
    body = _spoil(make(), path, value)
    return endpoint, path, _encode(body) if body is not MISSING else b""


@FUZZ
@given(request=_spoiled_requests())
def test_a_hostile_field_is_answered_with_a_short_4xx_or_served(
    request: tuple[str, str, bytes], http: httpx.Client
) -> None:
    endpoint, path, body = request
    response = http.post(endpoint, content=body, headers={"Content-Type": "application/json"})
    _check_answer(response, f"{endpoint} {path or 'body'}: {body[:80]!r}")


@FUZZ
@given(header=st.sampled_from(HOSTILE_HEADERS), endpoint=st.sampled_from(sorted(BODIES)))
def test_a_hostile_header_is_answered_with_a_short_4xx_or_served(
    header: tuple[str, str], endpoint: str, http: httpx.Client
) -> None:
    name, value = header
    make, _ = BODIES[endpoint]
    # Sent as UTF-8 bytes: a client may put any byte a header allows, not only ASCII.
    response = http.post(endpoint, content=_encode(make()), headers={name.encode(): value.encode()})
    _check_answer(response, f"{endpoint} {name}: {value[:40]!r}")


@pytest.mark.parametrize(("name", "value"), PROTOCOL_VIOLATIONS)
def test_a_header_no_http_allows_is_refused_by_the_server(
    name: str, value: str, http: httpx.Client
) -> None:
    response = http.post(
        "/v1/chat/completions", json=_chat(), headers={name.encode(): value.encode()}
    )
    assert response.status_code == 400, response.text[:200]


def test_hostile_resume_positions_and_ids_are_4xx(http: httpx.Client) -> None:
    started = http.post("/v1/chat/completions", json={**_chat(), "stream": True})
    assert started.status_code == 200, started.text
    rid = started.headers["x-request-id"]
    for event_id in HOSTILE_EVENT_IDS:
        response = http.get(f"/v1/requests/{rid}/stream", headers={"Last-Event-ID": event_id})
        _check_answer(response, f"Last-Event-ID {event_id[:40]}")


HOSTILE_IDS = ["%00", "%ED%A0%80", "%F0%9F%98%80", "x" * 5_000, "..%2F..%2Fetc", "%25", "a%0Ab"]
ID_PATHS = [
    ("GET", "/v1/requests/{}/stream"),
    ("POST", "/v1/requests/{}/cancel"),
    ("GET", "/v1/models/{}"),
    ("GET", "/v1/files/{}"),
    ("DELETE", "/v1/files/{}"),
    ("GET", "/v1/files/{}/content"),
    ("GET", "/v1/batches/{}"),
    ("POST", "/v1/batches/{}/cancel"),
]


@pytest.mark.parametrize(("method", "path"), ID_PATHS)
def test_a_hostile_id_in_a_path_is_a_short_4xx(method: str, path: str, http: httpx.Client) -> None:
    for target in HOSTILE_IDS:
        response = http.request(method, path.format(target))
        _check_answer(response, f"{method} {path} {target[:40]}")
        assert 400 <= response.status_code < 500, (path, target[:40], response.status_code)


async def _ws_frames(url: str, key: str, frames: list[str]) -> list[dict[str, Any]]:
    """Send frames on one socket and return one answer each (errors or a request's end)."""
    answers = []
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        for frame in frames:
            await ws.send(frame)
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE))
                if message["type"] in ("error", "finished"):
                    answers.append(message)
                    break
    return answers


def _ws_request(body: Any) -> str:
    return '{"type":"request","id":"f","endpoint":"chat.completions","body":' + body + "}"


async def test_hostile_websocket_frames_get_error_frames_and_the_socket_still_serves(
    fuzzing: Fuzzing,
) -> None:
    frames = [
        "",
        "not json",
        "[" * DEEP + "]" * DEEP,
        '{"type":"request","id":' + "[" * DEEP + "]" * DEEP + "}",
        '{"type":"request","id":"\\ud800"}',
        '{"type":"\\ud800","id":"f"}',
        _ws_request(_encode(_spoil(_chat(), "user", "\ud800")).decode()),
        _ws_request(_encode(_spoil(_chat(), "stop", ["\ud800"])).decode()),
        _ws_request(_encode(_spoil(_chat(), "messages.0.content", Raw('"\\ud800"'))).decode()),
        _ws_request(_encode(_spoil(_chat(), "max_tokens", Raw("1" + "0" * 5_000))).decode()),
        _ws_request('{"a":' * DEEP + "1" + "}" * DEEP),
    ]
    url = fuzzing.base_url.replace("http://", "ws://") + "/v1/ws"
    answers = await _ws_frames(url, fuzzing.key, [*frames, _ws_request(json.dumps(_chat()))])
    for frame, answer in zip(frames, answers, strict=False):
        assert answer["type"] == "error", (frame[:60], answer)
        message = answer["error"]["message"] if "error" in answer else answer.get("message", "")
        assert len(str(message)) <= MAX_MESSAGE, (frame[:60], answer)
    assert answers[-1]["type"] == "finished", answers[-1]


# Readers that stop reading: the answers each asks for, and how much of it is read. Their
# sockets stay open until the module ends, past the check that the tenant is served in full.
SLOW_BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", _chat()),
    "stream": ("/v1/chat/completions", {**_chat(), "stream": True}),
    "echoed logprobs": (
        "/v1/completions",
        {"model": ALIAS, "prompt": "word " * 400, "max_tokens": 4, "echo": True, "logprobs": 5},
    ),
    "responses stream": (
        "/v1/responses",
        {"model": ALIAS, "input": "hi", "max_output_tokens": 4, "stream": True, "store": False},
    ),
    "embeddings": ("/v1/embeddings", {"model": ENCODER, "input": ["word " * 20] * 256}),
}
_slow_sockets: list[socket.socket] = []


@pytest.fixture(scope="module", autouse=True)
def _slow_sockets_closed() -> Iterator[None]:
    yield
    for sock in _slow_sockets:
        sock.close()


@pytest.fixture(scope="module")
def slow_reader(stack: Any, django_db_blocker: Any) -> str:
    """A tenant of its own whose clients stop reading: a stream it does not read holds one of
    its own slots until the write timeout cuts it, which is its own business."""
    with django_db_blocker.unblock():
        tenant = tenant_create(slug="zorg-slow-reader")
        quota = tenant.quota
        quota.max_concurrency = 1_000
        quota.requests_per_minute = 100_000
        quota.max_tokens_per_request = 8
        quota.save()
        return api_key_issue(tenant=tenant, name="slow").token


@FUZZ
@given(
    kind=st.sampled_from(sorted(SLOW_BODIES)),
    read=st.sampled_from([0, 1, 4096]),
    copies=st.integers(min_value=1, max_value=4),
)
def test_readers_that_stop_reading_hold_no_slot_and_stall_nothing(
    kind: str,
    read: int,
    copies: int,
    slow_reader: str,
    fuzzing: Fuzzing,
    http: httpx.Client,
    encoder: Any,
) -> None:
    """Sockets that ask for an answer and read none, or a little, of it: the frontend goes on
    serving every other tenant (the fuzzing one, whose concurrency is two, too), and holds
    what is unread until its write timeout cuts the connection."""
    path, body = SLOW_BODIES[kind]
    payload = json.dumps(body).encode()
    address = urllib.parse.urlsplit(fuzzing.base_url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Authorization: Bearer {slow_reader}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    for _ in range(copies):
        sock = socket.create_connection((address.hostname, address.port), timeout=DEADLINE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(head + payload)
        if read:
            assert sock.recv(read)  # its answer began
        _slow_sockets.append(sock)
    served = http.post("/v1/chat/completions", json=_chat())
    assert served.status_code == 200, served.text
    assert httpx.get(f"{fuzzing.base_url}/healthz", timeout=DEADLINE).status_code == 200


def test_after_the_fuzzing_the_tenant_is_served_in_full(fuzzing: Fuzzing) -> None:
    """Every slot the fuzzing took came back: the tenant's whole concurrency serves at once."""

    async def both() -> list[int]:
        headers = {"Authorization": f"Bearer {fuzzing.key}"}
        async with httpx.AsyncClient(
            base_url=fuzzing.base_url, headers=headers, timeout=DEADLINE
        ) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=_chat()) for _ in range(CONCURRENCY))
            )
        return [a.status_code for a in answers]

    assert asyncio.run(both()) == [200] * CONCURRENCY
    readiness = httpx.get(f"{fuzzing.base_url}/readyz", timeout=DEADLINE)
    assert readiness.status_code == 200, readiness.text


# Floods of frames and a key revoked while its sockets are open, each on a tenant of its own
# with a few requests a minute, so that its frames are refused soon.
FLOOD_RPM = 3
FLOOD_FRAMES = 400
_tenants = iter(range(1_000_000))
_PAD = json.dumps([0] * 650_000)  # 1.3 MB of values for a frame to carry
FLOOD_KINDS: dict[str, Callable[[int], str | bytes]] = {
    "cancel": lambda i: json.dumps({"type": "cancel", "id": f"c{i}"}),
    "large cancel": lambda i: '{"type":"cancel","id":"c' + str(i) + '","pad":' + _PAD + "}",
    "not json": lambda i: "not json",
    "binary": lambda i: b"\x00\x01",
    "deep": lambda i: "[" * DEEP + "]" * DEEP,
    "bad request": lambda i: _ws_request(json.dumps({"model": ALIAS})),
    "request": lambda i: _ws_request(json.dumps(_chat())).replace('"id":"f"', f'"id":"r{i}"'),
}


def _flooder(blocker: Any, **quota: Any) -> tuple[str, Any]:
    """A tenant of its own, allowed FLOOD_RPM requests a minute: (its key, its ApiKey)."""
    with blocker.unblock():
        tenant = tenant_create(slug=f"zorg-flood-{next(_tenants)}")
        tenant.quota.requests_per_minute = FLOOD_RPM
        tenant.quota.max_tokens_per_request = 8
        for field, value in quota.items():
            setattr(tenant.quota, field, value)
        tenant.quota.save()
        issued = api_key_issue(tenant=tenant, name="flood")
    return issued.token, issued.key


async def _flood(
    url: str, key: str, frames: Iterator[str | bytes]
) -> tuple[list[dict[str, Any]], int | None]:
    """Send every frame at once, reading as they go; return what came back and the close code
    (None: the socket stayed open and quiet for DEADLINE seconds)."""
    answers: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:

        async def send_all() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                for frame in frames:
                    await ws.send(frame)

        sending = asyncio.create_task(send_all())
        try:
            while True:
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), DEADLINE)))
        except TimeoutError:
            return answers, None
        except websockets.ConnectionClosed as closed:
            return answers, closed.rcvd.code if closed.rcvd is not None else None
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)


@settings(max_examples=6, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(kinds=st.lists(st.sampled_from(sorted(FLOOD_KINDS)), min_size=1, max_size=3))
def test_a_frame_flood_counts_every_frame_and_closes_the_socket(
    kinds: list[str], fuzzing: Fuzzing, django_db_blocker: Any
) -> None:
    key, _ = _flooder(django_db_blocker)
    frames = (FLOOD_KINDS[kinds[i % len(kinds)]](i) for i in range(FLOOD_FRAMES))
    url = fuzzing.base_url.replace("http://", "ws://") + "/v1/ws"
    answers, code = asyncio.run(_flood(url, key, frames))
    # More frames waited than a socket holds (sent in one burst, or piling up while refused
    # frames held its reading): it was closed, and what waited was dropped unread.
    assert code == 1008, (kinds, code, answers[-3:])
    started = [a for a in answers if a["type"] == "started"]
    assert len(started) <= FLOOD_RPM, (kinds, started)
    for answer in answers:
        if answer["type"] != "error":
            continue
        error = answer["error"]
        assert error["code"] != "internal_error" and len(error["message"]) <= MAX_MESSAGE, answer
    # Frames count whatever they hold: once they were refused, the tenant's HTTP requests find
    # its bucket used. (A burst may fill the socket's backlog before any frame is refused.)
    if any(a["type"] == "error" and a["error"]["code"] == "rate_limit_exceeded" for a in answers):
        with httpx.Client(base_url=fuzzing.base_url, timeout=DEADLINE) as client:
            refused = client.post(
                "/v1/chat/completions", json=_chat(), headers={"Authorization": f"Bearer {key}"}
            )
        assert refused.status_code == 429, refused.text
    # Another tenant's socket is served in full meanwhile.
    served = asyncio.run(_ws_frames(url, fuzzing.key, [_ws_request(json.dumps(_chat()))]))
    assert served[-1]["type"] == "finished", served


REVOKED_WHILE = ["idle", "streaming", "sending requests", "held for its rate limit"]


@pytest.mark.parametrize("doing", REVOKED_WHILE)
def test_a_key_revoked_while_its_socket_is_open_closes_it_and_runs_nothing_more(
    doing: str, fuzzing: Fuzzing, django_db_blocker: Any
) -> None:
    roomy = doing != "held for its rate limit"
    key, api_key = _flooder(
        django_db_blocker,
        requests_per_minute=100_000 if roomy else 1,
        max_tokens_per_request=1000,
    )
    url = fuzzing.base_url.replace("http://", "ws://") + "/v1/ws"

    def revoke() -> None:
        with django_db_blocker.unblock():
            api_key_revoke(key=api_key)

    async def scenario() -> tuple[list[dict[str, Any]], int, str, set[str]]:
        headers = {"Authorization": f"Bearer {key}"}
        seen: list[dict[str, Any]] = []
        after: set[str] = set()  # request ids sent once HTTP refused the key
        async with websockets.connect(url, additional_headers=headers) as ws:
            if doing == "streaming":
                body = {**_chat(), "max_tokens": 1000, "ignore_eos": True}
                await ws.send(_ws_request(json.dumps(body)).replace('"id":"f"', '"id":"long"'))
                while not seen or seen[-1]["type"] != "started":
                    seen.append(json.loads(await asyncio.wait_for(ws.recv(), DEADLINE)))
            if doing == "held for its rate limit":
                for _ in range(3):  # one admitted, then refused, and the socket's reading held
                    await ws.send(json.dumps({"type": "cancel", "id": "x"}))
            await asyncio.to_thread(revoke)
            async with httpx.AsyncClient(base_url=fuzzing.base_url, timeout=DEADLINE) as http:
                while True:
                    answer = await http.post("/v1/chat/completions", json=_chat(), headers=headers)
                    if answer.status_code == 401:
                        break
                    await asyncio.sleep(0.05)
            try:
                if doing == "sending requests":
                    for i in range(20):
                        after.add(f"a{i}")
                        frame = _ws_request(json.dumps(_chat())).replace('"id":"f"', f'"id":"a{i}"')
                        await ws.send(frame)
                while True:
                    seen.append(json.loads(await asyncio.wait_for(ws.recv(), DEADLINE)))
            except websockets.ConnectionClosed as closed:
                assert closed.rcvd is not None
                return seen, closed.rcvd.code, closed.rcvd.reason, after

    seen, code, reason, after = asyncio.run(scenario())
    assert (code, reason) == (4401, "revoked_api_key"), seen[-3:]
    assert not [m for m in seen if m["type"] == "started" and m["id"] in after], seen
    ends = [m for m in seen if m.get("id") == "long" and m["type"] in ("finished", "error")]
    if doing == "streaming":  # its request ended once, cancelled with the reason
        assert len(ends) == 1 and ends[0]["error"]["code"] == "revoked_api_key", seen
