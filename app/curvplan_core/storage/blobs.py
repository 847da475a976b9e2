"""Placing, deleting and garbage-collecting content-addressed blobs without races.

A blob file ``sha256/ab/cdef…`` may be shared by many artifact rows (of any project, uploads
and job outputs). Whoever adds a row for a digest and whoever deletes the digest's file
coordinate through one PostgreSQL transaction-level advisory lock per digest
(:func:`lock_blob`):

* a writer (upload, job output) takes the lock, moves its temp file into place if the blob
  is missing, inserts its row and commits — the lock is held from before the file is placed
  until the row is visible;
* a deleter (garbage collection, artifact deletion, a failed write cleaning up) takes the
  lock, re-checks under it that no row references the digest, deletes the file and commits.

So a deleter either runs first (the file is gone; the writer still holds its own temp copy
and places it) or second (it sees the writer's committed row and keeps the file). Without
the lock, an upload of content that was just unreferenced could find the file present, drop
its temp copy, and insert its row after the collector decided to delete the file: a row
pointing at nothing. The garbage collector also skips files younger than a grace period,
for writers that do not take the lock (an older process during a rolling upgrade).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from sqlalchemy import Connection, Engine, text

from curvplan_core.artifacts.blobstore import BlobStore

log = logging.getLogger("curvplan.storage")

TEMP_PREFIXES = ("upload-", "output-")
"""Temp files of API uploads and of worker outputs under ``blobs/tmp``."""


@contextmanager
def transaction(bind: Engine | Connection) -> Iterator[Connection]:
    """A transaction of its own on an engine, or a savepoint on a connection already in one."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    else:
        with bind.begin_nested():
            yield bind


def lock_blob(conn: Connection, sha256: str) -> None:
    """Take the digest's advisory lock until the end of ``conn``'s transaction."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('curvplan-blob:' || :sha, 0))"),
        {"sha": sha256},
    )


def blob_referenced(conn: Connection, sha256: str) -> bool:
    """Whether any artifact row (of any project) points at this digest."""
    return bool(
        conn.execute(
            text("SELECT EXISTS (SELECT 1 FROM artifact WHERE sha256 = :sha)"), {"sha": sha256}
        ).scalar_one()
    )


def place_blob(conn: Connection, store: BlobStore, temp_path: Path, sha256: str) -> Path:
    """Lock the digest, then move ``temp_path`` to its address (or drop it if already there).

    Call inside the transaction that inserts the row referencing the blob, and commit that
    transaction afterwards: the lock keeps a collector from deleting the file in between.
    """
    lock_blob(conn, sha256)
    dest = store.commit_temp(temp_path, sha256)
    # A fresh mtime keeps an unlocked collector's grace period away from re-used content too.
    with suppress(OSError):
        os.utime(dest)
    return dest


def delete_if_unreferenced(
    conn: Connection, store: BlobStore, sha256: str, *, modified_before: float | None = None
) -> bool:
    """Under the digest's lock: delete the file if no row references it. True if deleted.

    With ``modified_before`` (a timestamp) a file modified since is kept too, checked under
    the lock: a blob a worker on another host has just uploaded (``place_blob`` refreshes the
    mtime under this lock) but whose row it has not inserted yet is spared.

    Call in its own transaction (``engine.begin()``) after the transaction that removed the
    last row committed; the lock is released when it commits.
    """
    lock_blob(conn, sha256)
    if blob_referenced(conn, sha256):
        return False
    path = store.path_for(sha256)
    if modified_before is not None:
        try:
            if path.stat().st_mtime > modified_before:
                return False
        except FileNotFoundError:
            return False
    existed = path.is_file()
    store.delete(sha256)
    return existed


class BlobGcJson(TypedDict):
    """A blob collection in a GC summary."""

    blobs_scanned: int
    blobs_deleted: int
    bytes_freed: int
    blobs_kept_young: int
    blobs_kept_referenced: int


@dataclass
class BlobGcReport:
    """What one garbage collection did."""

    scanned: int = 0
    deleted: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    kept_young: int = 0
    kept_referenced: int = 0

    def as_dict(self) -> BlobGcJson:
        return {
            "blobs_scanned": self.scanned,
            "blobs_deleted": len(self.deleted),
            "bytes_freed": self.bytes_freed,
            "blobs_kept_young": self.kept_young,
            "blobs_kept_referenced": self.kept_referenced,
        }


def collect_blobs(
    bind: Engine | Connection, store: BlobStore, *, grace_seconds: float
) -> BlobGcReport:
    """Delete blob files that no artifact row references and that are older than the grace.

    Candidates come from one scan (files on disk minus digests in the table); each is then
    re-checked and deleted under its lock, one short transaction per blob.
    """
    report = BlobGcReport()
    on_disk = store.blobs()
    report.scanned = len(on_disk)
    if not on_disk:
        return report
    with transaction(bind) as conn:
        referenced = {
            row[0]
            for row in conn.execute(
                text("SELECT DISTINCT sha256 FROM artifact WHERE sha256 IS NOT NULL")
            )
        }
    cutoff = time.time() - grace_seconds
    for sha256 in on_disk:
        if sha256 in referenced:
            continue
        path = store.path_for(sha256)
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if stat.st_mtime > cutoff:
            report.kept_young += 1
            continue
        with transaction(bind) as conn:
            if delete_if_unreferenced(conn, store, sha256, modified_before=cutoff):
                report.deleted.append(sha256)
                report.bytes_freed += stat.st_size
            else:
                report.kept_referenced += 1
    if report.deleted:
        log.info("blob garbage collection", extra=report.as_dict())
    return report


def sweep_temp_files(store: BlobStore, *, max_age_seconds: float) -> list[Path]:
    """Delete temp files (``upload-*``, ``output-*``) not written to for ``max_age_seconds``.

    An upload in progress writes its temp file with every chunk, so only the files of a
    process that died mid-write (or a client silent for longer than the limit) are old.
    """
    if not store.tmp_dir.is_dir():
        return []
    cutoff = time.time() - max_age_seconds
    removed = []
    for path in store.tmp_dir.iterdir():
        if not path.name.startswith(TEMP_PREFIXES):
            continue
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(path)
        except FileNotFoundError:
            continue
    if removed:
        log.info("removed stale temp files", extra={"count": len(removed)})
    return removed
