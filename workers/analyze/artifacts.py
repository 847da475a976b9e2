"""Artifacts seen from an attempt: resolve ids to readable files, store bulky outputs.

Reads are scoped to the job's project (the API checked this at submission; checking again
here keeps a worker from ever reading another project's file). Output rows are written
only while the job is still this attempt's (``attempt`` and a live status), so an attempt
that lost its lease cannot attach outputs to a job another attempt now runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, pool, text

from curvplan.types.artifacts import uri_allowed, uri_path
from curvplan_server.artifacts.blobstore import BlobStore
from curvplan_server.artifacts.checks import ArtifactContentError, check_kind
from curvplan_server.artifacts.regular_files import NotARegularFile, validate_regular_file
from curvplan_server.artifacts.safetensors_format import InvalidSafetensors, validate_file
from curvplan_server.config import get_settings
from curvplan_server.storage.blobs import delete_if_unreferenced, place_blob
from curvplan_worker.errors import JobError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedArtifact:
    """An artifact ready to read: its id, kind and a local path to a validated file."""

    id: str
    kind: str
    path: Path
    sha256: str | None
    field: str


class LeaseLost(RuntimeError):
    """The job is no longer this attempt's: its outputs must not be written."""


def child_engine(database_url: str) -> Engine:
    """A small engine for one attempt (no pool left behind when the child exits)."""
    return create_engine(database_url, poolclass=pool.NullPool, future=True)


def job_project(engine: Engine, job_id: str) -> uuid.UUID:
    """The project that owns the job."""
    with engine.connect() as conn:
        project = conn.execute(
            text("SELECT project_id FROM job WHERE id = :id"), {"id": job_id}
        ).scalar_one_or_none()
    if project is None:
        raise JobError("job-not-found", "The job row is gone", f"job {job_id} does not exist")
    return project


def resolve(
    engine: Engine,
    store: BlobStore,
    project_id: uuid.UUID,
    artifact_id: str,
    kind: str,
    field: str,
) -> ResolvedArtifact:
    """Find artifact ``artifact_id`` of ``project_id``; JobError naming ``field`` if unusable.

    A blob must still be in the store; a ``file://`` artifact is validated now (safetensors
    header, the rules of its kind) because nothing has read it before.
    """
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT id, kind, storage, sha256, uri FROM artifact "
                "WHERE id = :id AND project_id = :project"
            ),
            {"id": artifact_id, "project": project_id},
        ).first()
    if row is None:
        raise JobError(
            "artifact-not-found",
            "An artifact of the job is missing",
            f"{field}: artifact {artifact_id} not found in this project",
        )
    if row.kind != kind:
        raise JobError(
            "artifact-kind",
            "An artifact of the job has the wrong kind",
            f"{field}: artifact {artifact_id} is a {row.kind}, expected a {kind}",
        )
    if row.storage == "blob":
        path = store.path_for(row.sha256)
        if not path.is_file():
            raise JobError(
                "artifact-missing",
                "An artifact's blob is missing from the store",
                f"{field}: blob {row.sha256} of artifact {artifact_id} is not in {store.root}",
            )
        return ResolvedArtifact(str(row.id), row.kind, path, row.sha256, field)
    roots = get_settings().artifact_uri_roots
    if not uri_allowed(row.uri, roots):  # none configured, or narrowed since registration
        # One answer for every path outside the roots: it must not tell which exist.
        raise JobError(
            "artifact-not-allowed",
            "An artifact's file is outside the allowed directories",
            f"{field}: artifact {artifact_id}: file:// artifacts must lie under the "
            "directories the operator configured (CURVPLAN_ARTIFACT_URI_ROOTS)",
        )
    path = Path(uri_path(row.uri))
    try:
        info = validate_regular_file(str(path))
        check_kind(kind, info)
    except FileNotFoundError:
        raise JobError(
            "artifact-unreadable",
            "An artifact's file cannot be read",
            f"{field}: {row.uri} does not exist on this worker",
        ) from None
    except NotARegularFile:
        raise JobError(
            "artifact-unreadable",
            "An artifact's file cannot be read",
            f"{field}: {row.uri} is not a regular file (a FIFO, device or directory)",
        ) from None
    except OSError as exc:
        raise JobError(
            "artifact-unreadable",
            "An artifact's file cannot be read",
            f"{field}: {row.uri}: {exc.strerror or type(exc).__name__}",
        ) from None
    except (InvalidSafetensors, ArtifactContentError, RecursionError) as exc:
        # The reason may quote what the file holds (a declared length, tensor names): it
        # goes to the worker's log, never into the job's error.
        log.warning("file:// artifact %s is invalid: %s", artifact_id, exc)
        raise JobError(
            "invalid-artifact",
            "An artifact is not a valid safetensors file",
            f"{field}: {row.uri} is not a valid safetensors {kind} (the worker's log has "
            "the reason)",
        ) from None
    return ResolvedArtifact(str(row.id), row.kind, path, None, field)


_UPSERT_OUTPUT = text(
    "INSERT INTO artifact (id, project_id, kind, name, storage, sha256, size_bytes, tensors, "
    "job_id) SELECT :id, project_id, 'job-output', :name, 'blob', :sha256, :size, "
    "CAST(:tensors AS jsonb), id FROM job "
    "WHERE id = :job_id AND attempt = :attempt AND status IN ('running', 'cancelling') "
    "ON CONFLICT (job_id, name) WHERE job_id IS NOT NULL DO UPDATE SET "
    "sha256 = EXCLUDED.sha256, size_bytes = EXCLUDED.size_bytes, tensors = EXCLUDED.tensors "
    "RETURNING id"
)


def store_output(
    engine: Engine,
    store: BlobStore,
    *,
    job_id: str,
    attempt: int,
    name: str,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> str:
    """Write ``tensors`` as a safetensors blob and upsert the job's output row ``name``.

    Returns the artifact id (stable across attempts: a retry replaces the blob reference of
    the same row). Raises :class:`LeaseLost` when the job is no longer this attempt's; the
    blob is then removed again unless another row references it.
    """
    from safetensors.numpy import save_file

    store.ensure()
    temp = store.tmp_dir / f"output-{uuid.uuid4().hex}"
    try:
        arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        save_file(arrays, str(temp), metadata=dict(metadata or {}))
        info = validate_file(str(temp))
        digest = _sha256_file(temp)
        size = temp.stat().st_size
        summary = json.dumps(info.to_json())
        # The blob's lock is held from placing the file until the row is committed, so a
        # concurrent garbage collection cannot delete it in between (docs/storage.md).
        with engine.begin() as conn:
            place_blob(conn, store, temp, digest)
            previous = conn.execute(
                text("SELECT sha256 FROM artifact WHERE job_id = :job AND name = :name"),
                {"job": job_id, "name": name},
            ).scalar_one_or_none()
            artifact_id = conn.execute(
                _UPSERT_OUTPUT,
                {
                    "id": uuid.uuid4(),
                    "name": name,
                    "sha256": digest,
                    "size": size,
                    "tensors": summary,
                    "job_id": job_id,
                    "attempt": attempt,
                },
            ).scalar_one_or_none()
    finally:
        temp.unlink(missing_ok=True)
    if artifact_id is None:
        _delete_if_unreferenced(engine, store, digest)
        raise LeaseLost(f"job {job_id} is no longer attempt {attempt}'s; output {name} dropped")
    if previous is not None and previous != digest:
        _delete_if_unreferenced(engine, store, previous)
    return str(artifact_id)


def _delete_if_unreferenced(engine: Engine, store: BlobStore, digest: str) -> None:
    with engine.begin() as conn:
        delete_if_unreferenced(conn, store, digest)


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def load_output(store: BlobStore, sha256: str) -> dict[str, Any]:
    """Read a stored output blob back as numpy arrays (used by re-plans)."""
    from safetensors.numpy import load_file

    return dict(load_file(str(store.path_for(sha256))))
