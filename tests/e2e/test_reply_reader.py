"""One client's malformed resume cannot stop a frontend relaying everyone else's replies."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.conftest import ALIAS

# Twenty digits each side, as ids this API sends have at most, but past 64 bits: Redis
# refuses it as a stream id.
REFUSED_BY_REDIS = "99999999999999999999-99999999999999999999"


def _streamed_text(response: httpx.Response) -> str:
    """Read a chat completion's SSE stream to its [DONE]; return its text."""
    text, done = [], False
    for line in response.iter_lines():
        if line == "data: [DONE]":
            done = True
            break
        if line.startswith("data: "):
            chunk: dict[str, Any] = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("choices"):
                text.append(chunk["choices"][0]["delta"].get("content") or "")
    assert done, "the stream ended without [DONE]"
    return "".join(text)


def test_a_resume_from_an_id_redis_refuses_leaves_every_tenants_replies_flowing(stack, world):
    acme = {"Authorization": f"Bearer {world.acme_key}"}
    globex = {"Authorization": f"Bearer {world.globex_key}"}
    long_story = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Tell a long story"}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    short = {"model": ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    # Before the fix each of these waited for its reply until the request timeout: the
    # frontend's reader of the deployment's reply streams had died.
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        with client.stream(
            "POST", "/v1/chat/completions", json=long_story, headers=acme
        ) as running:
            assert running.status_code == 200
            rid = running.headers["x-request-id"]
            resumed = client.get(
                f"/v1/requests/{rid}/stream", headers={**acme, "Last-Event-ID": REFUSED_BY_REDIS}
            )
            assert resumed.status_code == 400, resumed.text
            error = resumed.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_value", "Last-Event-ID")
            assert _streamed_text(running)

        answered = client.post("/v1/chat/completions", json=short, headers=globex)
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"]
        with client.stream(
            "POST", "/v1/chat/completions", json={**short, "stream": True}, headers=globex
        ) as streamed:
            assert streamed.status_code == 200
            assert _streamed_text(streamed)

        assert client.get("/readyz").status_code == 200
