"""Data-plane jobs for tests that drive a deployment's queue without a frontend."""

from __future__ import annotations

import time
import uuid

from dataplane.types import Job, Sampling


def job_new(
    deployment: str,
    *,
    tenant: int = 1,
    prompt: list[int] | None = None,
    max_tokens: int = 8,
    priority: str = "interactive",
    timeout: float = 60.0,
    queued_for: float = 0.0,
) -> Job:
    """A completions job of `deployment`, enqueued `queued_for` seconds ago, due in `timeout`."""
    now = time.time()
    return Job(
        request_id=uuid.uuid4().hex,
        tenant_id=tenant,
        api_key_id=1,
        deployment=deployment,
        model_version="v",
        endpoint="completions",
        prompt_token_ids=[1, 2, 3] if prompt is None else prompt,
        sampling=Sampling(max_tokens=max_tokens),
        priority=priority,
        enqueued_at=now - queued_for,
        deadline=now + timeout,
    )
