from __future__ import annotations

from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Files and batches"

    def ready(self) -> None:
        from batches import signals  # noqa: F401  (resume batches when a Celery worker starts)
        from batches.openapi import PART
        from batches.receivers import receivers_connect
        from inference.openapi.parts import part_register

        receivers_connect()
        part_register(PART)  # the /v1 document describes the file and batch operations
