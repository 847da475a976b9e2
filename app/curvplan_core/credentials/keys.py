"""API keys: generation, hashing, creation and lookup.

A key is ``cp_`` followed by 32 random bytes in URL-safe base64. Only its
sha256 hex digest is stored, with the first 8 characters kept for display.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from curvplan_core.credentials.models import ApiKey, Project

KEY_PREFIX = "cp_"


def generate_key() -> str:
    """A new random API key (shown to the user once, never stored)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of a key: sha256 hex digest of its UTF-8 bytes."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class AuthContext:
    """Who is calling: the project every read and write is scoped to."""

    project_id: uuid.UUID
    project_name: str


def get_or_create_project(session: Session, name: str) -> Project:
    """The project called ``name``, created if missing (safe under concurrency)."""
    session.execute(
        insert(Project)
        .values(id=uuid.uuid4(), name=name)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    return session.execute(select(Project).where(Project.name == name)).scalar_one()


def create_key(session: Session, project_name: str, key_name: str | None = None) -> str:
    """Create a key for ``project_name`` (and the project if missing); return the clear key."""
    project = get_or_create_project(session, project_name)
    key = generate_key()
    session.add(
        ApiKey(
            id=uuid.uuid4(),
            project_id=project.id,
            prefix=key[:8],
            key_hash=hash_key(key),
            name=key_name,
        )
    )
    session.flush()
    return key


def lookup_key(session: Session, key: str) -> AuthContext | None:
    """The project of a valid, unrevoked key, else None."""
    row = session.execute(
        select(Project.id, Project.name)
        .join(ApiKey, ApiKey.project_id == Project.id)
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    ).first()
    return AuthContext(row[0], row[1]) if row else None
