from __future__ import annotations

from django.apps import AppConfig


class SafetyConfig(AppConfig):
    name = "safety"
