"""The bearer-key dependencies: :data:`ProjectDep` (every /v1 route) and :func:`require_scope`
(the operator and worker routes, a service key with a scope)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from curvplan_core.credentials.keys import AuthContext, get_or_create_project, hash_key, lookup_key
from curvplan_core.credentials.service_keys import (
    OPERATOR_KEY_PREFIX,
    SCOPES,
    ServiceContext,
    lookup_service_key,
)
from curvplan_server.db import SessionDep
from curvplan_server.problems import Problem
from curvplan_server.ratelimit.policies import failed_authentication, refuse_if_locked_out

DEFAULT_PROJECT = "default"
T = TypeVar("T")


def _unauthorized(detail: str, error: str | None = None) -> Problem:
    challenge = 'Bearer realm="curvplan"'
    if error:
        challenge += f', error="{error}"'
    return Problem(401, detail, title="Unauthorized", headers={"WWW-Authenticate": challenge})


class KeyCache:
    """A small per-process cache of key hash → project, for ``ttl`` seconds.

    It saves one database round trip per request on the hot path; a revoked key
    stops working within ``ttl`` seconds (0 disables the cache).
    """

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[str, tuple[float, AuthContext]] = {}

    def get(self, key: str) -> AuthContext | None:
        if self.ttl <= 0:
            return None
        hit = self._entries.get(key)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, key: str, ctx: AuthContext) -> None:
        if self.ttl <= 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.ttl, ctx)


async def require_project(request: Request, session: SessionDep) -> AuthContext:
    """Resolve ``Authorization: Bearer <key>`` to its project, or answer 401.

    With ``CURVPLAN_AUTH_DISABLED=true`` every request acts as project ``default``.
    """
    return await authenticate(request, session)


async def authenticate(request: Request, session: Session) -> AuthContext:
    """The body of :func:`require_project`, callable directly from a hot-path endpoint."""
    settings = request.app.state.settings
    if settings.auth_disabled:
        project = await run_in_threadpool(
            query_and_release, get_or_create_project, session, DEFAULT_PROJECT
        )
        return AuthContext(project.id, project.name)
    header = request.headers.get("authorization")
    if not header:
        raise _unauthorized("missing Authorization header: send 'Authorization: Bearer <key>'")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise _unauthorized("the Authorization header must be 'Bearer <key>'", "invalid_request")
    cache: KeyCache = request.app.state.key_cache
    digest = hash_key(key)
    ctx = cache.get(digest)
    if ctx is None:
        refuse_if_locked_out(request)
        ctx = await run_in_threadpool(query_and_release, lookup_key, session, key)
        if ctx is None:
            refused = _unauthorized("invalid or revoked API key", "invalid_token")
            raise await failed_authentication(request, refused)
        cache.put(digest, ctx)
    return ctx


def query_and_release(query: Callable[..., T], session: Session, *args: Any) -> T:
    """Run ``query`` and commit in the same thread hop, handing the connection back.

    A connection kept while the request waits for its next thread can deadlock the pool
    under load: every pooled connection held by a request waiting for a thread, every
    thread waiting for a connection.
    """
    try:
        return query(session, *args)
    finally:
        session.commit()


ProjectDep = Annotated[AuthContext, Depends(require_project)]


def _problem(status: int, detail: str, error: str | None = None) -> Problem:
    challenge = 'Bearer realm="curvplan-operator"'
    if error:
        challenge += f', error="{error}"'
    headers = {"WWW-Authenticate": challenge}
    title = "Unauthorized" if status == 401 else "Forbidden"
    return Problem(status, detail, title=title, headers=headers)


def require_scope(scope: str) -> Callable[..., Any]:
    """A FastAPI dependency: the request carries a service key with ``scope``, else 401/403.

    A project key is a 403: it is valid, but it does not reach across projects.
    """
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def dependency(request: Request, session: SessionDep) -> ServiceContext:
        header = request.headers.get("authorization")
        need = f"an operator key with scope {scope} (curvplan keys create-operator --scope {scope})"
        if not header:
            raise _problem(401, f"missing Authorization header: this route needs {need}")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _problem(
                401, "the Authorization header must be 'Bearer <key>'", "invalid_request"
            )
        if not key.startswith(OPERATOR_KEY_PREFIX):
            raise _problem(403, f"a project key cannot use this route; it needs {need}", "scope")
        refuse_if_locked_out(request)
        ctx = await run_in_threadpool(query_and_release, lookup_service_key, session, key)
        if ctx is None:
            refused = _problem(401, "invalid or revoked operator key", "invalid_token")
            raise await failed_authentication(request, refused)
        if scope not in ctx.scopes:
            raise _problem(403, f"this operator key lacks the scope {scope}", "insufficient_scope")
        return ctx

    return dependency
