from __future__ import annotations

from django.apps import AppConfig


class PrivacyConfig(AppConfig):
    name = "privacy"

    def ready(self) -> None:
        from privacy.crypto import content_keys_check

        # A mistyped key fails every process at start, not the first request that keeps text.
        content_keys_check()

        from privacy.receivers import receivers_connect

        receivers_connect()
