"""Every route of the API, HTTP and WebSocket: one explicit path per endpoint, each to its
surface's views, and JSON 404s for everything else.

Files and batches register their own paths (batches/urls.py), which config/urls.py puts first;
vLLM's operational paths (/health, /tokenize, ...) sit at the root, in config/urls.py.
"""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

from inference.chat import views as chat
from inference.edge.endpoint import not_found
from inference.embeddings import views as embeddings
from inference.messages import views as messages
from inference.openapi.views import openapi
from inference.operations import views as operations
from inference.responses import views as responses
from inference.websocket.views import GenerationConsumer

urlpatterns = [
    path("chat/completions", chat.chat_completions),
    path("chat/completions/batch", chat.chat_completions_batch),
    path("completions", chat.completions),
    path("embeddings", embeddings.embeddings),
    path("models", operations.models_list),
    path("openapi.json", openapi),
    path("messages", messages.messages_create),
    path("messages/count_tokens", messages.messages_count_tokens),
    path("responses", responses.responses_create),
    path("responses/input_tokens", responses.responses_input_tokens),
    path("conversations", responses.conversations),
    path("conversations/<str:conversation_id>", responses.conversation_detail),
    path("conversations/<str:conversation_id>/items", responses.conversation_items),
    path(
        "conversations/<str:conversation_id>/items/<str:item_id>",
        responses.conversation_item,
    ),
    path("responses/<str:response_id>", responses.response_detail),
    path("responses/<str:response_id>/input_items", responses.response_input_items),
    path("responses/<str:response_id>/cancel", responses.response_cancel),
    path("requests/<str:target>/cancel", chat.request_cancel),
    path("requests/<str:target>/stream", chat.request_stream),
    path("models/<path:name>", operations.models_detail),
    # [\s\S]: a path holding an encoded newline is still one of ours to answer in JSON.
    re_path(r"^(?P<path>[\s\S]*)$", not_found),
]

# Served through Channels (config/asgi.py).
websocket_urlpatterns: list[Any] = [
    path("v1/ws", GenerationConsumer.as_asgi()),
]
