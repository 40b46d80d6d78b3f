from __future__ import annotations

from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    """Canary rollouts: the decisions, their API, the periodic analysis and `manage.py rollout`.

    The Rollout model stays in models_registry (the data); deciding reads billing's usage SLIs,
    so it sits above billing.
    """

    name = "rollouts"
