"""API failures as ``metav1.Status`` bodies, with the constructors of apimachinery's errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localpv_emulator.apiserver.resources import Obj, ResourceType

if TYPE_CHECKING:
    from localpv_emulator.apiserver.validation import FieldErrors


_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    406: "NotAcceptable", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}


class ApiError(Exception):
    """An API failure, rendered as the ``metav1.Status`` body the real server sends."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: Obj | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.retry_after = retry_after

    def status(self) -> Obj:
        """The Status object for the response body or a watch ERROR event."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    # -- the constructors mirror k8s.io/apimachinery/pkg/api/errors

    @staticmethod
    def _details(rt: ResourceType, name: str, **extra: Any) -> Obj:
        details: Obj = {"name": name, "kind": rt.plural, **extra} if name else {"kind": rt.plural, **extra}
        if rt.group:
            details["group"] = rt.group
        return details

    @classmethod
    def not_found(cls, rt: ResourceType, name: str) -> ApiError:
        return cls(404, f'{rt.qualified} "{name}" not found', details=cls._details(rt, name))

    @classmethod
    def already_exists(cls, rt: ResourceType, name: str, deleting: bool = False) -> ApiError:
        prefix = "object is being deleted: " if deleting else ""
        return cls(409, f'{prefix}{rt.qualified} "{name}" already exists', "AlreadyExists",
                   cls._details(rt, name))

    @classmethod
    def conflict(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        return cls(409, f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}', "Conflict",
                   cls._details(rt, name))

    @classmethod
    def stale(cls, rt: ResourceType, name: str) -> ApiError:
        return cls.conflict(rt, name, "the object has been modified; please apply your changes to the "
                                      "latest version and try again")

    @classmethod
    def invalid(cls, rt: ResourceType, name: str, errors: FieldErrors) -> ApiError:
        msgs = [f"{f}: {body}" for f, _, body in errors.items]
        text = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
        causes = [{"reason": reason, "message": body, "field": f} for f, reason, body in errors.items]
        details: Obj = {"name": name, "kind": rt.kind, "causes": causes}
        if rt.group:
            details["group"] = rt.group
        return cls(422, f'{rt.kind} "{name}" is invalid: {text}', "Invalid", details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message, "BadRequest")

    @classmethod
    def expired(cls, message: str) -> ApiError:
        return cls(410, message, "Expired")

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(405, "the server does not allow this method on the requested resource",
                   "MethodNotAllowed", {})

    @classmethod
    def path_not_found(cls) -> ApiError:
        return cls(404, "the server could not find the requested resource", "NotFound", {})

    @classmethod
    def forbidden(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        subject = f'{rt.qualified} "{name}"' if name else rt.qualified
        return cls(403, f"{subject} is forbidden: {why}", "Forbidden", cls._details(rt, name))

    @classmethod
    def injected(cls, code: int) -> ApiError:
        """A failure asked for by :class:`Faults`; 429 carries Retry-After like the real server."""
        if code == 429:
            return cls(429, "Too many requests, please try again later.", "TooManyRequests",
                       {"retryAfterSeconds": 1}, retry_after=1)
        return cls(code, f"injected fault: HTTP {code}", details={})
