"""OpenAI-shaped errors: every rejection names its problem with a code and, where one, a field."""

from __future__ import annotations

import json

from django.http import HttpResponse

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

    def response(self) -> HttpResponse:
        response = HttpResponse(
            json.dumps(self.body()), status=self.status, content_type="application/json"
        )
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
