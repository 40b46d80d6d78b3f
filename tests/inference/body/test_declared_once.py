"""Chat and completions fields are declared once: the parsers and /v1/openapi.json agree."""

from __future__ import annotations

from typing import Any

import pytest

from inference.base.errors import ApiError
from inference.body.fields import CHAT, COMPLETIONS, GENERATION_FIELDS
from inference.body.parser import generation_parse
from inference.openapi.bodies import CHAT_REQUEST, COMPLETION_REQUEST

BASE: dict[str, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"model": "m", "prompt": "hi"},
}
DOCUMENTS = {CHAT: CHAT_REQUEST, COMPLETIONS: COMPLETION_REQUEST}
# Rules between fields the schema states in words: what a field needs beside it.
NEEDS: dict[str, dict[str, Any]] = {
    "top_logprobs": {"logprobs": True},
    "length_penalty": {"use_beam_search": True},
}


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_the_document_lists_every_field_of_the_table_and_no_other(endpoint):
    table = {n for n, f in GENERATION_FIELDS.items() if f.only in (None, endpoint)}
    document = DOCUMENTS[endpoint]
    assert set(document["properties"]) == table
    assert document["additionalProperties"] is False


def _bounded() -> list[tuple[str, str, Any]]:
    """(endpoint, field, schema) of every honoured numeric field with bounds in its schema."""
    cases = []
    for name, field in GENERATION_FIELDS.items():
        if field.decision != "honoured" or field.kind is None:
            continue
        kinds = field.kind.schema.get("type", [])
        if "number" in kinds or kinds == ["integer", "null"]:
            endpoint = field.only or CHAT
            cases.append((endpoint, name, field.kind.schema))
    return cases


@pytest.mark.parametrize(("endpoint", "name", "schema"), _bounded())
def test_a_value_past_a_published_bound_is_refused_and_one_at_it_is_taken(endpoint, name, schema):
    body = {**BASE[endpoint], **NEEDS.get(name, {})}
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema["maximum"]
    integral = "integer" in schema["type"]
    step = 1 if integral else 0.5
    for outside in (low - step, high + step):
        with pytest.raises(ApiError) as caught:
            generation_parse({**body, name: outside}, endpoint=endpoint)
        assert caught.value.param == name
    if "exclusiveMinimum" in schema:
        with pytest.raises(ApiError):
            generation_parse({**body, name: low}, endpoint=endpoint)
    else:
        generation_parse({**body, name: low}, endpoint=endpoint)
    generation_parse({**body, name: high}, endpoint=endpoint)


def test_a_refused_field_is_published_with_only_the_values_that_ask_for_nothing():
    best_of = CHAT_REQUEST["properties"]["best_of"]
    assert best_of["enum"] == [1, None]
    with pytest.raises(ApiError):
        generation_parse({**BASE[CHAT], "best_of": 2}, endpoint=CHAT)
    generation_parse({**BASE[CHAT], "best_of": 1}, endpoint=CHAT)


def test_every_other_body_is_built_from_its_table():
    from inference.embeddings.protocol import EMBEDDING_FIELDS
    from inference.openapi.bodies import DETOKENIZE_REQUEST, EMBEDDING_REQUEST, TOKENIZE_REQUEST
    from inference.operations.protocol import DETOKENIZE_FIELDS, TOKENIZE_FIELDS

    assert set(EMBEDDING_REQUEST["properties"]) == set(EMBEDDING_FIELDS)
    assert set(DETOKENIZE_REQUEST["properties"]) == set(DETOKENIZE_FIELDS)
    for variant in TOKENIZE_REQUEST["anyOf"]:
        assert set(variant["properties"]) == set(TOKENIZE_FIELDS)
        assert variant["additionalProperties"] is False
    dimensions = EMBEDDING_REQUEST["properties"]["dimensions"]
    from inference.embeddings.protocol import embeddings_parse

    body = {"model": "m", "input": "x"}
    with pytest.raises(ApiError):
        embeddings_parse({**body, "dimensions": dimensions["maximum"] + 1})
    assert embeddings_parse({**body, "dimensions": dimensions["maximum"]}).dimensions


def test_the_responses_body_lists_every_field_its_reader_takes_and_no_other():
    from inference.openapi.responses import RESPONSES_REQUEST
    from inference.responses.protocol import (
        HONOURED,
        PASSED_TO_CHAT,
        REFUSED_UNLESS,
        responses_parse,
    )

    properties = RESPONSES_REQUEST["properties"]
    assert set(properties) == set(HONOURED) | set(PASSED_TO_CHAT) | set(REFUSED_UNLESS)
    assert RESPONSES_REQUEST["additionalProperties"] is False
    body = {"model": "m", "input": "hi", "include": ["message.output_text.logprobs"]}
    top = properties["top_logprobs"]
    responses_parse({**body, "top_logprobs": top["maximum"]}, response_id="resp_x", history=[])
    with pytest.raises(ApiError) as caught:
        responses_parse({**body, "top_logprobs": top["maximum"] + 1}, response_id="r", history=[])
    assert caught.value.param == "top_logprobs"
    assert "auto" in properties["truncation"]["enum"]
