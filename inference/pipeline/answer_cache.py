"""Response cache: a tenant's repeated deterministic request answered without the engine.

Opt-in per tenant (`Quota.response_cache_seconds`; 0 is off). A request qualifies when its
answer is a function of its input: greedy sampling (temperature 0, so top_p, top_k and seed
change nothing) of a full model version or adapter. Its key hashes the version, the adapter,
the endpoint, the prompt's token ids (after the chat template, so spacing in JSON or message
objects that render the same share an entry) and the sampling parameters, under the tenant's
own Redis hash tag: two tenants never share an entry, whatever they send.

Only answers that ended normally (`stop` or `length`) are stored, by the frontend that relayed
them. A hit is admitted like any request (rate, tokens, concurrency, budget), then written to
its reply stream and finished with a usage event here, so every path that relays, replays or
bills a request treats it as any other; its usage record is marked `response_cache` and
billed at the tenant's `response_cache_bill_percent` of the full price.

A request's turn at the cache is looked up before it is queued; a hit's answer is written to
its reply stream as a worker would write it (docs/response-cache.md).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import msgspec
import redis
import redis.asyncio as aredis

from dataplane.frontdoor import FrontDoor
from dataplane.keys import answer_cache_prefix
from dataplane.types import Delta, Finished, Job, Sampling, Started, Status, encode, usage_for
from inference.pipeline.auth import Principal

log = logging.getLogger(__name__)

_NORMAL_ENDS = ("stop", "length", "repetition")


class Stored(msgspec.Struct, frozen=True):
    """An answer as the cache keeps it."""

    text: str
    finish_reason: str
    completion_tokens: int
    stop_reason: str | int | None = None  # vLLM's: the stop string or token id that ended it


_stored_decoder = msgspec.msgpack.Decoder(Stored)


def cacheable(job: Job) -> bool:
    """Return whether a job's answer depends on nothing but its input."""
    sampling = job.sampling
    # The cache keeps text alone: answers with choices, logprobs, token ids, tool calls or a
    # reasoning model's thinking are not kept.
    return (
        sampling.temperature == 0
        and not job.shadow
        and not job.input_lengths
        and job.tools is None
        and job.reasoning is None
        and sampling.n == 1
        and sampling.logprobs is None
        and sampling.prompt_logprobs is None
        and not sampling.output_token_ids
    )


def _normalised(sampling: Sampling) -> Sampling:
    # Greedy decoding ignores these, and the prompt's ids in the reply change no answer:
    # requests differing only in them get the same answer.
    return msgspec.structs.replace(
        sampling, top_p=1.0, top_k=0, seed=None, prompt_ids_in_reply=False
    )


def tenant_answers_forget(client: redis.Redis, *, tenant_id: int) -> int:
    """Delete every answer cached for a tenant (when it is deleted); return how many."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=answer_cache_prefix(tenant_id) + "*", count=1000):
        batch.append(key)
        if len(batch) == 500:
            deleted += int(client.unlink(*batch))
            batch.clear()
    if batch:
        deleted += int(client.unlink(*batch))
    return deleted


def cache_key(job: Job) -> str:
    """Return a cacheable job's key: its tenant's tag, then a digest of what decides the answer."""
    digest = hashlib.sha256()
    for part in (job.model_version, job.adapter, job.endpoint):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(encode(_normalised(job.sampling)))
    digest.update(b"\0")
    digest.update(b",".join(str(t).encode() for t in job.prompt_token_ids))
    if job.cache_salt:
        # A client that salts its requests apart (its users) keeps their answers apart too.
        digest.update(b"\0salt\0" + job.cache_salt.encode())
    return answer_cache_prefix(job.tenant_id) + digest.hexdigest()


class ResponseCache:
    """Stored answers in Redis, each for its tenant's configured time."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client

    async def get(self, key: str) -> Stored | None:
        """Return the stored answer of a key, or None (a broken entry counts as a miss)."""
        raw = await self.redis.get(key)
        if not isinstance(raw, bytes):
            return None
        try:
            return _stored_decoder.decode(raw)
        except msgspec.DecodeError:
            log.warning("discarding an undecodable response cache entry")
            return None

    async def put(self, key: str, answer: Stored, *, seconds: int) -> bool:
        """Store an answer that ended normally for `seconds`; return whether it was stored."""
        if seconds <= 0 or answer.finish_reason not in _NORMAL_ENDS:
            return False
        await self.redis.set(key, encode(answer), ex=seconds)
        return True


@dataclass(frozen=True)
class CacheLookup:
    """What the cache said of a request: how it is used, and the answer if it had one."""

    use: CacheUse
    answer: Stored | None


async def cache_lookup(cache: ResponseCache, principal: Principal, job: Job) -> CacheLookup | None:
    """Look a request up in its tenant's response cache, if the tenant uses one."""
    if not principal.response_cache_seconds or not cacheable(job):
        return None
    key = cache_key(job)
    answer = await cache.get(key)
    use = CacheUse(
        key=key,
        seconds=principal.response_cache_seconds,
        hit=answer is not None,
        bill_percent=principal.response_cache_bill_percent,
    )
    return CacheLookup(use=use, answer=answer)


async def cache_answer(dispatch: FrontDoor, *, job: Job, use: CacheUse, answer: Stored) -> None:
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
    await dispatch.answer_here(
        job=job,
        events=[Started(at=now), Delta(text=answer.text, tokens=answer.completion_tokens)],
        terminal=terminal,
        usage=usage,
    )


@dataclass(frozen=True)
class CacheUse:
    """How a request uses its tenant's response cache: answered from it, or to fill it."""

    key: str
    seconds: int
    hit: bool
    bill_percent: int = 100
