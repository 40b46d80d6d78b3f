from __future__ import annotations

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"

    def ready(self) -> None:
        from django.core import signals
        from django.core.handlers.asgi import ASGIHandler
        from django.core.handlers.wsgi import WSGIHandler
        from django.db import close_old_connections, reset_queries

        # Keep Django's per-request connection housekeeping for the site (admin, console),
        # but not for the /v1 handler: it does the same in config.db, only when it uses
        # the database, instead of a thread hop on every request.
        hooks = [
            (signals.request_started, reset_queries),
            (signals.request_started, close_old_connections),
            (signals.request_finished, close_old_connections),
        ]
        for signal, receiver in hooks:
            signal.disconnect(receiver)
            for handler in (ASGIHandler, WSGIHandler):
                signal.connect(receiver, sender=handler)

        from dataplane.changes import receivers_connect
        from inference import receivers

        receivers_connect()
        receivers.receivers_connect()
