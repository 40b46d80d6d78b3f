from __future__ import annotations

from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Files and batches"

    def ready(self) -> None:
        from batches import signals  # noqa: F401  (resume batches when a Celery worker starts)
        from batches.receivers import receivers_connect

        receivers_connect()
