"""``X-Request-ID``: an id on every response and in every log line of its request.

The id is the request's own ``X-Request-ID`` when it sends one (a proxy's or a pipeline's, so
one id follows a call through every hop), reduced to the characters ``[A-Za-z0-9._:/+=@-]``
and at most :data:`MAX_REQUEST_ID_LENGTH` of them; otherwise (none, or nothing left of it) a
new random one. It is bound to the logging context (``curvplan_core.logging.bind``) for the
whole request, so every line logged while serving it carries ``request_id``: the
application's, the unhandled-error handler's and uvicorn's access line (logged as the
response starts).

The middleware wraps the whole application, outside Starlette's error middleware, so a 500
answer carries the header too (:func:`install_request_id`).
"""

from __future__ import annotations

import re
import uuid

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curvplan_core.logging import bind

REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID_LENGTH = 128
_HEADER_KEY = REQUEST_ID_HEADER.lower().encode()
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/+=@-]")


def request_id_from(value: bytes | None) -> str:
    """The id to use for a request whose ``X-Request-ID`` is ``value`` (None: not sent)."""
    if value:
        kept = _UNSAFE.sub("", value[: 4 * MAX_REQUEST_ID_LENGTH].decode("latin-1"))
        if kept:
            return kept[:MAX_REQUEST_ID_LENGTH]
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Give each HTTP request its id: in the log context, in ``scope["state"]`` and on the
    response's ``X-Request-ID`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == _HEADER_KEY), None)
        request_id = request_id_from(given)
        scope.setdefault("state", {})["request_id"] = request_id
        encoded = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER_KEY]
                message["headers"] = [*kept, (_HEADER_KEY, encoded)]
            await send(message)

        with bind(request_id=request_id):
            await self.app(scope, receive, send_with_id)


def install_request_id(app: Starlette) -> None:
    """Wrap ``app``'s whole middleware stack (error middleware included) in
    :class:`RequestIdMiddleware`: ``add_middleware`` would place it inside the error
    middleware, and a 500 would leave without the header."""
    build = app.build_middleware_stack

    def build_with_request_id() -> ASGIApp:
        return RequestIdMiddleware(build())

    app.build_middleware_stack = build_with_request_id  # type: ignore[method-assign]
