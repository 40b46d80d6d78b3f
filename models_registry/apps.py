from __future__ import annotations

from django.apps import AppConfig


class ModelsRegistryConfig(AppConfig):
    name = "models_registry"
