"""RFC 9457 problem details (``application/problem+json``) for every error response.

Raise :class:`Problem` (or one of its helpers) from service code; the handlers
installed by :func:`install_problem_handlers` also turn FastAPI/Starlette errors
(validation, unknown route, wrong method, oversized body, unexpected exceptions)
into problem documents. A body never contains a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import JsonValue
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from curvplan.types.json_types import ReadJson
from curvplan.types.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE, FieldErrorEntry
from curvplan_core.db import is_unavailable

log = logging.getLogger(__name__)


class Problem(Exception):
    """An error that becomes an ``application/problem+json`` response."""

    def __init__(
        self,
        status: int,
        detail: str | None = None,
        *,
        type: str | None = None,
        title: str | None = None,
        errors: Sequence[FieldErrorEntry] | None = None,
        headers: dict[str, str] | None = None,
        extra: Mapping[str, ReadJson] | None = None,
    ) -> None:
        super().__init__(detail or title or str(status))
        self.status = status
        self.detail = detail
        self.title = title or _default_title(status)
        self.type = type or _slug(self.title)
        self.errors = list(errors) if errors is not None else None
        self.headers = headers or {}
        self.extra = extra or {}


def _default_title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _slug(title: str) -> str:
    return PROBLEM_TYPE_BASE + "-".join(title.lower().replace("'", "").split())


#: Characters of client input (a field name, a key) one problem document repeats; longer
#: input is cut, saying how long it was (a 1 MB unknown field name was echoed in full).
MAX_ECHOED_CHARS = 200
#: Characters of a ``detail`` or an error ``message`` (both may quote client input).
MAX_DETAIL_CHARS = 2000
#: Field errors one problem lists; ``errors_omitted`` counts the rest.
MAX_FIELD_ERRORS = 100


def clip(text: str, limit: int = MAX_ECHOED_CHARS) -> str:
    """``text``, cut to ``limit`` characters with a note of its full length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def bounded_errors(errors: Sequence[FieldErrorEntry]) -> list[FieldErrorEntry]:
    """Field errors as a problem repeats them: at most :data:`MAX_FIELD_ERRORS`, every
    ``loc`` part and ``field`` cut to :data:`MAX_ECHOED_CHARS`, messages to
    :data:`MAX_DETAIL_CHARS`."""
    out: list[FieldErrorEntry] = []
    for error in errors[:MAX_FIELD_ERRORS]:
        loc = [clip(p) if isinstance(p, str) else p for p in error["loc"]]
        field = error["field"]
        if len(field) > MAX_ECHOED_CHARS:
            field = clip(".".join(str(p) for p in loc) if loc else field, MAX_DETAIL_CHARS)
        message = clip(error["message"], MAX_DETAIL_CHARS)
        out.append({"field": field, "loc": loc, "message": message, "type": error["type"]})
    return out


def _error_json(error: FieldErrorEntry) -> ReadJson:
    """One field error as the problem document's JSON carries it."""
    return {
        "field": error["field"],
        "loc": list(error["loc"]),
        "message": error["message"],
        "type": error["type"],
    }


def problem_response(
    status: int,
    *,
    title: str | None = None,
    detail: str | None = None,
    type: str | None = None,
    instance: str | None = None,
    errors: Sequence[FieldErrorEntry] | None = None,
    headers: dict[str, str] | None = None,
    extra: Mapping[str, ReadJson] | None = None,
) -> JSONResponse:
    """Build the problem+json response itself."""
    title = title or _default_title(status)
    body: dict[str, ReadJson] = {"type": type or _slug(title), "title": title, "status": status}
    if detail is not None:
        body["detail"] = clip(detail, MAX_DETAIL_CHARS)
    if instance is not None:
        body["instance"] = clip(instance, MAX_DETAIL_CHARS)
    if extra:
        body.update(
            {k: clip(v, MAX_DETAIL_CHARS) if isinstance(v, str) else v for k, v in extra.items()}
        )
    if errors is not None:  # client input (field names, keys) is echoed cut short
        body["errors"] = [_error_json(e) for e in bounded_errors(errors)]
        if len(errors) > MAX_FIELD_ERRORS:
            body["errors_omitted"] = len(errors) - MAX_FIELD_ERRORS
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


# --------------------------------------------------------------------------- helpers
def not_found(what: str = "resource") -> Problem:
    """404 for a missing resource (also for another project's resource: no existence leak)."""
    return Problem(404, f"{what} not found", title="Not Found")


def conflict(detail: str, **extra: ReadJson) -> Problem:
    """409: the request is valid but the resource's state does not allow it."""
    return Problem(409, detail, title="Conflict", extra=extra)


def field_errors_from_pydantic(
    errors: Sequence[Any], prefix: Sequence[str | int] = ()
) -> list[FieldErrorEntry]:
    """Convert pydantic ``ValidationError.errors()`` into ``[{field, loc, message, type}]``."""
    out: list[FieldErrorEntry] = []
    for err in errors:
        loc = [*prefix, *[p for p in err.get("loc", ()) if not _is_union_tag(p)]]
        out.append(
            {
                "field": ".".join(str(p) for p in loc) or "body",
                "loc": loc,
                "message": str(err.get("msg", "invalid value")),
                "type": str(err.get("type", "value_error")),
            }
        )
    return out


def _is_union_tag(part: Any) -> bool:
    # pydantic inserts the union member tag (e.g. 'plan', 'function-after[...]') into loc.
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def validation_problem(errors: Sequence[FieldErrorEntry], detail: str | None = None) -> Problem:
    """422 naming the failing fields (the detail names them cut short, the first few)."""
    shown = bounded_errors(errors)
    names = sorted({e["field"] for e in shown})
    fields = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return Problem(
        422,
        detail or f"invalid input: {fields}",
        title="Validation Failed",
        type=PROBLEM_TYPE_BASE + "validation-failed",
        errors=errors,
    )


# --------------------------------------------------------------------------- handlers
async def _problem_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem_response(
        exc.status,
        title=exc.title,
        detail=exc.detail,
        type=exc.type,
        instance=request.url.path,
        errors=exc.errors,
        headers=exc.headers,
        extra=exc.extra,
    )


async def _http_exception_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else None
    if status == 404 and detail == "Not Found":
        detail = f"no route matches {request.method} {request.url.path}"
    headers = dict(exc.headers or {})
    if status == 405:
        detail = f"method {request.method} is not allowed on {request.url.path}"
        allowed = _allowed_methods(request)
        if allowed:
            headers["Allow"] = ", ".join(allowed)
    return problem_response(status, detail=detail, instance=request.url.path, headers=headers)


_HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the path answers (Starlette's 405 names only the methods of
    the first route that matched the path, one of several), from the OpenAPI paths."""
    table = getattr(request.app.state, "allowed_methods", None)
    if table is None:
        table = []
        for template, operations in request.app.openapi().get("paths", {}).items():
            methods = {m.upper() for m in operations if m in _HTTP_METHODS}
            if "GET" in methods:
                methods.add("HEAD")  # Starlette answers HEAD wherever it answers GET
            table.append((compile_path(template)[0], methods))
        request.app.state.allowed_methods = table
    found: set[str] = set()
    for pattern, methods in table:
        if pattern.match(request.url.path):
            found |= methods
    return sorted(found)


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in raw):
        return problem_response(
            400,
            title="Malformed JSON",
            detail="the request body is not valid JSON",
            instance=request.url.path,
        )
    errors = field_errors_from_pydantic(raw)
    problem = validation_problem(errors)
    return await _problem_handler(request, problem)


#: What a 503 for a lost database tells the client to wait, in seconds.
RETRY_AFTER_SECONDS = 1


def unavailable_response(path: str | None) -> JSONResponse:
    """The 503 ``…/database-unavailable`` answer, with ``Retry-After``."""
    return problem_response(
        503,
        title="Service Unavailable",
        type=PROBLEM_TYPE_BASE + "database-unavailable",
        detail="the database is unavailable; retry after the delay in Retry-After (a job "
        "submission with the same Idempotency-Key, which never creates a second job)",
        instance=path,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def _unhandled_handler(request: Request, exc: Exception) -> JSONResponse:
    if is_unavailable(exc):  # a lost database wrapped in another exception: still a 503
        log.warning("database unavailable on %s %s", request.method, request.url.path)
        return unavailable_response(request.url.path)
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response(
        500,
        title="Internal Server Error",
        detail="an unexpected error occurred; it has been logged",
        instance=request.url.path,
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Register the problem+json handlers on ``app``."""
    app.add_exception_handler(Problem, _problem_handler)
    app.add_exception_handler(StarletteHTTPException, _http_exception_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(Exception, _unhandled_handler)


#: Where the problem document's schema lives in the OpenAPI components (added by main).
PROBLEM_SCHEMA_REF = "#/components/schemas/ProblemDocument"

_PROBLEM_DESCRIPTIONS = {
    400: "Malformed request (e.g. the body is not valid JSON)",
    401: "Missing or invalid API key",
    403: "A valid key without access: an operator route needs a service key with its scope",
    404: "No such resource in the caller's project",
    409: "The resource's state does not allow the request",
    413: "The request body is too large",
    415: "Unsupported Content-Type",
    422: "Invalid input; `errors` names each failing field",
    500: "Unexpected server error (logged; no traceback in the body)",
    503: "Not ready, or the database is unavailable (Retry-After says when to retry)",
}


def problem_responses(*codes: int, **descriptions: str) -> dict[int | str, dict[str, JsonValue]]:
    """OpenAPI ``responses`` entries: each code answers an ``application/problem+json`` body.
    Each entry is an OpenAPI Response Object, a fragment of the OpenAPI document: JSON, as
    FastAPI's ``responses=`` takes it and merges it into the document.

    ``descriptions`` adds a code with its own description (``_409="already finished"``).
    """
    codes = tuple(sorted({*codes, *(int(key[1:]) for key in descriptions)}))
    return {
        code: {
            "description": descriptions.get(f"_{code}", _PROBLEM_DESCRIPTIONS.get(code))
            or _default_title(code),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": PROBLEM_SCHEMA_REF}}},
        }
        for code in codes
    }


#: The problems any authenticated route can answer.
PROBLEM_RESPONSES: dict[int | str, dict[str, JsonValue]] = problem_responses(
    400, 401, 404, 409, 413, 415, 422, 500, 503
)
