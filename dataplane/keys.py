"""Every Redis (Valkey) key, channel and consumer-group name the platform uses, and nothing else.

No other module spells a key: they all call the builders here. The strings are part of the
stored data (a deployment's queues outlive a release), so changing one is a data migration.

Hash tags. A deployment's keys carry `{<deployment>}` and a tenant's keys `{t<tenant id>}`, so
each lives in one Redis Cluster slot and the scripts that touch several of them stay atomic.
The one key found knowing only a request id carries `{r<request id>}`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

# The usage stream's consumer group: every usage ingester reads through it.
INGEST_GROUP = "ingest"
# Published when an API key is revoked (its id), so every frontend forgets it at once.
KEY_REVOCATIONS_CHANNEL = "sy:keys:revoked"
# A kind of control-plane state that frontends cache changed: "keys", "routes" or "policies".
CONTROL_CHANGES_CHANNEL = "sy:control:changed"
# Hash: the circuit breakers a frontend opened, "<tenant>:<alias>" -> until (epoch seconds);
# and the channel that tells the other frontends when one opens or closes.
BREAKERS_KEY = "sy:breakers"
BREAKERS_CHANNEL = "sy:breakers:changed"
# Django's cache (sessions, throttles) in the same Valkey: its keys start with this.
DJANGO_CACHE_PREFIX = "sy:cache"

# How long a request's cancel flag and its finished marker live.
MARKER_TTL_SECONDS = 24 * 3600
# The wake list idle workers block on holds at most this many tokens.
WAKE_CAP = 256

_TENANT_TAG_PREFIX = "sy:{t"


def tag(deployment: str) -> str:
    """The prefix of every key of a deployment, with the deployment as its hash tag."""
    return f"sy:{{{deployment}}}"


def deployment_of(key: str) -> str:
    """The deployment a deployment's key (as `tag` starts it) belongs to."""
    return key[len("sy:{") : key.index("}")]


# --- one deployment's queue ------------------------------------------------------------------


class DeploymentKeys(NamedTuple):
    """The keys every queue script receives, in the order the Lua prelude names them."""

    jobs: str  # hash: request id -> encoded Job, while queued or leased
    meta: str  # hash: request id -> "tenant class cost weight deadline member"
    queue_interactive: str  # sorted set of "<tenant>:<seq>:<request id>"
    queue_batch: str
    ready_interactive: str  # sorted set: waiting tenant -> virtual token counter
    ready_batch: str
    vtc: str  # hash: counters, virtual clocks, weights, the sequence
    deadlines: str  # sorted set: queued request id -> deadline
    depth: str  # hash: queued requests and tokens, in all and per class/tenant
    leases: str  # sorted set: claimed request id -> end of its lease
    workers: str  # sorted set: live worker -> end of its heartbeat
    wake: str  # list: one token per enqueue, for idle workers to block on
    rate: str  # hash: worker -> measured reserved tokens per second
    slots: str  # hash: worker -> "<shared slots> <reserved slots>"
    usage: str
    ledger: str  # hash: "<admission hour>:<field>" -> admitted / finished requests, tokens
    prefixes: str  # hash: request id -> prefix key, for jobs that have one
    holders: str  # hash: claimed request id -> worker that runs it (claims naming a worker)
    held: str  # hash: worker -> jobs it holds (run, or handed to it and not yet taken)
    handoffs: str  # hash: request id -> "<seq> <worker>", handed to a worker not yet taken


def deployment_keys(deployment: str) -> DeploymentKeys:
    """The keys of a deployment's queue, leases, workers, usage stream and ledger."""
    t = tag(deployment)
    return DeploymentKeys(
        jobs=f"{t}:jobs",
        meta=f"{t}:meta",
        queue_interactive=f"{t}:q:interactive",
        queue_batch=f"{t}:q:batch",
        ready_interactive=f"{t}:ready:interactive",
        ready_batch=f"{t}:ready:batch",
        vtc=f"{t}:vtc",
        deadlines=f"{t}:deadlines",
        depth=f"{t}:depth",
        leases=f"{t}:leases",
        workers=heartbeats_key(deployment),
        wake=f"{t}:wake",
        rate=f"{t}:rate",
        slots=f"{t}:slots",
        usage=usage_key(deployment),
        ledger=ledger_key(deployment),
        prefixes=f"{t}:prefixes",
        holders=f"{t}:holders",
        held=f"{t}:held",
        handoffs=f"{t}:handoffs",
    )


def reply_key(deployment: str, request_id: str) -> str:
    """Stream: a request's reply events."""
    return f"{tag(deployment)}:reply:{request_id}"


def reply_wake_key(deployment: str, reader: str) -> str:
    """Stream: wakes one process's reader of a deployment's reply streams (`reader` unique)."""
    return f"{tag(deployment)}:wake:{reader}"


def worker_wake_key(deployment: str, worker: str) -> str:
    """List: wakes one worker's blocking pop of the wake list, beside the deployment's own."""
    return f"{tag(deployment)}:wake:w:{worker}"


def cancel_key(deployment: str, request_id: str) -> str:
    """String: set when a request is cancelled."""
    return f"{tag(deployment)}:cancel:{request_id}"


def fence_key(deployment: str, request_id: str) -> str:
    """String: set when a request that never reached its queue must never reach it."""
    return f"{tag(deployment)}:fence:{request_id}"


def final_key(deployment: str, request_id: str) -> str:
    """String: set by whoever finished a request (it finishes once)."""
    return f"{tag(deployment)}:final:{request_id}"


def usage_key(deployment: str) -> str:
    """Stream: usage events, one per finished request, read by the ingesters."""
    return f"{tag(deployment)}:usage"


def dead_usage_key(deployment: str) -> str:
    """Stream: usage events the database refused, kept for an operator."""
    return f"{tag(deployment)}:usage:dead"


def cancel_channel(deployment: str) -> str:
    """Channel: a request id of the deployment was cancelled."""
    return f"{tag(deployment)}:cancel"


def handoff_channel(deployment: str, worker: str) -> str:
    """Channel: a job was handed to the worker, so it claims at once.

    With worker "" it is the prefix the claim script appends the worker's name to.
    """
    return f"{tag(deployment)}:handoff:{worker}"


def heartbeats_key(deployment: str) -> str:
    """Sorted set: live worker -> end of its heartbeat."""
    return f"{tag(deployment)}:workers"


def gauges_key(deployment: str) -> str:
    """Hash: worker -> "<kv cache use 0..1>", reported with each heartbeat."""
    return f"{tag(deployment)}:gauges"


def retire_key(deployment: str) -> str:
    """String, set by the control plane: the deployment's workers finish its queue and leave."""
    return f"{tag(deployment)}:retire"


def autoscale_key(deployment: str) -> str:
    """Hash: the autoscaling signal's hysteresis state (desired, below_since, window_max)."""
    return f"{tag(deployment)}:autoscale"


def ledger_key(deployment: str) -> str:
    """Hash: "<admission hour>:<field>" -> requests admitted and finished, tokens."""
    return f"{tag(deployment)}:ledger"


def ledger_hour(ts: float) -> str:
    """The hour a request was admitted in (UTC), as the ledger and reconciliation name it."""
    return time.strftime("%Y%m%d%H", time.gmtime(ts))


def ledger_field(ts: float, field: str) -> str:
    """The ledger field counting `field` for the hour of ts (as the scripts' ledger_add)."""
    return f"{ledger_hour(ts)}:{field}"


def whereabouts_key(request_id: str) -> str:
    """Hash: where a request lives; tagged by the request, found knowing only its id."""
    return f"sy:{{r{request_id}}}:where"


# --- one tenant ---------------------------------------------------------------------------


def tenant_tag(tenant_id: int) -> str:
    """The prefix of every key of a tenant, with the tenant as its hash tag."""
    return f"{_TENANT_TAG_PREFIX}{tenant_id}}}"


class QuotaKeys(NamedTuple):
    """A tenant's admission keys, in the order the quota scripts name them."""

    rpm: str  # hash: the requests-per-minute bucket
    tpm: str  # hash: the tokens-per-minute bucket
    inflight: str  # sorted set: admitted request id -> end of its concurrency lease
    spent: str  # string: the month's spend in micros
    held: str  # hash: what the request reserved; with request id "", the prefix of all


def quota_keys(tenant_id: int, request_id: str, month: str) -> QuotaKeys:
    """A tenant's limit keys for one request (its reservation) admitted in one month."""
    t = tenant_tag(tenant_id)
    return QuotaKeys(
        rpm=f"{t}:rpm",
        tpm=f"{t}:tpm",
        inflight=f"{t}:inflight",
        spent=f"{t}:spent:{month}",
        held=f"{t}:held:{request_id}",
    )


def body_bytes_key(tenant_id: int) -> str:
    """Hash: a tenant's bucket of large request-body bytes (a token bucket, per minute)."""
    return f"{tenant_tag(tenant_id)}:body_bytes"


def idempotency_key(tenant_id: int, digest: str) -> str:
    """Hash: a tenant's Idempotency-Key record, by a digest of the client's key."""
    return f"{tenant_tag(tenant_id)}:idem:{digest}"


def answer_cache_prefix(tenant_id: int) -> str:
    """The prefix of every answer cached for a tenant; a digest of the request follows."""
    return f"{tenant_tag(tenant_id)}:rc:"


# --- the control plane ------------------------------------------------------------------------


def login_attempts_key(username: str) -> str:
    """Counts sign-in attempts for a username (case-insensitive)."""
    return f"sy:login-attempts:{username.lower()}"


def batch_lease_key(batch_id: str) -> str:
    """String: held by the batch runner that runs a batch."""
    return f"sy:batch:{batch_id}:lease"


def batch_runner_key(slot: int) -> str:
    """String: the ticket of the batch runner in a slot; only the turn that carries it runs."""
    return f"sy:batch-runner:{slot}"
