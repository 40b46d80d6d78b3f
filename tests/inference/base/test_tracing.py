"""W3C trace context and the JSON log lines that carry request and trace ids."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from config.log_redaction import RedactFilter
from dataplane.tracing import ContextFilter, JsonFormatter, bind, trace_start
from tenants.keys import token_generate

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_it_continues_the_callers_trace_with_a_span_of_its_own():
    trace = trace_start(f"00-{TRACE}-{PARENT}-01")
    assert trace.trace_id == TRACE
    assert trace.span_id != PARENT and len(trace.span_id) == 16
    assert trace.traceparent == f"00-{TRACE}-{trace.span_id}-01"
    assert trace.child().trace_id == TRACE


def test_the_sampled_flag_is_kept():
    assert trace_start(f"00-{TRACE}-{PARENT}-00").traceparent.endswith("-00")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent
        f"ff-{TRACE}-{PARENT}-01",  # forbidden version
        f"00-{TRACE[:-1]}-{PARENT}-01",
    ],
)
def test_a_missing_or_malformed_header_starts_a_new_trace(header):
    trace = trace_start(header)
    assert len(trace.trace_id) == 32 and trace.trace_id != TRACE
    assert int(trace.trace_id, 16) != 0


def test_json_log_lines_carry_the_request_and_trace_ids():
    record = logging.LogRecord(
        "roundhouse.test", logging.INFO, __file__, 1, "hello %s", ("x",), None
    )
    bind(request_id="r123", trace_id=TRACE)
    ContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello x"
    assert line["level"] == "info"
    assert line["request_id"] == "r123" and line["trace_id"] == TRACE
    assert line["ts"].endswith("Z")


def _logged(logger_name: str, emit: Any) -> str:
    """What the platform's log handler writes when emit logs to a fresh logger."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_it_redacts_an_api_key_secret_and_keeps_its_public_id():
    public, token = token_generate()
    out = _logged("t.key", lambda log: log.warning("refused key %s for %s", token, "acme"))
    assert token not in out and public in out
    assert f"rh-{public}[redacted] for acme" in json.loads(out)["message"]


def test_it_redacts_bearer_credentials_in_messages_and_tracebacks():
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("upstream said: Authorization: Bearer abc.def-ghi rejected")
        except ValueError:
            log.exception("call failed with Bearer s3cr3t-t0ken")

    entry = json.loads(_logged("t.bearer", emit))
    assert "s3cr3t-t0ken" not in entry["message"] and "Bearer [redacted]" in entry["message"]
    assert "abc.def-ghi" not in entry["exception"]
    assert "Bearer [redacted] rejected" in entry["exception"]


def test_it_leaves_ordinary_lines_alone():
    out = _logged("t.plain", lambda log: log.info("engine ready in %.1fs", 1.25))
    assert json.loads(out)["message"] == "engine ready in 1.2s"
