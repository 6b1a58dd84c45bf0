"""What an API failure means: the exception classes, and the one classifier.

Every call to the API server goes through :mod:`localpv.kube.api`, which turns HTTP
statuses, transport failures and undecodable answers into the exceptions below - and
nothing else leaves the kube layer. Callers branch on the exception class, never on
status codes:

* :class:`Retryable` - connection refused/reset, timeouts, 429 and 5xx: the same request
  may succeed later (``retry_after`` carries the server's Retry-After hint).
  :class:`BadResponse` is the Retryable kind for an answer that is not what the API sends
  (HTML from a proxy, a body that is not a JSON object, a watch line that is not an event).
* :class:`Conflict` - 409 on a stale resourceVersion or a failed precondition: re-read
  and decide again (it is not retried blindly: the decision may change).
* :class:`AlreadyExists`, :class:`NotFound` - facts about the object, usually expected.
* :class:`Gone` - 410 on a watch or list continuation: relist.
* :class:`Permanent` - everything else (400, 401, 403, 422...): retrying cannot help; report.

Where retries happen is said in :mod:`localpv.kube.api`.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """A failed API request. ``status`` is the HTTP code (0 for transport errors)."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class Retryable(ApiError):
    """Transient: the same request may succeed later."""


class BadResponse(Retryable):
    """The server (or something in front of it) answered with what the API never sends."""


class Conflict(ApiError):
    """409 Conflict: the object changed since it was read, or a precondition failed."""


class AlreadyExists(ApiError):
    """409 AlreadyExists on create."""


class NotFound(ApiError):
    """404 NotFound."""


class Gone(ApiError):
    """410 Gone/Expired: the requested resourceVersion is too old; relist."""


class Permanent(ApiError):
    """Will not succeed by retrying (bad request, forbidden, invalid, ...)."""


def error_from_response(status: int, body: bytes | str | None, headers: Any = None) -> ApiError:
    """Build the right :class:`ApiError` from an HTTP error response (a metav1.Status)."""
    reason, message = "", ""
    try:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
        doc = json.loads(text) if text else {}
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or "")
            message = str(doc.get("message") or "")
    except ValueError:
        # Not a Status object (a proxy's HTML page, say): keep a short excerpt only, so
        # that whatever the body holds does not flood the logs.
        message = text[:256] if isinstance(text, str) else ""
    retry_after = _retry_after(headers)
    return classify_status(status, reason, message or f"HTTP {status}", retry_after)


def _retry_after(headers: Any) -> float | None:
    """The Retry-After header in seconds (what kube-apiserver sends); None if absent or not a number."""
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def classify_status(status: int, reason: str, message: str, retry_after: float | None = None) -> ApiError:
    """Map an HTTP status (and the Status ``reason``) to an exception class."""
    if status == 404:
        return NotFound(status, reason or "NotFound", message)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(status, reason, message)
        return Conflict(status, reason or "Conflict", message)
    if status == 410:
        return Gone(status, reason or "Expired", message)
    if status == 429 or status >= 500:
        return Retryable(status, reason or "ServerError", message, retry_after=retry_after)
    return Permanent(status, reason or "Error", message)


def transport_error(exc: BaseException) -> Retryable:
    """A connection-level failure (refused, reset, timed out, protocol error)."""
    return Retryable(0, "Transport", f"{type(exc).__name__}: {exc}")


def bad_response(what: str, raw: bytes | str) -> BadResponse:
    """An answer that is not what the API sends; keeps a short excerpt only (it may be a page of HTML)."""
    excerpt = raw[:120] if isinstance(raw, str) else raw[:120].decode("utf-8", "replace")
    return BadResponse(0, "BadResponse", f"{what}: {excerpt!r}")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter, capped; ``attempts`` bounds the tries."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    attempts: int = 6
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay before retry number ``attempt`` (1-based)."""
        base = min(self.maximum, self.initial * self.factor ** max(0, attempt - 1))
        spread = base * self.jitter
        return base - spread + (rng or random).random() * spread * 2


NO_RETRY = Backoff(attempts=1)
