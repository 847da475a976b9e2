"""The ``job_artifact`` link table: which artifacts each job's body names.

"Is this artifact in use" (``DELETE /v1/artifacts/{id}`` refuses while a live job uses it) was
a text search of every live job's JSONB request; it is now an index lookup on
``job_artifact.artifact_id``. One row per artifact id in a job's body: ``field`` is its dotted
path (``checkpoint``, ``checkpoint.1`` for a checkpoint's second shard,
``intermediate_checkpoints.0``, ``train_data`` …). Rows go with their job and with their
artifact (``ON DELETE CASCADE``).

The back-fill reads the existing jobs' requests with the artifact fields each kind declared
when this revision was written (frozen here, not imported: a later kind change must not
rewrite history), and links only ids that are artifacts of the job's own project.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 16:00:00
"""

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: kind → the body fields that named artifacts at this revision (curvplan.types.jobs).
ARTIFACT_FIELDS: dict[str, tuple[str, ...]] = {
    "analyze": ("dataset", "checkpoint", "intermediate_checkpoints"),
    "analyze_blocks": ("dataset", "checkpoint"),
    "sweep": ("checkpoint", "train_data", "eval_data"),
    "sweep_point": ("checkpoint", "train_data", "eval_data"),
}
BATCH = 500

_LINK = sa.text(
    "INSERT INTO job_artifact (job_id, artifact_id, field)"
    " SELECT :job_id, a.id, :field FROM artifact a"
    " WHERE a.id = :artifact_id AND a.project_id = :project_id"
)


def _ids(path: str, value: Any) -> Iterator[tuple[str, uuid.UUID]]:
    """(dotted path, id) of a field's value: an id, a list of ids, a list of those."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _ids(f"{path}.{i}", item)
    elif isinstance(value, str):
        try:
            yield path, uuid.UUID(value)
        except ValueError:
            return


def _backfill(conn: sa.Connection) -> None:
    last: uuid.UUID | None = None
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT id, project_id, kind, request FROM job"
                " WHERE kind = ANY(:kinds) AND (CAST(:last AS uuid) IS NULL OR id > :last)"
                " ORDER BY id LIMIT :n"
            ),
            {"kinds": list(ARTIFACT_FIELDS), "last": last, "n": BATCH},
        ).all()
        if not rows:
            return
        links = [
            {"job_id": row.id, "project_id": row.project_id, "field": path, "artifact_id": ref}
            for row in rows
            if isinstance(row.request, dict)
            for name in ARTIFACT_FIELDS[row.kind]
            for path, ref in _ids(name, row.request.get(name))
        ]
        if links:
            conn.execute(_LINK, links)
        last = rows[-1].id


def upgrade() -> None:
    op.create_table(
        "job_artifact",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("field", sa.Text(), nullable=False),
        sa.Column("artifact_id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_job_artifact_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["artifact.id"],
            name=op.f("fk_job_artifact_artifact_id_artifact"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "field", name=op.f("pk_job_artifact")),
    )
    op.create_index(op.f("ix_job_artifact_artifact_id"), "job_artifact", ["artifact_id"])
    _backfill(op.get_bind())


def downgrade() -> None:
    op.drop_index(op.f("ix_job_artifact_artifact_id"), table_name="job_artifact")
    op.drop_table("job_artifact")
