"""A request's turn at its tenant's response cache: the lookup before it is queued, and the
answer a hit gives, written to its reply stream as a worker would write it
(docs/response-cache.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec

from dataplane.types import Delta, Finished, Job, Started, Status, usage_for
from inference.admission import CacheUse
from inference.auth import Principal
from inference.clients import dispatch_get, responses_get
from inference.response_cache import Stored, cache_key, cacheable


@dataclass(frozen=True)
class CacheLookup:
    """What the cache said of a request: how it is used, and the answer if it had one."""

    use: CacheUse
    answer: Stored | None


async def cache_lookup(principal: Principal, job: Job) -> CacheLookup | None:
    """Look a request up in its tenant's response cache, if the tenant uses one."""
    if not principal.response_cache_seconds or not cacheable(job):
        return None
    key = cache_key(job)
    answer = await responses_get().get(key)
    use = CacheUse(
        key=key,
        seconds=principal.response_cache_seconds,
        hit=answer is not None,
        bill_percent=principal.response_cache_bill_percent,
    )
    return CacheLookup(use=use, answer=answer)


async def cache_answer(*, job: Job, use: CacheUse, answer: Stored) -> None:
    """Answer an admitted request from the cache: its reply stream and usage, as a worker would."""
    now = time.time()
    usage = usage_for(
        job,
        status=Status.OK,
        finished_at=now,
        started_at=now,
        first_token_at=now,
        completion_tokens=answer.completion_tokens,
        finish_reason=answer.finish_reason,
    )
    usage = msgspec.structs.replace(usage, response_cache=True, bill_percent=use.bill_percent)
    terminal = Finished(
        finish_reason=answer.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        stop_reasons=[] if answer.stop_reason is None else [answer.stop_reason],
        stop_string=answer.stop_reason if isinstance(answer.stop_reason, str) else None,
    )
    await dispatch_get().answer_here(
        job=job,
        events=[Started(at=now), Delta(text=answer.text, tokens=answer.completion_tokens)],
        terminal=terminal,
        usage=usage,
    )
