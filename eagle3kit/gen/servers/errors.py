"""The errors of an exchange with a server: the class tells the scheduler what to do.

Retry with a fresh attempt (`RetryableError`), record the sample as rejected
(`RequestRejected`), or stop using that server (`ServerFatal`).
"""

from __future__ import annotations

import re

CONTEXT_RE = re.compile(
    r"context length|maximum model length|max_model_len|too large|longer than|too long", re.I
)
"""What servers say when a prompt and its max_tokens do not fit the context."""


class ServerError(Exception):
    """A failed exchange with one server. `reason` is a short tag for counting and logs."""

    def __init__(self, message: str, *, url: str, reason: str, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.reason = reason
        self.status = status


class RetryableError(ServerError):
    """Transient: connect errors, resets, timeouts, 429 and 5xx, server-side aborts. Retry it."""


class RequestRejected(ServerError):
    """The server refused this request (400: `reason` context_length or bad_request). Never
    retried: record the sample with the reason."""


class BadAnswer(RetryableError):
    """An answer whose output ids cannot be stored (not integers, negative, past int32 or the
    vocabulary): a violation that is counted and retried, never written as data."""

    def __init__(self, message: str, *, url: str, violations: list[str]):
        super().__init__(message, url=url, reason="bad_ids")
        self.violations = violations


class ServerFatal(ServerError):
    """The server cannot serve this run (wrong model name or endpoint, API key refused, no
    token ids): stop sending to it. The message names the URL."""


def rejection_reason(message: str) -> str:
    """The reason of a 400: context_length when the server says the request is too long."""
    return "context_length" if CONTEXT_RE.search(message) else "bad_request"
