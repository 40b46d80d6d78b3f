"""The demo model's training data: seeded, in its own template, answers that follow the schema."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest

from models_registry.demo_conversations import Conversation, conversations_generate
from models_registry.demo_model import (
    IM_END_TOKEN,
    _corpus_paths,
    _train_tokenizer,
    _wrap_tokenizer,
)
from models_registry.demo_training import IGNORE, examples_render, whitespace_ids

COUNT = 400


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return _wrap_tokenizer(_train_tokenizer(_corpus_paths()))


@pytest.fixture(scope="module")
def conversations() -> list[Conversation]:
    return conversations_generate(count=COUNT, seed=0)


def _parameters(conversation: Conversation, name: str) -> dict[str, Any]:
    [tool] = [t for t in conversation.tools or [] if t["function"]["name"] == name]
    return tool["function"]["parameters"]


def test_it_draws_the_same_conversations_from_the_same_seed(conversations):
    assert conversations_generate(count=COUNT, seed=0) == conversations
    assert conversations_generate(count=COUNT, seed=1) != conversations


def test_its_tool_calls_follow_the_schema_in_the_prompt(conversations):
    checked = 0
    for conversation in conversations:
        answer = conversation.messages[-1]
        for call in answer.get("tool_calls") or []:
            function = call["function"]
            arguments = json.loads(function["arguments"])
            jsonschema.validate(arguments, _parameters(conversation, function["name"]))
            checked += 1
        if conversation.tools and answer["content"].startswith("["):
            for call in json.loads(answer["content"]):  # tool_choice "required"'s shape
                jsonschema.validate(call["parameters"], _parameters(conversation, call["name"]))
                checked += 1
    assert checked > COUNT / 4


def test_its_json_answers_are_objects(conversations):
    answers = [c.messages[-1]["content"] for c in conversations]
    objects = [json.loads(a) for a in answers if a.startswith("{")]
    assert len(objects) > COUNT / 5
    assert all(isinstance(o, dict) for o in objects)


def test_it_learns_only_the_last_answer_through_im_end(conversations, tokenizer):
    examples = examples_render(
        conversations=conversations[:50], tokenizer=tokenizer, rng=random.Random(0)
    )
    assert len(examples) > 25  # (prompts over MAX_LENGTH tokens are left out)
    for example in examples:
        learned = [label for label in example.labels if label != IGNORE]
        assert len(example.labels) == len(example.ids)
        # Position i learns token i + 1: the learned tokens are the ids' tail, less nothing.
        assert learned == example.ids[len(example.ids) - len(learned) :]
        text = tokenizer.decode(learned)
        assert text.endswith(IM_END_TOKEN) and text.count(IM_END_TOKEN) == 1
        assert not set(learned[:-1]) & {tokenizer.convert_tokens_to_ids(IM_END_TOKEN)}


def test_it_knows_the_whitespace_tokens(tokenizer):
    ids = whitespace_ids(tokenizer)
    assert ids and all(not tokenizer.decode([i]).strip() for i in ids)
    assert tokenizer.convert_tokens_to_ids(IM_END_TOKEN) not in ids
