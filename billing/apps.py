from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from billing.receivers import receivers_connect

        receivers_connect()
