"""Every error code the platform can raise has a retry decision, and the table names no other.

The codes are collected from the source as it spells them (`ApiError(status, "code", ...)`,
`invalid(..., "code")`, `code="..."` on a failure or body problem, a worker's `Failure`), so a
new code without a decision in `SHOULD_RETRY` fails here rather than reaching clients with the
SDK's status-based guess.
"""

from __future__ import annotations

import re
from pathlib import Path

from dataplane.quotas import _REASONS
from inference.base.errors import SHOULD_RETRY, ApiError, should_retry
from inference.pipeline.relay import RELAY_FAILED

ROOT = Path(__file__).resolve().parents[3]
# Everything that raises an API error, or an error code a client can see.
SOURCES = ("inference", "dataplane", "workers", "batches", "config", "safety", "tenants")
CODE = r'"([a-z][a-z_]*)"'
PATTERNS = (
    re.compile(r"\bApiError\(\s*\d{3},\s*" + CODE),
    re.compile(r"\b(?:error_)?code=" + CODE),
    re.compile(r"\bFailure\(\s*Status\.\w+,\s*" + CODE),
    re.compile(r"\bfailure_unstarted\(\s*" + CODE),
    # invalid(param, message, "code"): a third positional argument, the message in pieces.
    re.compile(r'\binvalid\(\s*[^,()]+,\s*(?:f?"[^"]*"\s*)+,\s*' + CODE + r",?\s*\)"),
)


def _source_codes() -> dict[str, set[str]]:
    codes: dict[str, set[str]] = {}
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            text = path.read_text()
            for pattern in PATTERNS:
                for match in pattern.finditer(text):
                    codes.setdefault(match.group(1), set()).add(str(path.relative_to(ROOT)))
    return codes


def _produced() -> set[str]:
    # Codes that reach an ApiError through a variable: the quota reasons and the relay's own.
    return set(_source_codes()) | set(_REASONS.values()) | {RELAY_FAILED, "invalid_value"}


def test_the_collector_finds_the_codes_it_should():
    codes = _source_codes()
    # One of each way a code is spelled, so a collector that stopped matching fails here.
    for code in (
        "queue_full",  # ApiError(503, "queue_full", ...) across lines
        "worker_lost",  # code="worker_lost"
        "deadline_exceeded",  # a worker's Failure
        "mismatched_url",  # invalid(param, message, "code")
        "too_many_lines",  # invalid(..., code="...")
    ):
        assert code in codes, code


def test_every_code_the_platform_raises_has_a_retry_decision():
    missing = sorted(_produced() - set(SHOULD_RETRY))
    assert not missing, f"add these codes to SHOULD_RETRY in inference/base/errors.py: {missing}"


def test_the_table_names_no_code_the_platform_never_raises():
    stale = sorted(set(SHOULD_RETRY) - _produced())
    assert not stale, f"SHOULD_RETRY names codes nothing raises: {stale}"


def test_what_a_retry_can_and_cannot_fix():
    for code in ("rate_limit_exceeded", "concurrency_limit_exceeded", "queue_full"):
        assert SHOULD_RETRY[code] is True
    for code in ("internal_error", "model_unavailable", "idempotency_key_in_use"):
        assert SHOULD_RETRY[code] is True
    for code in ("deadline_exceeded", "timeout", "budget_exceeded", "context_length_exceeded"):
        assert SHOULD_RETRY[code] is False
    for code in ("invalid_value", "request_too_large", "invalid_api_key", "model_not_found"):
        assert SHOULD_RETRY[code] is False


def test_every_error_response_says_whether_to_retry():
    assert ApiError(503, "deadline_exceeded", "late").response()["x-should-retry"] == "false"
    assert ApiError(429, "rate_limit_exceeded", "slow").response()["x-should-retry"] == "true"
    assert ApiError(400, "invalid_json", "bad").response()["x-should-retry"] == "false"


def test_a_code_without_a_decision_falls_back_to_its_status():
    assert should_retry(503, "no_such_code") is True
    assert should_retry(429, "no_such_code") is True
    assert should_retry(400, "no_such_code") is False
    assert should_retry(404, "") is False
