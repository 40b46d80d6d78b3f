"""The Conversations API's operations and objects in the /v1 document (docs/responses.md)."""

from __future__ import annotations

from inference.openapi.paths import AUTH_ERRORS, errors, ok, path_parameter
from inference.openapi.responses import ITEM
from inference.openapi.schema import Schema, json_content, obj, ref
from inference.responses.protocol import MAX_METADATA_KEYS, OUTPUT_LOGPROBS

_METADATA: Schema = {
    "type": ["object", "null"],
    "maxProperties": MAX_METADATA_KEYS,
    "additionalProperties": {"type": "string", "maxLength": 512},
}
_ITEMS: Schema = {"type": "array", "items": ITEM, "maxItems": 20}
CONVERSATION: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "conversation"},
        "created_at": {"type": "integer"},
        "metadata": {"type": "object"},
    },
    "id",
    "object",
    "created_at",
    "metadata",
)
CONVERSATION_DELETED: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "conversation.deleted"},
        "deleted": {"const": True},
    },
    "id",
    "object",
    "deleted",
)
ITEMS_PAGE: Schema = obj(
    {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object"}},
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"]},
        "has_more": {"type": "boolean"},
    },
    "object",
    "data",
    "has_more",
)
SCHEMAS: dict[str, Schema] = {
    "ConversationCreateRequest": obj(
        {"items": {**_ITEMS, "type": ["array", "null"]}, "metadata": _METADATA},
        additionalProperties=False,
    ),
    "ConversationUpdateRequest": obj(
        {"metadata": _METADATA}, "metadata", additionalProperties=False
    ),
    "ConversationItemsRequest": obj(
        {"items": {**_ITEMS, "minItems": 1}}, "items", additionalProperties=False
    ),
    "Conversation": CONVERSATION,
    "ConversationDeleted": CONVERSATION_DELETED,
    "ConversationItems": ITEMS_PAGE,
}
_ID = path_parameter("conversation_id", "The conversation's id (conv_...).")
_INCLUDE = {
    "name": "include",
    "in": "query",
    "description": "Only the output text's log probabilities can be included.",
    "schema": {"type": "array", "items": {"const": OUTPUT_LOGPROBS}},
}


def conversations_paths() -> dict[str, Schema]:
    conversation = json_content(ref("Conversation"))
    page = json_content(ref("ConversationItems"))
    return {
        "/v1/conversations": {
            "post": {
                "summary": "Create a conversation, with up to 20 first items",
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("ConversationCreateRequest")),
                },
                "responses": {
                    "200": ok("The conversation.", conversation),
                    **errors(400, *AUTH_ERRORS, 413),
                },
            }
        },
        "/v1/conversations/{conversation_id}": {
            "get": {
                "summary": "A conversation",
                "parameters": [_ID],
                "responses": {
                    "200": ok("The conversation.", conversation),
                    **errors(*AUTH_ERRORS, 404),
                },
            },
            "post": {
                "summary": "Change a conversation's metadata",
                "parameters": [_ID],
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("ConversationUpdateRequest")),
                },
                "responses": {
                    "200": ok("The conversation.", conversation),
                    **errors(400, *AUTH_ERRORS, 404, 413),
                },
            },
            "delete": {
                "summary": "Delete a conversation and its items",
                "parameters": [_ID],
                "responses": {
                    "200": ok("It is deleted.", json_content(ref("ConversationDeleted"))),
                    **errors(*AUTH_ERRORS, 404),
                },
            },
        },
        "/v1/conversations/{conversation_id}/items": {
            "get": {
                "summary": "A conversation's items, a page at a time",
                "parameters": [
                    _ID,
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                    _INCLUDE,
                ],
                "responses": {
                    "200": ok("A page of items.", page),
                    **errors(400, *AUTH_ERRORS, 404),
                },
            },
            "post": {
                "summary": "Add up to 20 items after a conversation's last one",
                "parameters": [_ID, _INCLUDE],
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("ConversationItemsRequest")),
                },
                "responses": {
                    "200": ok("The items added.", page),
                    **errors(400, *AUTH_ERRORS, 404, 413),
                },
            },
        },
        "/v1/conversations/{conversation_id}/items/{item_id}": {
            "get": {
                "summary": "One item of a conversation",
                "parameters": [_ID, path_parameter("item_id", "The item's id."), _INCLUDE],
                "responses": {
                    "200": ok("The item.", json_content({"type": "object"})),
                    **errors(400, *AUTH_ERRORS, 404),
                },
            },
            "delete": {
                "summary": "Take an item out of a conversation",
                "parameters": [_ID, path_parameter("item_id", "The item's id.")],
                "responses": {
                    "200": ok("The conversation.", conversation),
                    **errors(*AUTH_ERRORS, 404),
                },
            },
        },
    }
