"""The data plane's handler sends a whole answer with its length, as vLLM's server does."""

from __future__ import annotations

from collections.abc import AsyncIterator

from django.http import HttpResponse, StreamingHttpResponse

from inference.edge.asgi import ApiHandler


async def _start_headers(response: HttpResponse | StreamingHttpResponse) -> dict[bytes, bytes]:
    messages: list[dict] = []

    async def send(message: dict) -> None:
        messages.append(message)

    await ApiHandler().send_response(response, send)
    assert messages[0]["type"] == "http.response.start"
    return {name.lower(): value for name, value in messages[0]["headers"]}


async def test_a_whole_answer_says_its_length():
    headers = await _start_headers(HttpResponse(b'{"ok": true}', content_type="application/json"))
    assert headers[b"content-length"] == b"12"


async def test_an_answer_that_says_its_length_keeps_it():
    response = HttpResponse(b"abc")
    response["Content-Length"] = "3"
    headers = await _start_headers(response)
    assert headers[b"content-length"] == b"3"


async def test_an_answer_without_a_body_and_a_stream_say_no_length():
    assert b"content-length" not in await _start_headers(HttpResponse(status=204))

    async def parts() -> AsyncIterator[bytes]:
        yield b"a"

    assert b"content-length" not in await _start_headers(StreamingHttpResponse(parts()))
