"""The frontend's chat templating: the rendered template's tokens, and a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inference.errors import ApiError
from inference.tokenization import Tokenizer
from models_registry.demo_model import demo_model_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model_build(out_dir=tmp_path_factory.mktemp("tok") / "model")


CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another, in Ελληνικά: {{ not a template }} <b>"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_a_chat_is_its_rendered_template_with_no_special_tokens_added(model_dir, messages):
    """The template writes the special tokens itself; encoding must not add a second BOS."""
    tokenizer = Tokenizer(model_dir)
    expected = tokenizer._hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.encode_chat(messages) == tokenizer.encode_text(expected)


def _with_template(model_dir: Path, target: Path, template: str) -> Path:
    shutil.copytree(model_dir, target)
    jinja = target / "chat_template.jinja"
    if jinja.exists():
        jinja.write_text(template)
    else:
        config_path = target / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = template
        config_path.write_text(json.dumps(config))
    return target


def test_messages_a_template_refuses_are_a_400_naming_messages(model_dir, tmp_path):
    strict = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    )
    tokenizer = Tokenizer(_with_template(model_dir, tmp_path / "strict", strict))
    with pytest.raises(ApiError) as caught:
        tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert caught.value.status == 400
    assert caught.value.param == "messages"
    assert "system first" in caught.value.message
    assert tokenizer.encode_chat([{"role": "system", "content": "x"}]) == []
