"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure a client can cause is an `APIError` with the right 4xx status; the
app's handlers turn it (and malformed JSON, unknown routes, engine outages) into
that body, so clients' SDKs raise their usual typed exceptions. Nothing here
leaks a traceback.
"""

from __future__ import annotations

from typing import Any

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,  # noqa: A002 - OpenAI's field name
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json(self) -> bytes:
        return orjson.dumps(self.body())


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code or "invalid_request")


def not_found(message: str, param: str | None = None) -> APIError:
    return APIError(404, message, param=param, code="not_found")


def unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key")


def forbidden(message: str) -> APIError:
    return APIError(403, message, code="forbidden")


def conflict(message: str, param: str | None = None) -> APIError:
    return APIError(409, message, param=param, code="conflict", headers={"x-should-retry": "false"})


def context_length(message: str) -> APIError:
    return APIError(422, message, param="messages", code="context_length_exceeded")


def engine_unavailable(message: str, retry_after: int = 2) -> APIError:
    return APIError(
        503,
        message,
        code="engine_unavailable",
        headers={"retry-after": str(retry_after), "x-should-retry": "true"},
    )


def store_unavailable(message: str, retry_after: int = 5) -> APIError:
    """The store's database is down, full or unreachable: a call that could not be recorded is not answered."""
    return APIError(
        503,
        message,
        code="store_unavailable",
        headers={"retry-after": str(retry_after), "x-should-retry": "true"},
    )


def too_many(message: str, retry_after: float) -> APIError:
    return APIError(
        429,
        message,
        code="admission_refused",
        headers={"retry-after": str(max(1, round(retry_after))), "x-should-retry": "true"},
    )
