"""Per-project storage quotas: stored bytes and number of artifacts.

A project's usage is its uploaded and registered artifacts (``job_id IS NULL``): the bytes of
its stored blobs and the count of its rows. Job outputs are not counted — they belong to jobs
and go away with them (retention, ``curvplan gc``). Content shared with another project counts
for each project that uploaded it.

Limits come from ``CURVPLAN_PROJECT_MAX_STORAGE_BYTES`` and ``CURVPLAN_PROJECT_MAX_ARTIFACTS``
(unset: no limit). Going over the byte limit is a 413, over the count a 409; both
problem documents carry ``usage`` and ``quota`` so a client can tell what to delete.
The final check runs in the transaction that inserts the row, under a lock on the project
row, so two concurrent uploads cannot both squeeze under the limit.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from curvplan_server.problems import PROBLEM_TYPE_BASE, Problem


@dataclass(frozen=True)
class Quota:
    """The limits (None: unlimited)."""

    max_bytes: int | None
    max_artifacts: int | None

    @classmethod
    def from_settings(cls, settings: Any) -> Quota:
        return cls(settings.project_max_storage_bytes, settings.project_max_artifacts)

    @property
    def unlimited(self) -> bool:
        return self.max_bytes is None and self.max_artifacts is None

    def as_dict(self) -> dict[str, int | None]:
        return {"bytes": self.max_bytes, "artifacts": self.max_artifacts}


@dataclass(frozen=True)
class Usage:
    bytes: int
    artifacts: int

    def as_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "artifacts": self.artifacts}


def project_usage(conn: Connection, project_id: uuid.UUID) -> Usage:
    """Bytes and count of the project's uploaded/registered artifacts."""
    row = conn.execute(
        text(
            "SELECT coalesce(sum(size_bytes), 0), count(*) FROM artifact "
            "WHERE project_id = :p AND job_id IS NULL"
        ),
        {"p": project_id},
    ).one()
    return Usage(int(row[0]), int(row[1]))


def lock_project(conn: Connection, project_id: uuid.UUID) -> None:
    """Serialise quota decisions of one project until the transaction ends.

    ``FOR NO KEY UPDATE`` conflicts with itself but not with the ``FOR KEY SHARE`` that rows
    referencing the project take, so job submissions never wait for an upload's commit.
    """
    conn.execute(text("SELECT 1 FROM project WHERE id = :p FOR NO KEY UPDATE"), {"p": project_id})


def _over_bytes(usage: Usage, quota: Quota, detail: str) -> Problem:
    return Problem(
        413,
        detail,
        title="Storage Quota Exceeded",
        type=PROBLEM_TYPE_BASE + "storage-quota-exceeded",
        extra={"usage": usage.as_dict(), "quota": quota.as_dict()},
    )


def _over_count(usage: Usage, quota: Quota) -> Problem:
    return Problem(
        409,
        f"the project already has {usage.artifacts} artifacts, its limit is "
        f"{quota.max_artifacts}; delete some (DELETE /v1/artifacts/{{id}}) first",
        title="Artifact Quota Exceeded",
        type=PROBLEM_TYPE_BASE + "artifact-quota-exceeded",
        extra={"usage": usage.as_dict(), "quota": quota.as_dict()},
    )


def check_room(
    conn: Connection, project_id: uuid.UUID, quota: Quota, *, new_bytes: int, lock: bool
) -> Usage:
    """Raise the quota problem if one more artifact of ``new_bytes`` does not fit.

    ``lock``: take the project row lock first (the check right before the insert). Without it
    this is the cheap early check before an upload body is read.
    """
    if quota.unlimited:
        return Usage(0, 0)
    if lock:
        lock_project(conn, project_id)
    usage = project_usage(conn, project_id)
    if quota.max_artifacts is not None and usage.artifacts + 1 > quota.max_artifacts:
        raise _over_count(usage, quota)
    if quota.max_bytes is not None and usage.bytes + new_bytes > quota.max_bytes:
        left = max(quota.max_bytes - usage.bytes, 0)
        raise _over_bytes(
            usage,
            quota,
            f"the project stores {usage.bytes} of its {quota.max_bytes} bytes; "
            f"{new_bytes} more bytes do not fit ({left} left)",
        )
    return usage
