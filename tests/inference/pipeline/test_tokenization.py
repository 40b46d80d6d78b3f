"""The frontend's chat templating: the rendered template's tokens, and a clear error."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inference.base.errors import ApiError
from inference.pipeline import tokenization
from inference.pipeline.tokenization import Tokenizer, tokenizer_for, tokenizer_of, tokenizer_ready
from models_registry import tokenizer as registry
from models_registry.demo_model import demo_model_build
from models_registry.tokenizer import (
    ChatTemplateMissing,
    ChatTemplateRejected,
    TokenizerUnavailable,
)


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


def test_the_registry_tokenizer_refuses_with_plain_errors_the_api_maps(model_dir, tmp_path):
    """The registry's tokenizer knows no HTTP; the frontend's turns its refusals into 400s."""
    strict = "{{ raise_exception('system first') }}"
    directory = _with_template(model_dir, tmp_path / "strict", strict)
    with pytest.raises(ChatTemplateRejected, match="system first") as caught:
        registry.Tokenizer(directory).encode_chat([{"role": "user", "content": "hi"}])
    assert not isinstance(caught.value, ApiError)

    bare = _with_template(model_dir, tmp_path / "bare", "")
    with pytest.raises(ChatTemplateMissing):
        registry.Tokenizer(bare).render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ApiError) as refused:
        Tokenizer(bare).render_chat([{"role": "user", "content": "hi"}])
    assert (refused.value.status, refused.value.code, refused.value.param) == (
        400,
        "chat_template_missing",
        "model",
    )


def test_a_tokenizer_that_cannot_load_is_a_503_to_retry(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(TokenizerUnavailable):
        registry.tokenizer_for(digest="0" * 64, directory=missing, kind=registry.Tokenizer)
    with pytest.raises(ApiError) as caught:
        tokenizer_for(digest="0" * 64, directory=missing)
    assert (caught.value.status, caught.value.code) == (503, "tokenizer_unavailable")
    assert caught.value.retry_after == 30


def test_the_frontend_and_the_registry_cache_a_version_once_each(model_dir):
    digest = "f" * 64
    api = tokenizer_for(digest=digest, directory=model_dir)
    assert isinstance(api, Tokenizer)
    assert tokenizer_for(digest=digest, directory=model_dir) is api
    plain = registry.tokenizer_for(digest=digest, directory=model_dir, kind=registry.Tokenizer)
    assert type(plain) is registry.Tokenizer
    assert plain.encode_text("hello") == api.encode_text("hello")


def test_a_version_is_ready_once_this_process_loaded_its_tokenizer(model_dir):
    """Until then a request to it tokenises off the event loop: the load takes seconds."""
    digest = "e" * 64
    route = SimpleNamespace(version_digest=digest, artifact_dir=model_dir)
    assert not tokenizer_ready(route)  # type: ignore[arg-type]  # the two fields it reads
    tokenizer_for(digest=digest, directory=model_dir)
    assert tokenizer_ready(route)  # type: ignore[arg-type]
    # The registry's own kind is a load of its own.
    assert not registry.tokenizer_loaded(digest=digest, kind=registry.Tokenizer)


async def test_a_request_loads_a_tokenizer_in_a_thread_the_first_time_only(model_dir, monkeypatch):
    """The load takes seconds: on the event loop it would pause every stream of the frontend."""
    route = SimpleNamespace(version_digest="d" * 64, artifact_dir=model_dir)
    loaded_on: list[int] = []
    load = tokenization.tokenizer_for

    def watched(**kwargs: Any) -> Tokenizer:
        loaded_on.append(threading.get_ident())
        return load(**kwargs)

    monkeypatch.setattr(tokenization, "tokenizer_for", watched)
    first = await tokenizer_of(route)  # type: ignore[arg-type]  # the two fields it reads
    again = await tokenizer_of(route)  # type: ignore[arg-type]
    assert again is first
    loop_thread = threading.get_ident()
    assert loaded_on[0] != loop_thread and loaded_on[1] == loop_thread


@pytest.mark.parametrize("side", ["left", "right"])
def test_an_unnamed_truncation_cuts_as_the_tokenizer_does_and_keeps_the_bos(model_dir, side):
    """vLLM hands the tokenizer `truncation=True` when no side is named (its side: the left on
    generation): the text's tokens are cut and the special tokens stay. A named side cuts the
    whole sequence, BOS included."""
    from transformers import AutoTokenizer

    from inference.pipeline.tokenization import Truncation

    tokenizer = Tokenizer(model_dir)
    text = "def main(args): return sorted(args, key=len)"
    hf = AutoTokenizer.from_pretrained(str(model_dir), truncation_side=side)
    expected = hf.encode(text, add_special_tokens=True, truncation=True, max_length=4)
    cut = Truncation(4, side, named=False).text(tokenizer, text, special=True, context=2048)
    assert cut == expected and cut[0] == hf.bos_token_id
    whole = tokenizer.encode_with(text, add_special_tokens=True)
    named = Truncation(4, side).text(tokenizer, text, special=True, context=2048)
    assert named == (whole[-4:] if side == "left" else whole[:4])


def test_a_text_far_past_the_context_is_cut_before_it_is_tokenised(model_dir):
    """Only the kept end of a text certainly longer than the context is tokenised; the tokens
    kept are the same."""
    from inference.pipeline.tokenization import Truncation

    tokenizer = Tokenizer(model_dir)
    text = "import os\nimport sys\n" * 2000
    whole = tokenizer.encode_text(text)
    cut = Truncation(30, "left").text(tokenizer, text, special=False, context=64)
    assert cut == whole[-30:]
    assert tokenizer.max_token_chars and len(text) > 64 * tokenizer.max_token_chars  # trimmed


def test_truncation_keeps_at_most_the_context():
    from inference.pipeline.tokenization import kept_tokens

    assert kept_tokens(None, 2048, generation=True) is None
    assert kept_tokens(-1, 2048, generation=True) == 2047  # one token left for the output
    assert kept_tokens(-1, 512, generation=False) == 512
    assert kept_tokens(2048, 2048, generation=True) == 2048
    for wrong in (2049, 0):
        with pytest.raises(ApiError) as refused:
            kept_tokens(wrong, 2048, generation=True)
        assert refused.value.param == "truncate_prompt_tokens"


def _oldest_dropped(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Truncation as it was written first: drop the oldest turn, one at a time."""
    head = 1 if messages and messages[0]["role"] == "system" else 0
    rest = messages[head:]
    if len(rest) <= 1:
        return None
    rest = rest[1:]
    while len(rest) > 1 and rest[0]["role"] == "tool":
        rest = rest[1:]
    return messages[:head] + rest


def _conversation(rng: random.Random, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": "Be brief."})
    for i in range(turns):
        role = rng.choice(["user", "assistant", "tool", "user"])
        words = " ".join(f"w{rng.randrange(1000)}" for _ in range(rng.choice([0, 1, 5, 40, 300])))
        if role == "tool":
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": words})
        else:
            messages.append({"role": role, "content": words})
    messages.append({"role": "user", "content": "and now?"})
    return messages


@pytest.mark.parametrize("seed", range(16))
def test_truncation_keeps_what_dropping_one_turn_at_a_time_keeps_in_a_log_number_of_renders(
    model_dir, monkeypatch, seed
):
    """The search finds the cut the first, linear truncation found (it dropped one turn and
    rendered the rest again, as many times as turns went), in renders that grow with the log of
    the turns: quadratic work became n log n at most."""
    from inference.body.parser import generation_parse

    rng = random.Random(seed)
    route = SimpleNamespace(version_digest=f"fit-{model_dir}", artifact_dir=model_dir)
    messages = _conversation(rng, rng.choice([1, 3, 30, 200]))
    request = generation_parse(
        {"model": "m", "messages": messages, "max_tokens": rng.choice([1, 16, 200])},
        endpoint="chat.completions",
    )
    context = rng.choice([64, 256, 1024, 2048])

    def fits(candidate: Any) -> bool:
        try:
            prompts, _ = tokenization.prompts_read(candidate, route, context=context)  # type: ignore[arg-type]
        except ApiError as exc:
            assert exc.code == "context_length_exceeded"
            return False
        return len(prompts[0]) + candidate.max_tokens <= context

    expected = request.messages or []
    while not fits(dataclasses.replace(request, messages=expected)):
        shorter = _oldest_dropped(expected)
        if shorter is None:
            break
        expected = shorter
    renders = [0]
    read = tokenization.prompts_read

    def counted(*args: Any, **kwargs: Any) -> Any:
        renders[0] += 1
        return read(*args, **kwargs)

    monkeypatch.setattr(tokenization, "prompts_read", counted)
    fitted = tokenization.turns_fitted(request, route, context=context, seconds=60)  # type: ignore[arg-type]
    assert fitted.messages == expected
    turns = len(tokenization.turn_starts(messages))
    assert renders[0] <= 2 * math.log2(turns) + 3


def test_a_truncation_search_past_its_time_is_a_400_naming_truncation(model_dir, monkeypatch):
    from inference.body.parser import generation_parse

    route = SimpleNamespace(version_digest=f"slow-{model_dir}", artifact_dir=model_dir)
    messages = [{"role": "user", "content": "word " * 400}] * 50
    request = generation_parse({"model": "m", "messages": messages}, endpoint="chat.completions")
    with pytest.raises(ApiError) as refused:
        tokenization.turns_fitted(request, route, context=64, seconds=0)  # type: ignore[arg-type]
    assert refused.value.status == 400 and refused.value.param == "truncation"
    assert refused.value.code == "prompt_too_complex"


def test_a_text_is_tokenised_as_a_single_encode_would_tokenise_it(model_dir):
    """Texts go through the tokenizer's batch call, which lets go of the interpreter while it
    works (a single encode holds it, and froze the event loop beside a long prompt): the ids
    are the same, special tokens or not."""
    tokenizer = Tokenizer(model_dir)
    rng = random.Random(7)
    texts = ["", " ", "<s>hi</s>", "def f():\n    return 'é😀\x00'\n" * 40]
    texts += ["".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(200)) for _ in range(50)]
    for text in texts:
        for special in (False, True):
            single = tokenizer._fast.encode(text, add_special_tokens=special).ids
            assert tokenizer.encode_ids(text, add_special_tokens=special) == single
    assert tokenizer.encode_inputs(texts) == [tokenizer._fast.encode(t).ids for t in texts]
