"""Scoped service credentials: what an operator (and, later, a worker) authenticates with.

A project key sees its project's jobs and artifacts. What spans projects — worker
processes and their hosts (``GET /v1/workers``), queue gauges of every project
(``GET /metrics``) — needs a *service credential*: a key that belongs to no project and
carries scopes. ``curvplan keys create-operator --scope metrics:read --scope workers:read``
makes one; Prometheus sends it as ``Authorization: Bearer cpo_…``.

The same table and lookup serve any later machine credential (a worker talking to the
API gets the scope ``worker``): one design, scopes decide what each key may do.
Only the sha256 of a key is stored, like project keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from curvplan_server.auth.dependencies import query_and_release
from curvplan_server.auth.keys import hash_key
from curvplan_server.auth.models import ServiceCredential
from curvplan_server.db import SessionDep
from curvplan_server.problems import Problem

OPERATOR_KEY_PREFIX = "cpo_"

#: Scope → what it allows. ``worker`` is reserved for worker processes (not used yet).
SCOPES: dict[str, str] = {
    "metrics:read": "GET /metrics (queue gauges of every project, HTTP metrics)",
    "workers:read": "GET /v1/workers (hostnames, pids, queues, heartbeats of all workers)",
    "worker": "reserved: a worker process talking to the API",
}


@dataclass(frozen=True, slots=True)
class ServiceContext:
    """An authenticated service credential and what it may do."""

    credential_id: uuid.UUID
    scopes: frozenset[str]


def create_service_key(session: Session, scopes: Sequence[str], name: str | None = None) -> str:
    """Create a service credential with ``scopes``; return the clear key (shown once)."""
    import secrets

    unknown = sorted(set(scopes) - set(SCOPES))
    if not scopes or unknown:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(SCOPES)}, got {unknown}")
    key = OPERATOR_KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ServiceCredential(
            id=uuid.uuid4(),
            name=name,
            prefix=key[:8],
            key_hash=hash_key(key),
            scopes=sorted(set(scopes)),
        )
    )
    session.flush()
    return key


def lookup_service_key(session: Session, key: str) -> ServiceContext | None:
    """The credential of a valid, unrevoked service key, else None."""
    row = session.execute(
        select(ServiceCredential.id, ServiceCredential.scopes).where(
            ServiceCredential.key_hash == hash_key(key), ServiceCredential.revoked_at.is_(None)
        )
    ).first()
    return ServiceContext(row[0], frozenset(row[1])) if row else None


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
        ctx = await run_in_threadpool(query_and_release, lookup_service_key, session, key)
        if ctx is None:
            raise _problem(401, "invalid or revoked operator key", "invalid_token")
        if scope not in ctx.scopes:
            raise _problem(403, f"this operator key lacks the scope {scope}", "insufficient_scope")
        return ctx

    return dependency
