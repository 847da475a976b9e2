"""Temp files left by a killed upload (or a worker's unfinished output) are swept when the API
starts and periodically after that; files still being written are left alone."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

OLD = time.time() - 7200


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        temp_file_max_age_seconds=600,
        storage_sweep_seconds=0.2,
    )


def temp_file(store: Any, name: str, mtime: float | None) -> Path:
    store.ensure()
    path = store.tmp_dir / name
    path.write_bytes(b"x" * 1024)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_stale_temp_files_are_swept_at_start_up_and_periodically(settings: Any, store: Any) -> None:
    from fastapi.testclient import TestClient

    from curvplan_server.main import create_app

    stale_upload = temp_file(store, "upload-deadbeef", OLD)
    stale_output = temp_file(store, "output-deadbeef", OLD)
    live_upload = temp_file(store, "upload-inflight", None)
    unrelated = temp_file(store, "keep-me", OLD)
    application = create_app(settings)
    try:
        with TestClient(application) as client:
            assert client.get("/healthz").status_code == 200
            assert not stale_upload.exists() and not stale_output.exists()
            assert live_upload.exists() and unrelated.exists()
            # Left behind while the API runs (another process died): gone within a few sweeps.
            later = temp_file(store, "upload-later", OLD)
            deadline = time.monotonic() + 10
            while later.exists():
                assert time.monotonic() < deadline, "the periodic sweep did not run"
                time.sleep(0.05)
            assert live_upload.exists()
    finally:
        application.state.engine.dispose()
