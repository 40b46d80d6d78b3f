"""The /v1 API: one explicit path per endpoint, and JSON 404s for everything else."""

from __future__ import annotations

from django.urls import path, re_path

from batches import views as batches
from inference import views

urlpatterns = [
    path("chat/completions", views.chat_completions),
    path("completions", views.completions),
    path("embeddings", views.embeddings),
    path("files", batches.files),
    path("files/<str:file_id>", batches.file_detail),
    path("files/<str:file_id>/content", batches.file_content),
    path("batches", batches.batches),
    path("batches/<str:batch_id>", batches.batch_detail),
    path("batches/<str:batch_id>/cancel", batches.batch_cancel),
    path("models", views.models_list),
    path("openapi.json", views.openapi),
    path("requests/<str:target>/cancel", views.request_cancel),
    path("requests/<str:target>/stream", views.request_stream),
    path("models/<path:name>", views.models_detail),
    # [\s\S]: a path holding an encoded newline is still one of ours to answer in JSON.
    re_path(r"^(?P<path>[\s\S]*)$", views.not_found),
]
