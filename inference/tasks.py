"""Celery control jobs of the API: the hourly purge of expired stored responses and
conversations, and the sweep of orphaned background responses."""

from __future__ import annotations

from celery import shared_task

from inference.responses.store import conversations_purge
from inference.responses.store import responses_purge as _responses_purge


@shared_task
def responses_purge() -> int:
    """Delete stored responses (the Responses API's) and conversations past their expiry."""
    return _responses_purge() + conversations_purge()


@shared_task
def responses_orphans_finish(older_than: float = 60.0) -> int:
    """End in the store the background responses whose accepting frontend died (accepted
    more than `older_than` seconds ago, whose request has ended)."""
    import asyncio

    from inference.pipeline.clients import dispatch_get
    from inference.responses.background import orphans_finish

    async def run() -> int:
        return await orphans_finish(dispatch_get(), older_than=older_than)

    return asyncio.run(run())
