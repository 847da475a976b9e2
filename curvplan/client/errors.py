"""Exceptions raised by the curvplan client.

Every error the service answers is an RFC 9457 ``application/problem+json``
document; :class:`CurvplanError` carries its fields (``type``, ``title``,
``status``, ``detail``, ``instance``, ``errors``) and any extension members
(``extra``). The subclass tells the HTTP status class apart, so callers can write
``except NotFoundError`` instead of comparing numbers.
"""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue

from curvplan.types.json_types import ReadJson
from curvplan.types.problems import FieldErrorEntry

PROBLEM_MEDIA_TYPE = "application/problem+json"


class CurvplanError(Exception):
    """An error from the curvplan service (or from reaching it), with the problem fields."""

    def __init__(
        self,
        detail: str | None = None,
        *,
        status: int | None = None,
        type: str | None = None,
        title: str | None = None,
        instance: str | None = None,
        errors: list[FieldErrorEntry] | None = None,
        extra: dict[str, JsonValue] | None = None,
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.instance = instance
        self.errors = errors
        self.extra = extra or {}
        # The answer's X-Request-ID: the key to the service's log lines of the request.
        self.request_id: str | None = None
        super().__init__(self._message())

    def _message(self) -> str:
        head = " ".join(p for p in (str(self.status or ""), self.title or "") if p)
        text = f"{head}: {self.detail}" if head and self.detail else (head or self.detail or "")
        if self.errors:
            fields = "; ".join(
                f"{e.get('field', '?')}: {e.get('message', '')}" for e in self.errors[:5]
            )
            text = f"{text} [{fields}]"
        return text or type(self).__name__

    def to_dict(self) -> dict[str, ReadJson]:
        """The problem document (what the server sent, or the client's equivalent)."""
        out: dict[str, ReadJson] = {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.instance is not None:
            out["instance"] = self.instance
        if self.errors is not None:
            out["errors"] = [_error_json(e) for e in self.errors]
        out.update(self.extra)
        return out


def _error_json(error: FieldErrorEntry) -> ReadJson:
    return {
        "field": error["field"],
        "loc": error["loc"],
        "message": error["message"],
        "type": error["type"],
    }


class BadRequestError(CurvplanError):
    """400: the request could not be read (e.g. malformed JSON)."""


class AuthenticationError(CurvplanError):
    """401: missing, malformed, invalid or revoked API key (set CURVPLAN_API_KEY)."""


class PermissionDeniedError(CurvplanError):
    """403: the key may not do this."""


class NotFoundError(CurvplanError):
    """404: no such resource in the key's project."""


class ConflictError(CurvplanError):
    """409: the resource's state does not allow this (e.g. no recommendation yet)."""


class PayloadTooLargeError(CurvplanError):
    """413: the body (or artifact) is larger than the server accepts."""


class UnsupportedMediaTypeError(CurvplanError):
    """415: the body's media type is not accepted."""


class ValidationFailedError(CurvplanError):
    """422: invalid input; ``errors`` names every failing field."""


class RateLimitedError(CurvplanError):
    """429: too many requests."""


class ServerError(CurvplanError):
    """5xx other than a 503 that outlived the retries."""


class ServiceUnavailableError(ServerError):
    """503 after every retry (the service is starting, draining or overloaded)."""


class ConnectionFailedError(CurvplanError):
    """The service could not be reached (after every retry); ``status`` is None."""


class WaitTimeoutError(CurvplanError, TimeoutError):
    """``wait`` ran out of time before the job reached a terminal status; ``job`` is the last."""

    def __init__(self, detail: str, *, job: Any = None) -> None:
        super().__init__(detail, title="Wait Timed Out")
        self.job = job


class ArtifactIntegrityError(CurvplanError):
    """The server's sha256 of an uploaded artifact differs from the local file's."""


_BY_STATUS: dict[int, type[CurvplanError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: ValidationFailedError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}

_KNOWN_MEMBERS = ("type", "title", "status", "detail", "instance", "errors")


def error_for_status(status: int) -> type[CurvplanError]:
    """The exception class for an HTTP status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else CurvplanError


def error_from_problem(status: int, body: Any, fallback_detail: str | None = None) -> CurvplanError:
    """Build the exception for a response: its problem document, or ``fallback_detail``.

    A body that is not a problem object (a proxy's HTML page, say) still yields the
    right subclass, with the text as detail.
    """
    cls = error_for_status(status)
    if isinstance(body, dict) and ("title" in body or "detail" in body or "type" in body):
        errors = body.get("errors")
        return cls(
            _str_or_none(body.get("detail")),
            status=status,
            type=_str_or_none(body.get("type")),
            title=_str_or_none(body.get("title")),
            instance=_str_or_none(body.get("instance")),
            errors=errors if isinstance(errors, list) else None,
            extra={k: v for k, v in body.items() if k not in _KNOWN_MEMBERS},
        )
    return cls(fallback_detail, status=status, title=_reason(status))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
