"""OpenAI-shaped errors: every rejection names its problem with a code and, where one, a field."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

from config.json_body import shown

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

# The Anthropic Messages API (inference.messages.protocol) answers its errors in Anthropic's
# shape: the error's type by the status, as Anthropic's SDKs read it.
ANTHROPIC_PATH = "/v1/messages"
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

# Whether sending the same request again can succeed, per error code: every HTTP error carries
# the answer as `x-should-retry: true|false`, which the official OpenAI SDKs obey before their
# own rule (they retry 408, 409, 429 and every 5xx). A deadline that passed is not retried: the
# same deadline passes again, and each run bills what it made. docs/api.md lists this table;
# tests/inference/base/test_should_retry.py checks that every code the platform can raise is here.
SHOULD_RETRY: dict[str, bool] = {
    # The platform is short of capacity or briefly unreachable: a retry soon can succeed.
    "rate_limit_exceeded": True,
    "tokens_per_minute_exceeded": True,
    "concurrency_limit_exceeded": True,
    "body_bytes_exceeded": True,
    "too_many_streams": True,
    "too_many_frames": True,  # a socket flooded with frames was closed: send slower on a new one
    "queue_full": True,
    "deadline_unattainable": True,  # refused before it ran: the queue ahead may drain
    "model_unavailable": True,
    "adapter_unavailable": True,
    "tokenizer_unavailable": True,
    "service_unavailable": True,
    "not_ready": True,
    "idempotency_key_in_use": True,  # the request with that key ends, then its result replays
    # The platform failed this request: a fresh run can succeed.
    "internal_error": True,
    "engine_error": True,
    "worker_lost": True,
    "stream_ended": True,
    "relay_failed": True,
    # The request's deadline passed, or it was cancelled: the same request ends the same way.
    "deadline_exceeded": False,
    "timeout": False,
    "cancelled": False,
    # Only the tenant's operator can fix these (a budget is spent until the month ends).
    "budget_exceeded": False,
    "tenant_disabled": False,
    "insufficient_scope": False,
    # The key or the request itself is wrong: the same request fails the same way.
    "missing_api_key": False,
    "invalid_authorization_header": False,
    "invalid_api_key": False,
    "revoked_api_key": False,
    "expired_api_key": False,
    "invalid_json": False,
    "invalid_type": False,
    "invalid_value": False,
    "invalid_request": False,
    "invalid_message": False,
    "invalid_body": False,
    "invalid_id": False,
    "invalid_endpoint": False,
    "invalid_method": False,
    "missing_required_parameter": False,
    "unsupported_parameter": False,
    "max_tokens_exceeded": False,
    "context_length_exceeded": False,
    "array_above_max_length": False,  # more messages than a request may hold
    "prompt_too_complex": False,  # a truncation's search ran out of time: send fewer messages
    "content_policy_violation": False,
    "chat_template_missing": False,
    "wrong_endpoint_for_model": False,
    "request_too_large": False,
    "frame_too_large": False,
    "exceeds_queue_capacity": False,  # larger than its deployment's queue takes at all
    "file_too_large": False,
    "storage_limit_exceeded": False,  # the tenant's files fill their share: delete some first
    "file_in_use": False,  # a running batch reads the file: it ends, or is cancelled, first
    "too_many_lines": False,
    "missing_custom_id": False,
    "duplicate_custom_id": False,
    "duplicate_id": False,
    "mismatched_url": False,
    "idempotency_key_reused": False,
    "batch_not_cancellable": False,
    "model_not_found": False,
    "request_not_found": False,
    "response_not_found": False,
    "conversation_not_found": False,
    "item_not_found": False,
    "file_not_found": False,
    "batch_not_found": False,
    "not_found": False,
    "method_not_allowed": False,
}


def should_retry(status: int, code: str) -> bool:
    """Whether a retry of a request refused with `status` and `code` can succeed."""
    decided = SHOULD_RETRY.get(code)
    if decided is not None:
        return decided
    return status in (408, 409, 429) or status >= 500  # a code not in the table: the SDK's rule


class ApiError(Exception):
    """A request the platform refuses, with what the client needs to fix or retry it."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.headers = headers or {}

    def with_headers(self, headers: dict[str, str]) -> ApiError:
        """Return this error carrying extra response headers."""
        self.headers = {**headers, **self.headers}
        return self

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        """The error in Anthropic's body: `type` by the status, as Anthropic's SDKs read it,
        the platform's `code` and `param` kept beside the message."""
        default = "api_error" if self.status >= 500 else "invalid_request_error"
        return {
            "type": "error",
            "error": {
                "type": ANTHROPIC_TYPES.get(self.status, default),
                "message": self.message,
                "code": self.code,
                "param": self.param,
            },
        }

    def response(self, path: str = "") -> HttpResponse:
        """The error as a response to a request for `path`: in Anthropic's shape on the
        Messages API's paths, in OpenAI's everywhere else."""
        body = self.anthropic_body() if path.startswith(ANTHROPIC_PATH) else self.body()
        response = HttpResponse(
            json.dumps(body), status=self.status, content_type="application/json"
        )
        response["x-should-retry"] = "true" if should_retry(self.status, self.code) else "false"
        if self.retry_after is not None:
            response["Retry-After"] = str(max(1, round(self.retry_after)))
            response["retry-after-ms"] = str(int(self.retry_after * 1000))
        for name, value in self.headers.items():
            response[name] = value
        if self.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="roundhouse"'
        return response


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    """Return a 400 naming the field at fault."""
    return ApiError(400, code, message, param=param)


def unrecognized(name: str) -> ApiError:
    """Return the 400 for a field the endpoint does not have, naming it (shortened if long)."""
    shortened = shown(name)
    message = f"Unrecognized request argument supplied: {shortened}."
    return ApiError(400, "unsupported_parameter", message, param=shortened)


def internal_error() -> ApiError:
    """The answer to a failure of the platform itself."""
    return ApiError(500, "internal_error", "The platform failed to handle this request.")
