"""The API's own clean-up: stale upload temp files, at start-up and every few minutes.

An API process killed in the middle of an upload leaves its ``blobs/tmp/upload-*`` file
behind; no request will ever finish it. Each API process sweeps files older than
``CURVPLAN_TEMP_FILE_MAX_AGE_SECONDS`` (an upload in progress keeps its file fresh, so a
sibling process's live upload is never touched) when it starts and then every
``CURVPLAN_STORAGE_SWEEP_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.concurrency import run_in_threadpool

from curvplan_core.artifacts.blobstore import default_store
from curvplan_core.storage.blobs import sweep_temp_files

log = logging.getLogger("curvplan.storage")


def sweep_now(settings: Any) -> int:
    """One sweep of the store under ``settings.data_dir``; the number of files removed."""
    store = default_store(settings.data_dir)
    return len(sweep_temp_files(store, max_age_seconds=settings.temp_file_max_age_seconds))


async def _periodic(settings: Any) -> None:
    while True:
        await asyncio.sleep(settings.storage_sweep_seconds)
        try:
            await run_in_threadpool(sweep_now, settings)
        except Exception:
            log.exception("temp file sweep failed; trying again next time")


@contextlib.asynccontextmanager
async def temp_sweeper(settings: Any) -> AsyncIterator[None]:
    """Sweep once now, then periodically until the application stops."""
    try:
        await run_in_threadpool(sweep_now, settings)
    except Exception:
        log.exception("temp file sweep at start-up failed")
    task = asyncio.create_task(_periodic(settings), name="curvplan-temp-sweep")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
