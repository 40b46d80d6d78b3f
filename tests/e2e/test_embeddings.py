"""`/v1/embeddings` end to end: all-MiniLM-L6-v2 on an encoder worker with a dynamic batcher."""

from __future__ import annotations

import base64
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import msgspec
import numpy as np
import openai
import psutil
import pytest

from tests.conftest import ALIAS, Process, roomy_key
from tests.conftest import ENCODER as MODEL
from tests.conftest import ENCODER_PRICE_PER_1K as PRICE_PER_1K


@pytest.fixture
def sdk(stack: Any, world: Any, encoder: Process) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)


def _embed(stack: Any, key: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}/v1/embeddings",
        json={"model": MODEL, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def test_the_sdk_embeds_and_paraphrases_are_closer_than_unrelated_sentences(sdk, world, usage_of):
    sentences = [
        "A man is playing a guitar.",
        "Someone is strumming a guitar.",
        "The central bank raised interest rates again.",
    ]
    reply = sdk.embeddings.create(model=MODEL, input=sentences)
    vectors = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > 0.6
    assert similarity[0, 1] > similarity[0, 2] + 0.4
    assert similarity[1, 2] < 0.3
    assert reply.model.startswith("all-minilm-l6-v2@")
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 3 * 3
    # Billed like any request: one usage record, input tokens at the version's price.
    response = sdk.embeddings.with_raw_response.create(model=MODEL, input="billing check")
    request_id = response.headers["x-request-id"]
    tokens = response.parse().usage.prompt_tokens
    (record,) = usage_of(request_id)
    assert record.endpoint == "embeddings"
    assert record.status == "ok"
    assert (record.prompt_tokens, record.completion_tokens) == (tokens, 0)
    assert record.cost == PRICE_PER_1K * tokens / 1000


def test_inputs_of_mixed_lengths_batched_together_get_the_vectors_they_get_alone(stack, sdk):
    short = "Tea."
    medium = "The ferry leaves the harbour at seven every morning in summer."
    long = " ".join(["Freight trains are sorted in the yard by gravity and switches."] * 8)
    alone = {
        text: np.array(sdk.embeddings.create(model=MODEL, input=text).data[0].embedding)
        for text in (short, medium, long)
    }
    texts = [short, long, medium, short, long, medium] * 4

    def one(i: int) -> list[list[float]]:
        # Concurrent requests, each mixing lengths, so batches mix requests and lengths.
        mixed = texts[i % 6 :] + texts[: i % 6]
        return [d.embedding for d in sdk.embeddings.create(model=MODEL, input=mixed).data]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for i, vectors in enumerate(results):
        mixed = texts[i % 6 :] + texts[: i % 6]
        for text, vector in zip(mixed, vectors, strict=True):
            assert np.dot(alone[text], np.array(vector)) > 0.995, text


def test_base64_vectors_decode_to_the_float_ones(stack, world, encoder):
    answered = _embed(stack, world.acme_key, input=["round trip"])
    floats = answered.json()
    # OpenAI's shape, with the id and time vLLM's server adds; the id names the request.
    assert floats["id"] == f"embd-{answered.headers['x-request-id']}"
    assert isinstance(floats["created"], int) and floats["object"] == "list"
    packed = _embed(stack, world.acme_key, input=["round trip"], encoding_format="base64").json()
    encoded = packed["data"][0]["embedding"]
    assert isinstance(encoded, str)
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    assert np.allclose(decoded, floats["data"][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize(
    ("embed_dtype", "endianness", "layout", "atol"),
    [("float16", "big", ">f2", 1e-3), ("float32", "little", "<f4", 1e-6)],
)
def test_base64_vectors_come_in_the_number_type_and_byte_order_asked_for(
    stack, world, encoder, embed_dtype, endianness, layout, atol
):
    floats = _embed(stack, world.acme_key, input=["round trip"]).json()
    packed = _embed(
        stack,
        world.acme_key,
        input=["round trip"],
        encoding_format="base64",
        embed_dtype=embed_dtype,
        endianness=endianness,
    )
    assert packed.status_code == 200, packed.text
    decoded = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), layout)
    assert np.allclose(decoded, floats["data"][0]["embedding"], atol=atol)


def test_vectors_asked_for_as_pooled_are_not_normalised(stack, world, encoder):
    """vLLM's `use_activation: false`: the mean-pooled vector, before the model's last step
    (all-MiniLM-L6-v2 normalises to unit length); in a batch with normalised ones."""
    text = ["a vector as pooled"]
    with ThreadPoolExecutor(2) as pool:
        unit, pooled = pool.map(
            lambda extra: _embed(stack, world.acme_key, input=text, **extra),
            [{}, {"use_activation": False}],
        )
    assert pooled.status_code == 200, pooled.text
    raw = np.array(pooled.json()["data"][0]["embedding"])
    normalised = np.array(unit.json()["data"][0]["embedding"])
    assert abs(np.linalg.norm(normalised) - 1.0) < 1e-5
    assert abs(np.linalg.norm(raw) - 1.0) > 0.01
    assert np.allclose(raw / np.linalg.norm(raw), normalised, atol=1e-5)


def test_vllms_bytes_answer_carries_the_vectors_and_where_each_lies(stack, world, encoder):
    texts = ["first of two", "the second"]
    floats = _embed(stack, world.acme_key, input=texts).json()
    binary = _embed(stack, world.acme_key, input=texts, encoding_format="bytes",
                    embed_dtype="float16")  # fmt: skip
    assert binary.status_code == 200, binary.text
    assert binary.headers["content-type"] == "application/octet-stream"
    metadata = json.loads(binary.headers["metadata"])
    assert (metadata["model"], metadata["usage"]) == (floats["model"], floats["usage"])
    assert [item["shape"] for item in metadata["data"]] == [[384], [384]]
    for item, expected in zip(metadata["data"], floats["data"], strict=True):
        assert (item["embed_dtype"], item["endianness"]) == ("float16", "native")
        vector = np.frombuffer(binary.content[item["start"] : item["end"]], np.float16)
        assert np.allclose(vector, expected["embedding"], atol=1e-3)
    only = _embed(stack, world.acme_key, input=texts, encoding_format="bytes_only")
    assert only.status_code == 200 and "metadata" not in only.headers
    assert np.allclose(np.frombuffer(only.content, np.float32).reshape(2, 384),
                       [d["embedding"] for d in floats["data"]], atol=1e-6)  # fmt: skip


def test_token_id_inputs_are_accepted(stack, world, encoder):
    reply = _embed(stack, world.acme_key, input=[[101, 7592, 2088, 102], [101, 102]])
    assert reply.status_code == 200, reply.text
    assert [d["index"] for d in reply.json()["data"]] == [0, 1]
    assert reply.json()["usage"]["prompt_tokens"] == 6


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": ""}, 400, "invalid_value", "input[0]"),
        ({"input": ["fine", "  "]}, 400, "invalid_value", "input[1]"),
        ({"input": []}, 400, "invalid_value", "input"),
        ({"input": [[]]}, 400, "invalid_value", "input[0]"),
        ({"input": ["ok", "word " * 400]}, 400, "context_length_exceeded", "input[1]"),
        ({"input": [[101, 99999999]]}, 400, "invalid_value", "input[0]"),
        ({"input": 5}, 400, "invalid_type", "input"),
        ({}, 400, "missing_required_parameter", "input"),
        ({"input": "x", "encoding_format": "int8"}, 400, "invalid_value", "encoding_format"),
        ({"input": "x", "dimensions": 128}, 400, "invalid_value", "dimensions"),
        ({"input": "x", "embed_dtype": "int8"}, 400, "invalid_value", "embed_dtype"),
        ({"input": "x", "endianness": 1}, 400, "invalid_type", "endianness"),
        ({"input": "x", "use_activation": "no"}, 400, "invalid_type", "use_activation"),
        ({"input": "x", "model": ALIAS}, 400, "wrong_endpoint_for_model", "model"),
        ({"input": "x", "model": "no-such-encoder"}, 404, "model_not_found", "model"),
    ],
)
def test_bad_input_is_a_clear_error_naming_the_field(
    stack, world, encoder, body, status, code, param
):
    reply = _embed(stack, world.acme_key, **body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


def test_native_dimensions_may_be_asked_for(stack, world, encoder):
    reply = _embed(stack, world.acme_key, input="x", dimensions=384)
    assert reply.status_code == 200
    assert len(reply.json()["data"][0]["embedding"]) == 384


def test_an_embedding_model_is_refused_on_the_chat_endpoint(stack, world, encoder):
    reply = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "wrong_endpoint_for_model"


def test_embeddings_need_a_valid_key_and_count_against_quotas(stack, world, encoder):
    assert _embed(stack, "sk-nope", input="x").status_code == 401
    limited = world.limited_keys["wayne"]  # 5 requests a minute
    codes = [_embed(stack, limited, input="quota").status_code for _ in range(7)]
    assert codes.count(200) <= 5
    assert 429 in codes


def test_a_truncated_input_keeps_its_first_tokens_between_cls_and_sep(stack, world, encoder):
    """vLLM's truncate_prompt_tokens on an encoder: an input too long for the model is cut to
    its first tokens, the tokenizer's CLS and SEP kept around them (BERT's [101] ... [102]),
    and embeds as those ids sent alone do; a left cut keeps the last tokens, -1 the most the
    model takes, and more than that is a 400 naming the field."""
    from transformers import AutoTokenizer

    from models_registry.packaged import minilm_dir

    words = "the quick brown fox jumps over the lazy dog " * 200  # ~1,800 tokens: too long
    ids = AutoTokenizer.from_pretrained(str(minilm_dir())).encode(words)
    cut = _embed(stack, world.acme_key, input=words, truncate_prompt_tokens=8)
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 8
    alone = _embed(stack, world.acme_key, input=[[*ids[:7], ids[-1]]])
    assert alone.status_code == 200, alone.text
    np.testing.assert_allclose(
        cut.json()["data"][0]["embedding"], alone.json()["data"][0]["embedding"], atol=1e-5
    )
    left = _embed(
        stack, world.acme_key, input=words, truncate_prompt_tokens=8, truncation_side="left"
    )
    assert left.status_code == 200, left.text
    tail = _embed(stack, world.acme_key, input=[ids[-8:]])
    np.testing.assert_allclose(
        left.json()["data"][0]["embedding"], tail.json()["data"][0]["embedding"], atol=1e-5
    )
    most = _embed(stack, world.acme_key, input=words, truncate_prompt_tokens=-1)
    assert most.status_code == 200, most.text
    context = most.json()["usage"]["prompt_tokens"]
    assert 8 < context < len(ids)
    over = _embed(stack, world.acme_key, input=words, truncate_prompt_tokens=context + 1)
    assert over.status_code == 400, over.text
    assert over.json()["error"]["param"] == "truncate_prompt_tokens"


# The most inputs a request takes, each two tokens: 2,048 vectors of 384 floats, about 16 MB of
# JSON from a 20 KB request (3 MB of vectors).
LARGE = json.dumps({"model": MODEL, "input": [[101, 102]] * 2048}).encode()


@pytest.fixture(scope="module")
def roomy(world: Any, django_db_blocker: Any) -> str:
    with django_db_blocker.unblock():
        return roomy_key("embeddings-large")


def _asked(stack: Any, key: str, body: bytes, *, window: int | None = None) -> socket.socket:
    """A socket that has sent an embeddings request (with a small receive window, if given)."""
    sock = socket.socket()
    if window is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)  # before connect
    sock.connect(("127.0.0.1", int(stack.base_url.rsplit(":", 1)[1])))
    sock.sendall(
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    sock.settimeout(300)
    return sock


def _chunks(sock: socket.socket) -> tuple[bytes, list[bytes]]:
    """Read a chunked answer whole: its head and its body's chunks as the server sent them."""
    stream = sock.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += stream.readline()
    assert b"transfer-encoding: chunked" in head.lower(), head
    chunks = []
    while size := int(stream.readline().strip(), 16):
        chunks.append(stream.read(size))
        stream.readline()
    return head, chunks


def test_a_large_answer_comes_in_pieces_that_make_the_whole_json(stack, encoder, roomy):
    """Encoded a slice of vectors at a time as the client reads, byte for byte the answer
    encoded at once (compact, in the order vLLM's fields come)."""
    with _asked(stack, roomy, LARGE) as sock:
        head, chunks = _chunks(sock)
    assert head.startswith(b"HTTP/1.1 200"), head
    body = b"".join(chunks)
    answer = msgspec.json.decode(body)
    assert len(answer["data"]) == 2048
    assert [item["index"] for item in answer["data"]] == list(range(2048))
    assert len(answer["data"][-1]["embedding"]) == 384
    assert msgspec.json.encode(answer) == body
    assert len(chunks) > len(body) // (64 * 1024)
    assert max(len(chunk) for chunk in chunks) <= 64 * 1024


def _read_whole(stack: Any, key: str) -> bytes:
    with _asked(stack, key, LARGE) as sock:
        return b"".join(_chunks(sock)[1])


def test_slow_readers_of_large_answers_hold_a_piece_each_not_the_answer(stack, encoder, roomy):
    """Four clients that read no more than the head of a 16 MB answer: the frontend holds
    their vectors and a piece each (about 3 MB), not their answers (16 MB each, as it did)."""
    frontend = psutil.Process(stack.frontend.popen.pid)
    readers = 4
    whole = len(_read_whole(stack, roomy))  # what serving one costs once is not counted below
    before = frontend.memory_info().rss
    held = 0
    sockets: list[socket.socket] = []
    try:
        for _ in range(readers):
            sockets.append(_asked(stack, roomy, LARGE, window=4096))
            assert sockets[-1].recv(4096).startswith(b"HTTP/1.1 200")  # its answer has begun
        for _ in range(10):  # the frontend writes on until each connection's buffers are full
            time.sleep(0.1)
            held = max(held, frontend.memory_info().rss - before)
    finally:
        for sock in sockets:
            sock.close()
    # Each holds about a fifth of its answer (its vectors), where it held all of it.
    assert held < readers * whole / 2, (held, whole)
