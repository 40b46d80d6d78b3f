"""WebSocket routes served through Channels."""

from __future__ import annotations

from typing import Any

from django.urls import path

from inference.ws import GenerationConsumer

websocket_urlpatterns: list[Any] = [
    path("v1/ws", GenerationConsumer.as_asgi()),
]
