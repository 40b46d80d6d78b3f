"""Typed, versioned messages between frontends, workers and the ingester (msgpack on the wire)."""

from __future__ import annotations

import enum

import msgspec

WIRE_VERSION = 1


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = []
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a worker needs to run one request; the prompt is already token ids."""

    v: int = WIRE_VERSION
    request_id: str
    tenant_id: int
    api_key_id: int
    deployment: str
    model_version: str
    endpoint: str
    prompt_token_ids: list[int]
    sampling: Sampling
    priority: str = "interactive"  # or "batch"; interactive always goes first
    weight: float = 1.0  # the tenant's share of fair dispatch
    enqueued_at: float
    deadline: float
    reply_ttl: int = 0  # seconds to keep the reply stream; 0: the platform's default
    # A LoRA adapter version (its digest) the base model's worker applies; "" for none.
    adapter: str = ""
    # A copy for a candidate version: nobody reads its output and it is not billed.
    shadow: bool = False
    user: str = ""  # the client's `user` tag, kept on the usage record
    # False when nobody reads the output token by token (a non-streaming or batch request):
    # the worker then writes its text in a few large events instead of one per flush.
    stream: bool = True
    # An embeddings request: prompt_token_ids holds its inputs end to end, these long each.
    input_lengths: list[int] = []
    # W3C trace context: the trace and the frontend's span, the worker's parent.
    trace_id: str = ""
    parent_span_id: str = ""

    def inputs(self) -> list[list[int]]:
        """The token ids of each input of an embeddings request."""
        out, start = [], 0
        for length in self.input_lengths:
            out.append(self.prompt_token_ids[start : start + length])
            start += length
        return out

    @property
    def reserved_tokens(self) -> int:
        """Prompt + max_tokens: what admission reserves and fair dispatch charges first."""
        return len(self.prompt_token_ids) + self.sampling.max_tokens


class Status(enum.StrEnum):
    """How a request ended; every value means finished."""

    OK = "ok"
    CANCELLED = "cancelled"
    ERROR = "error"
    WORKER_LOST = "worker_lost"
    TIMEOUT = "timeout"


class Started(msgspec.Struct, frozen=True, tag="started"):
    at: float


class Delta(msgspec.Struct, frozen=True, tag="delta"):
    text: str
    tokens: int

    def then(self, later: Delta) -> Delta:
        """This delta and a later one of the same request, as one."""
        return Delta(text=self.text + later.text, tokens=self.tokens + later.tokens)


class Embeddings(msgspec.Struct, frozen=True, tag="embeddings"):
    """The vectors of an embeddings request: float32, little-endian, one row per input."""

    data: bytes
    dimensions: int


class Finished(msgspec.Struct, frozen=True, tag="finished"):
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class Failed(msgspec.Struct, frozen=True, tag="error"):
    code: str
    message: str
    prompt_tokens: int
    completion_tokens: int


Event = Started | Delta | Embeddings | Finished | Failed
TERMINAL = (Finished, Failed)


class UsageEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One per accepted request, whatever its outcome; the ingester makes it a UsageRecord."""

    v: int = WIRE_VERSION
    request_id: str
    tenant_id: int
    api_key_id: int
    deployment: str
    model_version: str
    endpoint: str
    status: Status
    finish_reason: str = ""
    error_code: str = ""
    prompt_tokens: int
    completion_tokens: int
    enqueued_at: float
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float
    shadow: bool = False
    user: str = ""
    priority: str = "interactive"
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache
    trace_id: str = ""
    # Answered from the tenant's response cache, billed at this share of the full price.
    response_cache: bool = False
    bill_percent: int = 100


job_encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(Job)
event_decoder = msgspec.msgpack.Decoder(Event)
usage_decoder = msgspec.msgpack.Decoder(UsageEvent)


def encode(message: msgspec.Struct) -> bytes:
    return job_encoder.encode(message)


def usage_for(
    job: Job,
    *,
    status: Status,
    finished_at: float,
    started_at: float | None = None,
    first_token_at: float | None = None,
    completion_tokens: int = 0,
    finish_reason: str = "",
    error_code: str = "",
    cached_tokens: int = 0,
    prompt_tokens: int | None = None,
) -> UsageEvent:
    """Build the usage event of a job; its prompt counts in full unless told otherwise."""
    return UsageEvent(
        request_id=job.request_id,
        tenant_id=job.tenant_id,
        api_key_id=job.api_key_id,
        deployment=job.deployment,
        model_version=job.model_version,
        endpoint=job.endpoint,
        status=status,
        finish_reason=finish_reason,
        error_code=error_code,
        prompt_tokens=len(job.prompt_token_ids) if prompt_tokens is None else prompt_tokens,
        completion_tokens=completion_tokens,
        enqueued_at=job.enqueued_at,
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=finished_at,
        shadow=job.shadow,
        user=job.user,
        priority=job.priority,
        cached_tokens=cached_tokens,
        trace_id=job.trace_id,
    )
