"""Pure-ASGI middleware: request body size limit, finite numbers in JSON bodies, and
Prometheus HTTP metrics."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curvplan.types.finite import NON_FINITE_MESSAGE, NON_FINITE_TYPE, non_finite_in_json
from curvplan_server.metrics import HTTP_LATENCY, HTTP_REQUESTS
from curvplan_server.problems import Problem, problem_response, validation_problem


class BodyTooLarge(Problem):
    """Raised from ``receive`` once a body grows past the limit (chunked uploads)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body exceeds the limit of {limit} bytes",
            title="Content Too Large",
            extra={"max_body_bytes": limit},
        )


class BodySizeLimitMiddleware:
    """Reject bodies larger than ``max_body_bytes`` without reading more than that.

    A declared ``Content-Length`` over the limit is answered 413 at once; a body
    without one (chunked) is counted as it streams and aborted when it passes
    the limit.
    """

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, path_limits: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        # Paths with their own limit (uploads stream to disk, not memory): exact paths, and
        # prefixes for keys that end in "/".
        self.path_limits = dict(path_limits or {})
        self._prefix_limits = [(p, n) for p, n in self.path_limits.items() if p.endswith("/")]

    def _limit_for(self, path: str) -> int:
        if path in self.path_limits:
            return self.path_limits[path]
        for prefix, limit in self._prefix_limits:
            if path.startswith(prefix):
                return limit
        return self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit_for(scope.get("path", ""))
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > limit:
                    status = 413 if declared > limit else 400
                    detail = (
                        f"the request body exceeds the limit of {limit} bytes"
                        if status == 413
                        else "invalid Content-Length header"
                    )
                    response = problem_response(
                        status,
                        title="Content Too Large" if status == 413 else "Bad Request",
                        detail=detail,
                        instance=scope.get("path"),
                        extra={"max_body_bytes": limit} if status == 413 else None,
                    )
                    await response(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _media_type(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.decode("latin-1").split(";", 1)[0].strip().lower()
    return ""


class FiniteNumbersMiddleware:
    """Refuse a JSON body that holds NaN, ±Infinity or a number beyond a double (``1e999``):
    a 422 naming each such field, before any route reads the body (``curvplan.types.finite``).

    Python's JSON parsers accept those tokens; without this a ``gt=0`` bound passes ``inf``
    and the job fails in the database (jsonb refuses it) or in the planner and the worker.
    Bodies sent as JSON (or without a Content-Type, which the job routes read as JSON) are
    buffered here, inside the body size limit; streamed uploads (``skip_prefixes``, when not
    sent as JSON) pass through untouched.
    """

    def __init__(self, app: ASGIApp, skip_prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.skip_prefixes = skip_prefixes

    def _checks(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            return False
        media = _media_type(scope)
        if media == "application/json" or media.endswith("+json"):
            return True
        return media == "" and not scope.get("path", "").startswith(self.skip_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._checks(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except Problem as exc:  # the size limit's 413, raised from its receive
            await problem_response(
                exc.status,
                title=exc.title,
                detail=exc.detail,
                type=exc.type,
                instance=scope.get("path"),
                extra=exc.extra,
            )(scope, receive, send)
            return
        body = b"".join(chunks)
        locations = non_finite_in_json(body, prefix=("body",))
        if locations:
            problem = validation_problem(
                [
                    {
                        "field": ".".join(str(p) for p in loc),
                        "loc": list(loc),
                        "message": NON_FINITE_MESSAGE,
                        "type": NON_FINITE_TYPE,
                    }
                    for loc in locations
                ]
            )
            await problem_response(
                422,
                title=problem.title,
                detail=problem.detail,
                type=problem.type,
                instance=scope.get("path"),
                errors=problem.errors,
            )(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class MetricsMiddleware:
    """Count requests and time them by method, route template and status code."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status_holder = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            method = scope.get("method", "")
            HTTP_REQUESTS.labels(method, template, str(status_holder[0])).inc()
            HTTP_LATENCY.labels(method, template).observe(time.perf_counter() - start)
