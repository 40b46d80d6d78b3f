"""How a request's run ends early: every exception mapped, in this one place, to a `Failed`.

A request whose run raised ends with a `Failed` and its usage record like any other, never in
silence; one that the process's own stop interrupted ends too, and then the stop goes on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from dataplane.types import Failed, Job, Status
from workers.adapters import AdapterError
from workers.batcher import DeadlineUnattainable
from workers.engine import RequestRefused, engine_died

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Failure:
    """How a request's run ended early: its status, error code and message."""

    status: Status
    code: str
    message: str
    fatal: BaseException | None = None  # the process is stopping: raise it once the run ended

    def failed(self, *, prompt_tokens: int, completion_tokens: int) -> Failed:
        """The request's terminal event, billing what it used."""
        return Failed(
            code=self.code,
            message=self.message,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    def raise_fatal(self) -> None:
        """Let the process's own stop go on, now that the request has its end."""
        if self.fatal is not None:
            raise self.fatal


def failure_of(exc: BaseException, *, job: Job, engine: str) -> Failure:
    """Map whatever ended a request's run early to its status, error code and message.

    Every exception type maps to one.
    """
    fatal = exc if isinstance(exc, KeyboardInterrupt | SystemExit) else None
    if isinstance(exc, asyncio.CancelledError):
        return Failure(Status.CANCELLED, "cancelled", "request cancelled")
    if isinstance(exc, DeadlineUnattainable):
        return Failure(
            Status.TIMEOUT, "deadline_unattainable", f"{exc}, longer than its deadline allows"
        )
    if isinstance(exc, TimeoutError):
        return Failure(
            Status.TIMEOUT, "deadline_exceeded", "the request's deadline passed while it ran"
        )
    if isinstance(exc, RequestRefused):
        return Failure(Status.ERROR, "invalid_request", str(exc))
    if isinstance(exc, AdapterError):
        log.warning("request %s: %s", job.request_id, exc)
        return Failure(Status.ERROR, "adapter_unavailable", str(exc))
    # Every request the engine held ends so, as when their worker dies: the request did
    # nothing wrong and its client may retry, and breakers and SLIs count it as the platform's.
    if engine_died(exc):
        log.error("request %s: the %s died under it", job.request_id, engine, exc_info=exc)
        return Failure(
            Status.WORKER_LOST,
            "worker_lost",
            f"the {engine} serving this request died before it finished (the worker starts "
            "it again); partial output was billed",
            fatal,
        )
    log.error("request %s failed in the %s", job.request_id, engine, exc_info=exc)
    return Failure(
        Status.ERROR, "engine_error", f"the {engine} failed: {type(exc).__name__}", fatal
    )


def failure_stopped() -> Failure:
    """The end of a request its worker stopped running: the drain time (a node's notice, say
    a spot instance's) ran out first. Its client may retry; what it produced is billed."""
    return Failure(
        Status.WORKER_LOST,
        "worker_lost",
        "the worker serving this request stopped before it finished (its drain time ran out); "
        "partial output was billed",
    )


def failure_unstarted(code: str, status: Status) -> Failure:
    """The end of a request whose run never started: past its deadline, or cancelled."""
    return Failure(status, code, f"request ended before it started: {code}")


def failure_unended(job: Job, task: asyncio.Task[None]) -> Failure:
    """The end of a request its run did not end: cancelled before the run's first line, or the
    run failed in ending it."""
    if task.cancelled():
        return failure_unstarted("cancelled", Status.CANCELLED)
    log.error("request %s was not ended by its run", job.request_id, exc_info=task.exception())
    return failure_unstarted("engine_error", Status.ERROR)
