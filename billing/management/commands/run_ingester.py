from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from billing.ingester import Ingester
from dataplane.identity import worker_id_new
from dataplane.metrics import metrics_serve
from dataplane.redis_client import redis_client_new

log = logging.getLogger("roundhouse.ingester")


class Command(BaseCommand):
    help = "Move usage events from Redis into Postgres and reclaim jobs whose lease lapsed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=settings.ROUNDHOUSE_INGESTER_METRICS_PORT,
            help="serve Prometheus metrics on this port (0: off)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        metrics_serve(options["metrics_port"], what="ingester")
        uvloop.run(self._run())

    async def _run(self) -> None:
        client = redis_client_new()
        ingester = Ingester(
            client=client,
            consumer=f"ingester-{worker_id_new()}",
            reply_ttl=settings.ROUNDHOUSE_REPLY_TTL_SECONDS,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, ingester.stop)
        self.stdout.write(f"ingester running as consumer {ingester.consumer}")
        self.stdout.flush()
        try:
            await ingester.run()
        finally:
            await client.aclose()
            log.info("ingester stopped after %d records", ingester.ingested)
