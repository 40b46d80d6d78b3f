"""The request bodies of the /v1 API, as its OpenAPI document describes them.

Every body is built from its field table (inference.body.fields): each field's schema is the one
its reader enforces. The batch views' bodies are batches.openapi's.
"""

from __future__ import annotations

from inference.body.fields import CHAT, COMPLETIONS, GENERATION_FIELDS, Field
from inference.body.parser import EMBEDDINGS
from inference.chat.protocol import CHAT_BATCH_FIELDS
from inference.embeddings.protocol import EMBEDDING_FIELDS
from inference.openapi.schema import Schema, obj
from inference.operations.protocol import DETOKENIZE_FIELDS, TOKENIZE_FIELDS


def request_schema(fields: dict[str, Field], endpoint: str, *required: str) -> Schema:
    """A request body's schema, from its field table: each field as its kind declares it.

    A refused field takes only null or the values that ask for nothing; a field in no table
    is refused, so the body takes no other properties.
    """
    properties: dict[str, Schema] = {}
    for name, field in fields.items():
        if field.only is not None and field.only != endpoint:
            continue
        if field.decision == "refused":
            properties[name] = {
                "enum": [*field.unused, None],
                "description": "Not served: refused unless null"
                + (" or an unused value." if field.unused else "."),
            }
        elif field.kind is not None:
            properties[name] = field.kind.schema
    return obj(properties, *required, additionalProperties=False)


# A stream with options is a conditional JSON Schema can say: options need stream=true.
_STREAM_OPTIONS_NEED_STREAM: Schema = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}
CHAT_REQUEST: Schema = {
    **request_schema(GENERATION_FIELDS, CHAT, "model", "messages"),
    **_STREAM_OPTIONS_NEED_STREAM,
}
CHAT_BATCH_REQUEST: Schema = request_schema(CHAT_BATCH_FIELDS, CHAT, "model", "messages")
COMPLETION_REQUEST: Schema = {
    **request_schema(GENERATION_FIELDS, COMPLETIONS, "model", "prompt"),
    **_STREAM_OPTIONS_NEED_STREAM,
}
EMBEDDING_REQUEST: Schema = request_schema(EMBEDDING_FIELDS, EMBEDDINGS, "model", "input")


def _tokenize_variant(required: str, absent: str) -> Schema:
    """One of /tokenize's two bodies (vLLM's): a prompt, or messages; never both."""
    schema = request_schema(TOKENIZE_FIELDS, "tokenize", "model", required)
    schema["properties"][absent] = {"type": "null"}
    return schema


# vLLM's TokenizeRequest: a completion prompt, or chat messages (the two cannot be mixed).
TOKENIZE_REQUEST: Schema = {
    "anyOf": [_tokenize_variant("prompt", "messages"), _tokenize_variant("messages", "prompt")]
}
DETOKENIZE_REQUEST: Schema = request_schema(DETOKENIZE_FIELDS, "detokenize", "model", "tokens")
