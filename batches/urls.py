"""The /v1 file and batch endpoints (config/urls.py puts them before the rest of /v1)."""

from __future__ import annotations

from django.urls import path

from batches import views

urlpatterns = [
    path("files", views.files),
    path("files/<str:file_id>", views.file_detail),
    path("files/<str:file_id>/content", views.file_content),
    path("batches", views.batches),
    path("batches/<str:batch_id>", views.batch_detail),
    path("batches/<str:batch_id>/cancel", views.batch_cancel),
]
