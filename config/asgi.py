"""ASGI entry point: the /v1 data plane, the console and admin, and WebSockets via Channels."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

import django

django.setup()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from inference.base.metrics import gc_pauses_observe  # noqa: E402
from inference.edge.asgi import ApiHandler, is_api_path  # noqa: E402
from inference.urls import websocket_urlpatterns  # noqa: E402

_api = ApiHandler()
_site = ASGIHandler()


async def http_application(scope: dict, receive: object, send: object) -> None:
    """Send API paths to the lean data-plane handler and the rest through full middleware."""
    handler = _api if is_api_path(scope["path"]) else _site
    await handler(scope, receive, send)  # type: ignore[arg-type]


# Import the tokenizer stack and the grammar compiler now (AutoTokenizer pulls in torch;
# `import transformers` alone is lazy and loads almost nothing), then move everything loaded
# so far out of the garbage collector's reach: full collections over Django's, torch's and
# transformers' objects otherwise stall the event loop for a quarter of a second every few
# seconds under load.
# Loading a tokenizer freezes again what it added (models_registry.tokenizer).
from transformers import AutoTokenizer  # noqa: E402, F401

from inference.body.tools import structured_ready  # noqa: E402

structured_ready()  # the grammar compiler checks schemas before requests queue (xgrammar)
gc.collect()
gc.freeze()
gc_pauses_observe()

application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
