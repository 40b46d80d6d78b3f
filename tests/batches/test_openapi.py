"""Batches bring their own part of the /v1 OpenAPI document (batches/openapi.py)."""

from __future__ import annotations

from typing import Any

import pytest

from batches.services import ENDPOINTS
from inference.openapi import parts as openapi_parts
from inference.openapi.document import openapi_document
from inference.openapi.parts import Part


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_the_v1_document_describes_files_and_batches_between_models_and_requests():
    document = openapi_document()
    assert list(document["paths"]) == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/chat/completions/batch",
        "/v1/embeddings",
        "/v1/models",
        "/v1/models/{name}",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/v1/responses/{response_id}/cancel",
        "/v1/conversations",
        "/v1/conversations/{conversation_id}",
        "/v1/conversations/{conversation_id}/items",
        "/v1/conversations/{conversation_id}/items/{item_id}",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
        "/v1/requests/{request_id}/cancel",
        "/v1/requests/{request_id}/stream",
        "/v1/openapi.json",
        "/health",
        "/ping",
        "/version",
        "/tokenize",
        "/detokenize",
    ]
    schemas = document["components"]["schemas"]
    names = list(schemas)
    batches = ["File", "FileDeleted", "FileUpload", "ExpiresAfter", "Batch", "BatchRequest",
               "RequestStatus"]  # fmt: skip
    # The batches' part sits right after the models', the Responses API's and the Messages
    # API's schemas and before the operational ones.
    start = names.index("CountedTokens") + 1
    assert names[start : start + len(batches)] == batches
    assert schemas["BatchRequest"]["properties"]["endpoint"]["enum"] == list(ENDPOINTS)
    # Every reference resolves: the part's to the API's (Error, the error responses) and back.
    refs = _refs(document)
    assert {"#/components/schemas/BatchRequest", "#/components/responses/404"} <= set(refs)
    for ref in refs:
        section, name = ref.removeprefix("#/components/").split("/")
        assert name in document["components"][section], ref


def test_a_part_that_names_what_the_document_has_is_refused(monkeypatch):
    clashing = Part(name="clashing", paths=lambda: {"/v1/models": {}}, schemas={})
    monkeypatch.setitem(openapi_parts._PARTS, "clashing", clashing)
    with pytest.raises(ValueError, match="/v1/models"):
        openapi_document()
    monkeypatch.setitem(
        openapi_parts._PARTS, "clashing", Part(name="clashing", paths=dict, schemas={"Batch": {}})
    )
    with pytest.raises(ValueError, match="Batch"):
        openapi_document()
