"""Artifacts seen from an attempt: resolve ids to readable files, store bulky outputs.

One object, :class:`ArtifactAccess`, serves every kind: it reads input blobs and writes output
blobs either in the local blob store (one host, or a data directory shared with the API) or,
on a worker on another host (``CURVPLAN_URL`` set, docs/operations.md "Workers on other
hosts"), through the API: a blob missing from the local store is fetched into the worker's
content-addressed cache (:mod:`curvplan_worker.blobs.cache`), an output blob is uploaded with
``PUT /v1/worker/blobs/{sha256}``. Only the transfer differs; the artifact rows are read and
written through the database either way.

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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import Connection, Engine, create_engine, pool, text

from curvplan.types.artifacts import uri_allowed, uri_path
from curvplan_core.artifacts.blobstore import BlobStore, default_store
from curvplan_core.artifacts.checks import ArtifactContentError, check_kind
from curvplan_core.artifacts.regular_files import NotARegularFile, validate_regular_file
from curvplan_core.artifacts.safetensors_format import InvalidSafetensors, validate_file
from curvplan_core.config import get_settings
from curvplan_core.storage.blobs import delete_if_unreferenced, lock_blob, place_blob
from curvplan_worker.blobs.cache import BlobCache, CorruptDownload
from curvplan_worker.blobs.client import BlobApi, BlobNotOnServer, BlobTransferError
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import JobContext

log = logging.getLogger(__name__)

CACHE_DIR = "cache"
"""The worker's blob cache under its data directory: ``<data dir>/cache/<sha[:2]>/<sha>``."""


@dataclass(frozen=True)
class ResolvedArtifact:
    """An artifact ready to read: its id, kind and a local path to a validated file."""

    id: str
    kind: str
    path: Path
    sha256: str | None
    field: str
    name: str | None = None  # the artifact's name (the uploaded file's name), for messages


class _UploadVanished(Exception):
    """An uploaded output blob was no longer in the API's store when its row was written."""


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
    return uuid.UUID(str(project))


class ArtifactAccess:
    """How one attempt reads its input artifacts and writes its outputs.

    ``remote`` (the API client and the worker's cache) is None on a single-host set-up;
    with it, blobs absent from the local ``store`` come through the API. Use as a context
    manager (or call :meth:`close`): the cache pins the blobs this attempt resolved until
    then, so that no other attempt's eviction removes them while they are read.
    """

    def __init__(
        self,
        engine: Engine,
        store: BlobStore,
        *,
        api: BlobApi | None = None,
        cache: BlobCache | None = None,
    ) -> None:
        if (api is None) != (cache is None):
            raise ValueError("a remote blob API needs a cache, and a cache an API")
        self.engine = engine
        self.store = store
        self.api = api
        self.cache = cache

    @classmethod
    def for_attempt(
        cls, engine: Engine, data_dir: Path, api_url: str | None, api_key: str | None
    ) -> ArtifactAccess:
        """The access of an attempt: the local store of ``data_dir``, plus the API at
        ``api_url`` with the worker's key and a cache under ``data_dir`` when both are set."""
        store = default_store(data_dir)
        if not api_url or not api_key:
            return cls(engine, store)
        settings = get_settings()
        return cls(
            engine,
            store,
            api=BlobApi(api_url, api_key, settings.worker_http_timeout_seconds),
            cache=BlobCache(Path(data_dir) / CACHE_DIR, settings.worker_cache_bytes),
        )

    @property
    def remote(self) -> bool:
        """Whether blobs missing here and outputs go through the API."""
        return self.api is not None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
        if self.api is not None:
            self.api.close()

    def __enter__(self) -> ArtifactAccess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def resolve(
        self, project_id: uuid.UUID, artifact_id: str, kind: str, field: str
    ) -> ResolvedArtifact:
        """Find artifact ``artifact_id`` of ``project_id``; JobError naming ``field`` if unusable.

        A blob must be in the local store or, on a remote worker, in the API's; a ``file://``
        artifact (always local to this host) and a blob fetched into the cache are validated
        now (safetensors header, the rules of its kind).
        """
        with self.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT id, kind, storage, sha256, uri, name FROM artifact "
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
            path = self.store.path_for(row.sha256)
            if not path.is_file():  # validated at upload; a fetched copy is checked again
                path = self._fetch(row.sha256, f"{field}: blob {row.sha256} of artifact {row.id}")
                _check_file(path, kind, field, f"blob {row.sha256}", artifact_id)
            return ResolvedArtifact(str(row.id), row.kind, path, row.sha256, field, row.name)
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
        _check_file(path, kind, field, row.uri, artifact_id)
        return ResolvedArtifact(str(row.id), row.kind, path, None, field, row.name)

    def blob_path(self, sha256: str, what: str) -> Path:
        """A readable path of blob ``sha256``: the local store's file, else (remote) the
        cache's, fetched through the API if needed. ``what`` names it in a JobError."""
        local = self.store.path_for(sha256)
        return local if local.is_file() else self._fetch(sha256, what)

    def _fetch(self, sha256: str, what: str) -> Path:
        """The cache's copy of a blob the local store lacks (JobError if it cannot be had)."""
        if self.api is None or self.cache is None:
            raise JobError(
                "artifact-missing",
                "An artifact's blob is missing from the store",
                f"{what} is not in {self.store.root}",
            )
        try:
            return self.cache.get(sha256, self.api.download)
        except BlobNotOnServer:
            raise JobError(
                "artifact-missing",
                "An artifact's blob is missing from the store",
                f"{what} is not in the API's store",
            ) from None
        except CorruptDownload as exc:
            raise BlobTransferError(str(exc)) from None

    def load_output(self, sha256: str) -> dict[str, np.ndarray]:
        """Read a stored output blob back as numpy arrays (used by re-plans)."""
        from safetensors.numpy import load_file

        return dict(load_file(str(self.blob_path(sha256, f"output blob {sha256}"))))

    # ------------------------------------------------------------------ writing
    def store_output(
        self,
        *,
        job_id: str,
        attempt: int,
        name: str,
        tensors: Mapping[str, np.ndarray],
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        """Write ``tensors`` as a safetensors blob and upsert the job's output row ``name``.

        Returns the artifact id (stable across attempts: a retry replaces the blob reference
        of the same row). Raises :class:`LeaseLost` when the job is no longer this attempt's;
        a local blob is then removed again unless another row references it (an uploaded
        one is left to the API's garbage collection).
        """
        from safetensors.numpy import save_file

        self.store.ensure()
        temp = self.store.tmp_dir / f"output-{uuid.uuid4().hex}"
        try:
            arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
            save_file(arrays, str(temp), metadata=dict(metadata or {}))
            info = validate_file(str(temp))
            digest = _sha256_file(temp)
            size = temp.stat().st_size
            summary = json.dumps(info.to_json())
            # The blob's lock is held from placing the file until the row is committed, so a
            # concurrent garbage collection or deletion cannot remove it in between
            # (docs/storage.md). An uploaded blob is placed by the API in a request of its
            # own: under the lock, the worker then checks that it is still there.
            for tries_left in (1, 0):
                if self.api is not None:
                    self.api.upload(temp, digest)
                try:
                    with self.engine.begin() as conn:
                        self._place(conn, temp, digest)
                        previous = conn.execute(
                            text(
                                "SELECT sha256 FROM artifact WHERE job_id = :job AND name = :name"
                            ),
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
                    break
                except _UploadVanished:  # deleted between the upload and the lock: again
                    if not tries_left:
                        raise BlobTransferError(
                            f"output blob {digest} vanished from the API's store twice between "
                            "its upload and its row"
                        ) from None
        finally:
            temp.unlink(missing_ok=True)
        if artifact_id is None:
            self._drop(digest)
            raise LeaseLost(f"job {job_id} is no longer attempt {attempt}'s; output {name} dropped")
        if previous is not None and previous != digest:
            self._drop(previous)
        return str(artifact_id)

    def _place(self, conn: Connection, temp: Path, digest: str) -> None:
        """Under the blob's lock (held until ``conn`` commits): the blob is in place."""
        if self.api is None:
            place_blob(conn, self.store, temp, digest)
            return
        # Uploaded already: the lock, then a check that no deleter (a collector past the grace
        # period, the deletion of another artifact with this content) removed it meanwhile;
        # from here on none can until the row is committed.
        lock_blob(conn, digest)
        if not self.api.exists(digest):
            raise _UploadVanished(digest)

    def _drop(self, digest: str) -> None:
        """Delete an output blob no row references any more (local store only: the API's
        garbage collection removes an unreferenced uploaded blob after its grace period)."""
        if self.api is not None:
            return
        with self.engine.begin() as conn:
            delete_if_unreferenced(conn, self.store, digest)


def _check_file(path: Path, kind: str, field: str, shown: str, artifact_id: str) -> None:
    """Validate a file read for the first time: a regular safetensors file of ``kind``, under
    the same header limits as an upload to the API (``CURVPLAN_MAX_SAFETENSORS_*``)."""
    settings = get_settings()
    try:
        info = validate_regular_file(
            str(path),
            max_header_bytes=settings.max_safetensors_header_bytes,
            max_tensors=settings.max_safetensors_tensors,
        )
        check_kind(kind, info)
    except FileNotFoundError:
        raise JobError(
            "artifact-unreadable",
            "An artifact's file cannot be read",
            f"{field}: {shown} does not exist on this worker (a file:// artifact is read from "
            "the worker's own filesystem)",
        ) from None
    except NotARegularFile:
        raise JobError(
            "artifact-unreadable",
            "An artifact's file cannot be read",
            f"{field}: {shown} is not a regular file (a FIFO, device or directory)",
        ) from None
    except OSError as exc:
        raise JobError(
            "artifact-unreadable",
            "An artifact's file cannot be read",
            f"{field}: {shown}: {exc.strerror or type(exc).__name__}",
        ) from None
    except (InvalidSafetensors, ArtifactContentError, RecursionError) as exc:
        # The reason may quote what the file holds (a declared length, tensor names): it
        # goes to the worker's log, never into the job's error.
        log.warning("artifact %s is invalid: %s", artifact_id, exc)
        raise JobError(
            "invalid-artifact",
            "An artifact is not a valid safetensors file",
            f"{field}: {shown} is not a valid safetensors {kind} (the worker's log has the reason)",
        ) from None


_UPSERT_OUTPUT = text(
    "INSERT INTO artifact (id, project_id, kind, name, storage, sha256, size_bytes, tensors, "
    "job_id) SELECT :id, project_id, 'job-output', :name, 'blob', :sha256, :size, "
    "CAST(:tensors AS jsonb), id FROM job "
    "WHERE id = :job_id AND attempt = :attempt AND status IN ('running', 'cancelling') "
    "ON CONFLICT (job_id, name) WHERE job_id IS NOT NULL DO UPDATE SET "
    "sha256 = EXCLUDED.sha256, size_bytes = EXCLUDED.size_bytes, tensors = EXCLUDED.tensors "
    "RETURNING id"
)


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def attempt_access(ctx: JobContext) -> Iterator[tuple[ArtifactAccess, uuid.UUID]]:
    """The attempt's artifact access and the project of its job (what every kind that reads
    artifacts starts with). On exit the access is closed (the cache keeps the resolved blobs
    pinned until then, so close it only when the files have been read) and the attempt's
    database engine (``access.engine``) disposed."""
    engine = child_engine(get_settings().sqlalchemy_url)
    try:
        with ArtifactAccess.for_attempt(engine, ctx.data_dir, ctx.api_url, ctx.api_key) as access:
            yield access, job_project(engine, ctx.job_id)
    finally:
        engine.dispose()
