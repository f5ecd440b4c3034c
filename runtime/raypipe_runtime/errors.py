"""How a request fails: the exceptions callers raise, the error response and its HTTP status."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Seconds a client is told to wait after a node's backpressure when Serve names no delay of
# its own (`backpressure_config.retry_after_s`): a full queue drains within a few calls of the
# node, and HTTP counts whole seconds.
DEFAULT_RETRY_AFTER_S = 1

# Error codes and their HTTP statuses.
STATUS = {
    "INVALID_INPUT": 400,
    "NO_ROUTE": 422,
    "OUTPUT_SKIPPED": 422,
    "NODE_FAILED": 502,
    "NODE_INPUT": 502,
    "SELECT_MISSING": 502,
    "UNAVAILABLE": 502,
    "BACKPRESSURE": 503,
    "TIMEOUT": 504,
    "DEADLINE": 504,
    "INTERNAL": 500,
}

MAX_MESSAGE = 1000

# The error code of a failed node's call by its failure kind; any other kind is NODE_FAILED.
FAILURE_CODES = {"UNAVAILABLE": "UNAVAILABLE", "BACKPRESSURE": "BACKPRESSURE", "TIMEOUT": "TIMEOUT"}


class Unavailable(Exception):
    """Raised by a caller when the deployment's replica died or could not be reached."""


class Backpressure(Exception):
    """Raised by a caller when the call was rejected because the queue was full.
    `retry_after_s`: how long the client should wait, when the deployment says."""

    def __init__(self, message: str = "", retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after_seconds(retry_after_s: float | None) -> int:
    """The `Retry-After` value (whole seconds, rounded up, as Serve does) for a delay."""
    if (
        isinstance(retry_after_s, (int, float))
        and not isinstance(retry_after_s, bool)
        and math.isfinite(retry_after_s)
        and retry_after_s >= 0
    ):
        return math.ceil(retry_after_s)
    return DEFAULT_RETRY_AFTER_S


class GraphError(Exception):
    """A request failure: {"error": {code, node, message, attempts}} with an HTTP status."""

    def __init__(
        self,
        code: str,
        node: str | None,
        message: str,
        attempts: int = 0,
        status: int | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.node = node
        self.message = message[:MAX_MESSAGE]
        self.attempts = attempts
        self.status = status or STATUS.get(code, 500)
        self.retry_after = retry_after  # seconds, for the Retry-After header

    def body(self) -> dict:
        error: dict[str, Any] = {"code": self.code, "node": self.node, "message": self.message}
        if self.attempts:
            error["attempts"] = self.attempts
        return {"error": error}


@dataclass
class Failure:
    """How one node's call (or its input) failed, before its on_error policy is applied."""

    kind: str  # UNAVAILABLE, BACKPRESSURE, TIMEOUT, APP_ERROR, INPUT
    message: str
    attempts: int
    status: int | None = None
    code: str | None = None
    retry_after: int | None = None


def describe_exception(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def http_status_of(exc: BaseException) -> int | None:
    """An HTTP status < 500 that a user exception carries (`status_code` or `status`)."""
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 500:
            return value
    return None
