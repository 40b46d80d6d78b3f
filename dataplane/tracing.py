"""W3C trace context for requests, and the log records that carry it.

A frontend reads the client's `traceparent` header (or starts a trace), gives the request its
own span, and puts both in the job envelope; the worker logs under the same trace and the usage
record keeps the trace id, so one id finds a request in logs, traces and billing.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclass(frozen=True)
class TraceContext:
    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits: this hop's span
    sampled: bool = True

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"

    def child(self) -> TraceContext:
        """Return a new span of the same trace (the next hop's)."""
        return TraceContext(trace_id=self.trace_id, span_id=span_id_new(), sampled=self.sampled)


def span_id_new() -> str:
    return secrets.token_hex(8)


def trace_start(traceparent: str | None) -> TraceContext:
    """Continue the caller's trace with a new span, or start a trace when it sent none.

    A malformed header is ignored rather than refused, as the W3C recommendation says.
    """
    if traceparent:
        found = _TRACEPARENT.match(traceparent.strip().lower())
        if found is not None:
            version, trace_id, _parent, flags = found.groups()
            if version != "ff" and trace_id != _ZERO_TRACE and _parent != _ZERO_SPAN:
                return TraceContext(
                    trace_id=trace_id, span_id=span_id_new(), sampled=bool(int(flags, 16) & 1)
                )
    return TraceContext(trace_id=secrets.token_hex(16), span_id=span_id_new())


# What the code running now works on: set per request by the frontend and per job by workers.
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")


def bind(*, request_id: str, trace_id: str) -> None:
    """Tag the log records of the current task (and the tasks it starts) with a request."""
    request_id_var.set(request_id)
    trace_id_var.set(trace_id)


class ContextFilter(logging.Filter):
    """Add the current request id and trace id to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.trace_id = trace_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request and trace ids."""

    converter = time.gmtime  # type: ignore[assignment]

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": os.getpid(),
        }
        for name in ("request_id", "trace_id"):
            value = getattr(record, name, "")
            if value:
                entry[name] = value
        if record.exc_text:
            entry["exception"] = record.exc_text
        elif record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
