"""Redis clients for the data plane, configured from settings."""

from __future__ import annotations

import redis
import redis.asyncio as aredis
from django.conf import settings


def redis_client_new() -> aredis.Redis:
    """Return a new asyncio Redis client bound to the running event loop."""
    # Reads block for at most a few seconds (see dispatch); the socket timeout must exceed that.
    return aredis.Redis.from_url(
        settings.REDIS_URL,
        max_connections=4096,
        socket_timeout=30,
        socket_connect_timeout=5,
        health_check_interval=30,
    )


def redis_sync_client() -> redis.Redis:
    """Return a blocking Redis client for management code."""
    return redis.Redis.from_url(settings.REDIS_URL)
