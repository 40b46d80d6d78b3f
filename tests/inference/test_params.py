from __future__ import annotations

import pytest

from inference.errors import ApiError
from inference.params import CHAT, COMPLETIONS, body_parse, generation_parse


def _chat(**fields):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _error(body, endpoint=CHAT) -> ApiError:
    with pytest.raises(ApiError) as caught:
        generation_parse(body, endpoint=endpoint)
    return caught.value


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"\xff\xfe"])
def test_it_rejects_bodies_that_are_not_a_json_object(raw):
    with pytest.raises(ApiError) as caught:
        body_parse(raw)
    assert caught.value.status == 400 and caught.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "hot"),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("stream", "yes"),
        ("top_p", [1]),
        ("seed", "1"),
        ("stop", 5),
        ("messages", "hello"),
        ("model", 7),
    ],
)
def test_it_names_a_field_of_the_wrong_type(field, value):
    error = _error(_chat(**{field: value}))
    assert error.status == 400 and error.param == field and error.code == "invalid_type"


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 3), ("top_p", -0.1), ("top_p", 0), ("max_tokens", 0), ("presence_penalty", 9)],
)
def test_it_names_a_field_out_of_range(field, value):
    error = _error(_chat(**{field: value}))
    assert error.param == field and error.code == "invalid_value"


def test_it_requires_model_and_messages():
    assert _error({"messages": []}).param == "model"
    assert _error({"model": "m"}).param == "messages"
    assert _error({"model": "m", "messages": []}).param == "messages"


def test_it_names_the_bad_message():
    error = _error(_chat(messages=[{"role": "user", "content": "a"}, {"role": "robot"}]))
    assert error.param == "messages[1].role"


def test_it_refuses_unsupported_parameters():
    assert _error(_chat(n=2)).code == "unsupported_parameter"
    assert _error(_chat(logprobs=True)).param == "logprobs"


def test_stream_options_need_stream():
    assert _error(_chat(stream_options={"include_usage": True})).param == "stream_options"


def test_it_accepts_a_full_chat_request():
    parsed = generation_parse(
        _chat(
            max_tokens=10,
            temperature=0.5,
            stop="\n",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        ),
        endpoint=CHAT,
    )
    assert parsed.max_tokens == 10 and parsed.stop == ["\n"] and parsed.include_usage
    assert parsed.messages == [{"role": "user", "content": "hi"}]


def test_completions_take_text_or_token_ids():
    assert generation_parse({"model": "m", "prompt": "x"}, endpoint=COMPLETIONS).prompt == "x"
    by_ids = generation_parse({"model": "m", "prompt": [1, 2]}, endpoint=COMPLETIONS)
    assert by_ids.prompt == [1, 2]
    error = _error({"model": "m", "prompt": ["a", "b"]}, endpoint=COMPLETIONS)
    assert error.param == "prompt"
    nested = generation_parse({"model": "m", "prompt": [[1, 2]]}, endpoint=COMPLETIONS)
    assert nested.prompt == [1, 2]
    assert _error({"model": "m", "prompt": [["a"]]}, endpoint=COMPLETIONS).param == "prompt"
