"""The /v1 API: one explicit path per endpoint, and JSON 404s for everything else."""

from __future__ import annotations

from django.urls import path, re_path

from inference import views

urlpatterns = [
    path("chat/completions", views.chat_completions),
    path("completions", views.completions),
    path("models", views.models_list),
    path("requests/<str:target>/cancel", views.request_cancel),
    path("models/<path:name>", views.models_detail),
    re_path(r"^(?P<path>.*)$", views.not_found),
]
