"""One garbage-collection pass: stale temp files, expired jobs, unreferenced blobs.

Run by ``curvplan gc`` and periodically by workers (``CURVPLAN_GC_INTERVAL_SECONDS``). Passes
of several processes are safe together (every deletion re-checks under a lock); a periodic
pass skips its turn while another process holds the collector lock, so N workers do not
all scan the store at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, text

from curvplan_core.artifacts.blobstore import BlobStore
from curvplan_core.storage.blobs import BlobGcJson, collect_blobs, sweep_temp_files
from curvplan_core.storage.retention import RetentionJson, delete_expired_jobs

log = logging.getLogger("curvplan.storage")

_COLLECTOR_LOCK = "curvplan-gc"


@contextmanager
def collector_lock(engine: Engine) -> Iterator[bool]:
    """Try to become the one running collector (session advisory lock); yields whether we are."""
    with engine.connect() as conn:
        got = conn.execute(
            text("SELECT pg_try_advisory_lock(hashtextextended(:k, 0))"), {"k": _COLLECTOR_LOCK}
        ).scalar_one()
        conn.commit()
        try:
            yield bool(got)
        finally:
            if got:
                conn.execute(
                    text("SELECT pg_advisory_unlock(hashtextextended(:k, 0))"),
                    {"k": _COLLECTOR_LOCK},
                )
                conn.commit()


class GcSummary(RetentionJson, BlobGcJson):
    """What one garbage collection did (``curvplan gc`` prints it)."""

    temp_files_deleted: int


def run_gc(
    engine: Engine,
    store: BlobStore,
    *,
    retention_days: float | None,
    blob_grace_seconds: float,
    temp_max_age_seconds: float,
) -> GcSummary:
    """Sweep temp files, delete expired jobs (when ``retention_days`` is set), collect blobs."""
    removed = sweep_temp_files(store, max_age_seconds=temp_max_age_seconds)
    retention: RetentionJson = {"jobs_deleted": 0, "outputs_deleted": 0, "cutoff": None}
    if retention_days is not None:
        retention = delete_expired_jobs(engine, older_than=timedelta(days=retention_days)).as_dict()
    blobs = collect_blobs(engine, store, grace_seconds=blob_grace_seconds).as_dict()
    return {"temp_files_deleted": len(removed), **retention, **blobs}


def run_gc_from_settings(
    engine: Engine, store: BlobStore, settings: Any, *, exclusive: bool
) -> GcSummary | None:
    """:func:`run_gc` with the configured ages; with ``exclusive``, None if another runs."""

    def once() -> GcSummary:
        return run_gc(
            engine,
            store,
            retention_days=settings.job_retention_days,
            blob_grace_seconds=settings.blob_gc_grace_seconds,
            temp_max_age_seconds=settings.temp_file_max_age_seconds,
        )

    if not exclusive:
        return once()
    with collector_lock(engine) as leader:
        if not leader:
            log.info("another process is collecting garbage; skipping this turn")
            return None
        return once()
