"""The storing end of an upload: quota, blob placement and the row, in one transaction.

``commit_upload`` is what ``POST /v1/artifacts`` runs once the streamed file is hashed and
validated; ``register_uri`` the same for a ``file://`` registration; ``early_quota_check``
refuses an upload before its body is read when its declared size cannot fit.
"""

from __future__ import annotations

import contextlib
import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from curvplan_core.artifacts.blobstore import BlobStore, BlobWriter
from curvplan_core.artifacts.safetensors_format import SafetensorsSummary
from curvplan_core.storage.blobs import delete_if_unreferenced, lock_blob, place_blob
from curvplan_server.artifacts import service
from curvplan_server.storage.quota import Quota, check_room


def _existing_upload(session: Session, project_id: uuid.UUID, kind: str, sha256: str) -> bool:
    return (
        session.execute(
            text(
                "SELECT 1 FROM artifact WHERE project_id = :p AND kind = :k AND sha256 = :s "
                "AND job_id IS NULL AND storage = 'blob'"
            ),
            {"p": project_id, "k": kind, "s": sha256},
        ).first()
        is not None
    )


def commit_upload(
    session: Session,
    store: BlobStore,
    writer: BlobWriter,
    project_id: uuid.UUID,
    kind: str,
    name: str | None,
    summary: SafetensorsSummary,
    quota: Quota,
    preview: int = 100,
) -> service.Stored:
    """Quota check, blob into place and row inserted, committed under the blob's lock.

    Content the project already stored answers its existing row (no quota charge). On any
    failure nothing is left: the temp file is the caller's to abort, and a blob this call
    placed is removed again (under its lock) unless another row references it.
    """
    sha256 = writer.sha256
    assert sha256 is not None, "finish() the blob before committing it"
    placed = False
    try:
        conn = session.connection()
        lock_blob(conn, sha256)
        if not _existing_upload(session, project_id, kind, sha256):
            check_room(conn, project_id, quota, new_bytes=writer.size, lock=True)
        place_blob(conn, store, writer.temp_path, sha256)
        placed = True
        stored = service.insert_blob_artifact(
            session,
            project_id,
            kind=kind,
            name=name,
            sha256=sha256,
            size=writer.size,
            summary=summary,
            preview=preview,
        )
        session.commit()
    except BaseException:
        session.rollback()
        if placed:
            with contextlib.suppress(Exception):
                delete_if_unreferenced(session.connection(), store, sha256)
                session.commit()
            session.rollback()
        raise
    return stored


def register_uri(
    session: Session,
    project_id: uuid.UUID,
    *,
    kind: str,
    uri: str,
    name: str | None,
    quota: Quota,
) -> service.ArtifactJson:
    """Insert a ``file://`` artifact after the count quota check; committed."""
    check_room(session.connection(), project_id, quota, new_bytes=0, lock=True)
    artifact = service.insert_uri_artifact(session, project_id, kind=kind, uri=uri, name=name)
    session.commit()
    return artifact


EARLY_CHECK_SLACK_BYTES = 16 * 1024
"""What the multipart framing (boundaries, part headers, the text fields) may add to the file."""


def early_quota_check(
    session: Session, project_id: uuid.UUID, quota: Quota, content_length: int | None
) -> None:
    """Refuse an upload before reading its body when its bytes cannot fit (413 problem).

    ``content_length`` is the request's declared length, less :data:`EARLY_CHECK_SLACK_BYTES`
    of framing, so a file that fits is never refused here. Only bytes are checked early: the
    count (and content the project already stores, which costs nothing) is decided exactly
    when the row is inserted.
    """
    if quota.max_bytes is None or content_length is None:
        return
    declared = content_length - EARLY_CHECK_SLACK_BYTES
    if declared <= 0:
        return
    check_room(
        session.connection(),
        project_id,
        Quota(quota.max_bytes, None),
        new_bytes=declared,
        lock=False,
    )
    session.commit()  # end the read transaction: the body may take minutes to arrive
