"""Scoped service credentials: what an operator (and, later, a worker) authenticates with.

A project key sees its project's jobs and artifacts. What spans projects — worker
processes and their hosts (``GET /v1/workers``), queue gauges of every project
(``GET /metrics``) — needs a *service credential*: a key that belongs to no project and
carries scopes. ``curvplan keys create-operator --scope metrics:read --scope workers:read``
makes one; Prometheus sends it as ``Authorization: Bearer cpo_…``.

The same table and lookup serve the workers' credentials: a worker on another host creates
its own key with the scope ``worker`` through the database at start (:func:`create_worker_key`,
linked to its worker row) and revokes it at stop (:func:`revoke_worker_keys`); the reaper
revokes the keys of workers it marks stale. One design, scopes decide what each key may do:
a worker key reaches only the ``/v1/worker`` routes, a project key never does.
Only the sha256 of a key is stored, like project keys. The route dependency that checks a
request's service key, :func:`curvplan_server.auth.dependencies.require_scope`, is the server's.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy.orm import Session

from curvplan_core.credentials.keys import hash_key
from curvplan_core.credentials.models import ServiceCredential

OPERATOR_KEY_PREFIX = "cpo_"

#: Scope → what it allows.
SCOPES: dict[str, str] = {
    "metrics:read": "GET /metrics (queue gauges of every project, HTTP metrics)",
    "workers:read": "GET /v1/workers (hostnames, pids, queues, heartbeats of all workers)",
    "worker": "/v1/worker/blobs: a worker process reading and writing blobs (workers create "
    "their own)",
}
WORKER_SCOPE = "worker"


@dataclass(frozen=True, slots=True)
class ServiceContext:
    """An authenticated service credential and what it may do."""

    credential_id: uuid.UUID
    scopes: frozenset[str]


def new_service_key() -> str:
    """A new random service key (``cpo_`` + 32 random bytes), never stored in clear."""
    return OPERATOR_KEY_PREFIX + secrets.token_urlsafe(32)


def create_service_key(session: Session, scopes: Sequence[str], name: str | None = None) -> str:
    """Create a service credential with ``scopes``; return the clear key (shown once)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if not scopes or unknown:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(SCOPES)}, got {unknown}")
    key = new_service_key()
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


def create_worker_key(conn: Connection, worker_id: str) -> str:
    """Create the ``worker`` credential of worker row ``worker_id``; return the clear key.

    The worker keeps the clear key in memory and hands it to its attempt children; only
    the sha256 reaches the database.
    """
    key = new_service_key()
    conn.execute(
        insert(ServiceCredential).values(
            id=uuid.uuid4(),
            name=f"worker {worker_id}",
            prefix=key[:8],
            key_hash=hash_key(key),
            scopes=[WORKER_SCOPE],
            worker_id=worker_id,
        )
    )
    return key


def worker_key_valid(conn: Connection, key: str) -> bool:
    """Whether ``key`` is an unrevoked worker credential (the reaper may have revoked it)."""
    return bool(
        conn.execute(
            select(ServiceCredential.id).where(
                ServiceCredential.key_hash == hash_key(key),
                ServiceCredential.revoked_at.is_(None),
                ServiceCredential.worker_id.is_not(None),
            )
        ).first()
    )


def revoke_worker_keys(conn: Connection, worker_ids: Sequence[str]) -> int:
    """Revoke every unrevoked credential of these worker rows; return how many."""
    if not worker_ids:
        return 0
    result = conn.execute(
        update(ServiceCredential)
        .where(
            ServiceCredential.worker_id.in_(list(worker_ids)),
            ServiceCredential.revoked_at.is_(None),
        )
        .values(revoked_at=func.now())
    )
    return int(result.rowcount or 0)


def lookup_service_key(session: Session, key: str) -> ServiceContext | None:
    """The credential of a valid, unrevoked service key, else None."""
    row = session.execute(
        select(ServiceCredential.id, ServiceCredential.scopes).where(
            ServiceCredential.key_hash == hash_key(key), ServiceCredential.revoked_at.is_(None)
        )
    ).first()
    return ServiceContext(row[0], frozenset(row[1])) if row else None
