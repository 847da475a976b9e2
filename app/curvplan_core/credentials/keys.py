"""API keys: generation, hashing, creation and lookup.

A key is ``cp_`` followed by 32 random bytes in URL-safe base64. Only its
sha256 hex digest is stored, with the first 8 characters kept for display.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
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


def create_key(
    session: Session,
    project_name: str,
    key_name: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    """Create a key for ``project_name`` (and the project if missing); return the clear key.

    ``expires_at``: the key is refused from then on (None: it never expires)."""
    project = get_or_create_project(session, project_name)
    key = generate_key()
    session.add(
        ApiKey(
            id=uuid.uuid4(),
            project_id=project.id,
            prefix=key[:8],
            key_hash=hash_key(key),
            name=key_name,
            expires_at=expires_at,
        )
    )
    session.flush()
    return key


def lookup_key(session: Session, key: str) -> AuthContext | None:
    """The project of a valid key (neither revoked nor expired), else None."""
    row = session.execute(
        select(Project.id, Project.name)
        .join(ApiKey, ApiKey.project_id == Project.id)
        .where(
            ApiKey.key_hash == hash_key(key),
            ApiKey.revoked_at.is_(None),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > func.now()),
        )
    ).first()
    return AuthContext(row[0], row[1]) if row else None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` → a positive timedelta; ValueError otherwise."""
    value, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit not in _UNITS or not value.isdigit() or int(value) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30d, 12h, 90m, 2w or 45s")
    seconds = int(value) * _UNITS[unit]
    if seconds > 100 * 365 * 86400:
        raise ValueError(f"{text!r} is longer than 100 years")
    return timedelta(seconds=seconds)
