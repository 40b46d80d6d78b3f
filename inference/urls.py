"""The /v1 API: one explicit path per endpoint, and JSON 404s for everything else.

Files and batches register their own paths (batches/urls.py), which config/urls.py puts first.
"""

from __future__ import annotations

from django.urls import path, re_path

from inference import conversations_views, messages_views, responses_views, views

urlpatterns = [
    path("chat/completions", views.chat_completions),
    path("chat/completions/batch", views.chat_completions_batch),
    path("completions", views.completions),
    path("embeddings", views.embeddings),
    path("models", views.models_list),
    path("openapi.json", views.openapi),
    path("messages", messages_views.messages_create),
    path("messages/count_tokens", messages_views.messages_count_tokens),
    path("responses", responses_views.responses_create),
    path("responses/input_tokens", responses_views.responses_input_tokens),
    path("conversations", conversations_views.conversations),
    path("conversations/<str:conversation_id>", conversations_views.conversation_detail),
    path("conversations/<str:conversation_id>/items", conversations_views.conversation_items),
    path(
        "conversations/<str:conversation_id>/items/<str:item_id>",
        conversations_views.conversation_item,
    ),
    path("responses/<str:response_id>", responses_views.response_detail),
    path("responses/<str:response_id>/input_items", responses_views.response_input_items),
    path("responses/<str:response_id>/cancel", responses_views.response_cancel),
    path("requests/<str:target>/cancel", views.request_cancel),
    path("requests/<str:target>/stream", views.request_stream),
    path("models/<path:name>", views.models_detail),
    # [\s\S]: a path holding an encoded newline is still one of ours to answer in JSON.
    re_path(r"^(?P<path>[\s\S]*)$", views.not_found),
]
