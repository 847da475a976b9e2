"""Project keys can expire: ``api_key.expires_at`` (NULL: never).

A key past its ``expires_at`` is refused like a revoked one (401). ``curvplan keys create
--expires-in 30d`` sets it; ``keys list`` shows it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_key", sa.Column("expires_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("api_key", "expires_at")
