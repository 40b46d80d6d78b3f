"""Output capping: a shorter answer instead of a 429 or one cut at its deadline, for tenants
that opt in.

A tenant whose quota sets `output_capping` gets two things. A request its tokens per minute
would refuse (429 `tokens_per_minute_exceeded`, to be retried after the window frees what it
reserves) runs now with the max_tokens whose reservation fits what the window has left, when
that is at or above the floor. And admission checks its requests' finish, not only their
start: the enqueue script estimates the wait behind the backlog (as for every
request) and the time the request's own reserved tokens take at one slot's share of the
deployment's measured rate (dataplane/lua/enqueue.lua). A request that would start in time
but finish late runs with the largest max_tokens that fits, never below a floor
(`ROUNDHOUSE_CAPPED_MAX_TOKENS_FLOOR`, or the request's min_tokens if higher); its answer says
so (CAPPED_HEADER, and `capped_max_tokens` on its usage record), and one that reaches the cap
ends with finish_reason `length`, as any answer that reaches its max_tokens does.

A cap cannot shorten the wait: a request whose wait alone passes its deadline is refused
`deadline_unattainable` as for every tenant, and goes to its alias's fallback where it has one.
When no cap at or above the floor fits, the request runs as asked, as for every tenant. Only
an answer with headers to say so is capped (HTTP; not a WebSocket frame nor a batch line).
"""

from __future__ import annotations

import math

import msgspec

from dataplane.types import Job

# The cap a capped answer ran with, on its response.
CAPPED_HEADER = "x-roundhouse-max-tokens-capped"


def max_tokens_fitting(
    *,
    seconds_left: float,
    wait_seconds: float,
    seconds_per_token: float,
    prompt_tokens: int,
    choices: int,
    floor: int,
) -> int | None:
    """Return the largest max_tokens a request can serve before its deadline; None below floor.

    The request waits `wait_seconds`, then serves its prompt and each choice's max_tokens at
    `seconds_per_token` (as the enqueue script charges them); `seconds_left` is the time to
    its deadline.
    """
    if seconds_per_token <= 0:
        return None
    tokens = math.floor((seconds_left - wait_seconds) / seconds_per_token)
    fitting = (tokens - prompt_tokens) // max(choices, 1)
    return fitting if fitting >= max(floor, 1) else None


def max_tokens_within(
    *, tokens_left: int, prompt_tokens: int, choices: int, floor: int
) -> int | None:
    """Return the largest max_tokens whose reservation (prompt + each choice's max_tokens)
    fits the tokens a tenant's tokens per minute have left; None below floor."""
    fitting = (tokens_left - prompt_tokens) // max(choices, 1)
    return fitting if fitting >= max(floor, 1) else None


def job_capped(job: Job, max_tokens: int) -> Job:
    """The job with its max_tokens capped, remembering what the client asked for."""
    sampling = msgspec.structs.replace(job.sampling, max_tokens=max_tokens)
    return msgspec.structs.replace(
        job, sampling=sampling, max_tokens_requested=job.sampling.max_tokens
    )
