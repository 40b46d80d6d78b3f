"""What a client sends over `/v1/ws`: its key at the handshake, and each frame read, checked
and parsed (docs/websocket.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from config.json_body import BodyProblem, json_check, json_load
from inference.base.errors import ApiError
from inference.body.fields import CHAT, COMPLETIONS
from inference.body.parser import body_problem
from inference.pipeline.preprocessing import preprocessed

KEY_PROTOCOL = "roundhouse.key."


MAX_ID_CHARS = 128


ENDPOINTS = {"chat.completions": CHAT, "completions": COMPLETIONS}


# A larger frame is parsed off the event loop: checking a frame's values takes about 1 ms per
# 64 KiB at worst (a long array of small numbers), a 1.3 MB one 25 ms.
INLINE_PARSE_CHARS = 64 * 1024


FRAME_BYTES = "roundhouse.frame_bytes"  # in a received frame's message: its size, once known


CLOSE_TOO_BIG = 1009  # a frame over the limit (RFC 6455: message too big)


CLOSE_FLOODED = 1008  # too many frames waiting unread (RFC 6455: policy violation)


def _client_id(message: dict[str, Any]) -> str | None:
    """Return a frame's `id` if it is one an error frame can carry back, else None."""
    value = message.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        return None
    try:
        json_check(value)
    except BodyProblem:
        return None
    return value


def scope_header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def key_offered(scope: dict[str, Any]) -> tuple[str | None, str | None]:
    """Return (Authorization header, the key subprotocol to echo) from a connection scope."""
    header = scope_header(scope, b"authorization")
    if header is not None:
        return header, None
    for protocol in scope.get("subprotocols", []):
        if protocol.startswith(KEY_PROTOCOL):
            return f"Bearer {protocol[len(KEY_PROTOCOL) :]}", protocol
    return None, None


class Unreadable(Exception):
    """A frame that cannot be handled, the error it gets and the id it named, if one."""

    def __init__(self, error: ApiError, client_id: str | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.client_id = client_id


def frame_read(text: str) -> tuple[str, dict[str, Any]]:
    """Return a frame's id and message, or raise Unreadable saying why it cannot be used.

    A frame meets the limits of every JSON body (config.json_body), so that nothing past
    this point meets a lone surrogate or a stack-deep value.
    """
    try:
        message = json_load(text, what="The frame")
    except BodyProblem as problem:
        raise Unreadable(body_problem(problem)) from None
    if not isinstance(message, dict):
        raise Unreadable(ApiError(400, "invalid_message", "Send a JSON object."))
    client_id = _client_id(message)
    if client_id is None:
        raise Unreadable(
            ApiError(
                400,
                "invalid_id",
                f"Every message needs a string 'id' of 1 to {MAX_ID_CHARS} characters.",
                param="id",
            )
        )
    try:
        json_check(message)
    except BodyProblem as problem:
        raise Unreadable(body_problem(problem), client_id) from None
    return client_id, message


async def frame_parse(text: str, *, tenant_id: int) -> tuple[str, dict[str, Any]]:
    """Read a frame as `frame_read` does; a large one off the event loop, in its tenant's
    turn of the preprocessing threads (as an HTTP body is)."""
    if len(text) <= INLINE_PARSE_CHARS:
        return frame_read(text)
    return await preprocessed(tenant_id, frame_read, text)


def frame_bytes(message: dict[str, Any]) -> int:
    """The size of a received frame in bytes, as its client sent it (UTF-8)."""
    text = message.get("text")
    if text is None:
        return len(message.get("bytes") or b"")
    if text.isascii() or len(text) > settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES:
        return len(text)  # a character is a byte, or it is over the limit anyway
    return len(text.encode("utf-8", "surrogatepass"))
