"""Which host names the service answers to, and how it writes its own absolute URLs.

A client's ``Host`` (and a proxy's ``X-Forwarded-*``) header is not to be trusted: a
trailing-slash redirect or a report link built from it points wherever the client said.

- ``CURVPLAN_PUBLIC_URL`` set: every absolute URL the service writes (a report link, a
  redirect's ``Location``) starts with it, whatever the request's headers say.
- Unset: requests must name one of ``CURVPLAN_ALLOWED_HOSTS`` (Starlette's
  ``TrustedHostMiddleware``; 400 otherwise), so URLs built from the request name a host the
  operator listed.

Forwarded headers are honoured only from ``CURVPLAN_FORWARDED_ALLOW_IPS`` (uvicorn's
``forwarded_allow_ips``; none by default).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curvplan_server.problems import problem_response


def base_url(request: Request) -> str:
    """The service's base URL (no trailing slash): the public URL, else the request's own
    (whose host the allow-list has checked)."""
    public = request.app.state.settings.public_url
    return (public or str(request.base_url)).rstrip("/")


class PublicLocationMiddleware:
    """Rewrite an absolute ``Location`` to start with the public URL (redirects that Starlette
    builds from the request's URL, e.g. the trailing-slash one)."""

    def __init__(self, app: ASGIApp, public_url: str) -> None:
        self.app = app
        self.public = public_url.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_public(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                location = headers.get("location")
                if location is not None:
                    parts = urlsplit(location)
                    if parts.scheme or parts.netloc:
                        rest = parts.path + (f"?{parts.query}" if parts.query else "")
                        headers["location"] = self.public + rest
            await send(message)

        await self.app(scope, receive, send_public)


class AllowedHostsMiddleware(TrustedHostMiddleware):
    """Starlette's host allow-list, answering a refused host with a 400 problem document."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allow_any:
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host", "").split(":")[0]
        allowed = any(
            host == pattern or (pattern.startswith("*") and host.endswith(pattern[1:]))
            for pattern in self.allowed_hosts
        )
        if allowed:
            await self.app(scope, receive, send)
            return
        response = problem_response(
            400,
            detail=f"the host {host!r} is not one this service answers to "
            "(CURVPLAN_ALLOWED_HOSTS, or set CURVPLAN_PUBLIC_URL)",
            instance=scope.get("path"),
        )
        await response(scope, receive, send)
