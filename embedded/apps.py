"""Django app config for the embedded PostgreSQL/Valkey servers."""

from __future__ import annotations

from django.apps import AppConfig


class EmbeddedConfig(AppConfig):
    """Register the embedded-services app (management command only, no models)."""

    name = "embedded"
    label = "embedded"
    verbose_name = "Embedded services"
