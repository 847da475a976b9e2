"""Pure-ASGI middleware: request body size limit and Prometheus HTTP metrics."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curvplan_server.metrics import HTTP_LATENCY, HTTP_REQUESTS
from curvplan_server.problems import Problem, problem_response


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
