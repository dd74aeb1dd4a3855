"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status."""
from __future__ import annotations

import re
from typing import Any

# The OpenAI error types clients switch on (openai-python maps them to exception classes by status).
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"
UNAVAILABLE = "service_unavailable_error"


class APIError(Exception):
    """A request the server refuses or could not finish: the status and the body the client gets."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, INVALID_REQUEST, param, code)


_LEADING_FIELD = re.compile(r"^([a-z_]+)[=:\s]")


def from_value_error(exc: ValueError, names: dict[str, str] | None = None) -> APIError:
    """An engine ValueError (it names the engine's field first) as a 400 naming the request field."""
    message = str(exc)
    m = _LEADING_FIELD.match(message)
    field = m.group(1) if m else None
    param = (names or {}).get(field, field) if field else None
    return bad_request(message, param)
