"""``curvplan gc`` and the worker's periodic collection, as real processes on a database of
their own: expired jobs and their outputs, orphan blobs and stale temp files go; what is still
referenced or recent stays."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import live_plugin
import pytest
from sqlalchemy import create_engine, text
from storage_helpers import checkpoint_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
OLD = time.time() - 7200


@pytest.fixture(scope="module")
def private_database(pg_admin_url: str) -> Iterator[str]:
    with live_plugin.private_database(pg_admin_url, "curvplan_gc") as url:
        yield url


def env_for(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")}
    env.update(
        DATABASE_URL=database_url,
        CURVPLAN_DATA_DIR=str(data_dir),
        CURVPLAN_JOB_RETENTION_DAYS="30",
        CURVPLAN_BLOB_GC_GRACE_SECONDS="60",
        CURVPLAN_TEMP_FILE_MAX_AGE_SECONDS="600",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def scenario(database_url: str, data_dir: Path, seed: int) -> dict[str, Any]:
    """An expired job with an output blob, a kept job with one, an orphan, a stale temp file."""
    from curvplan_core.artifacts.blobstore import default_store

    store = default_store(data_dir)
    store.ensure()

    def blob(data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        temp = store.tmp_dir / f"test-{uuid.uuid4().hex}"
        temp.write_bytes(data)
        os.utime(store.commit_temp(temp, sha), (OLD, OLD))
        return sha

    expired_sha, kept_sha, orphan_sha = (blob(checkpoint_bytes(seed + i)) for i in range(3))
    stale = store.tmp_dir / f"upload-{uuid.uuid4().hex}"
    stale.write_bytes(b"half an upload")
    os.utime(stale, (OLD, OLD))
    engine = create_engine(database_url)
    project, expired, kept = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO project (id, name) VALUES (:id, :name)"),
            {"id": project, "name": f"gc-{project.hex[:8]}"},
        )
        for job_id, days, sha in ((expired, 40, expired_sha), (kept, 5, kept_sha)):
            conn.execute(
                text(
                    "INSERT INTO job (id, project_id, kind, queue, status, request, finished_at) "
                    "VALUES (:id, :p, 'plan', 'cpu', 'failed', '{}'::jsonb, :t)"
                ),
                {"id": job_id, "p": project, "t": datetime.now(UTC) - timedelta(days=days)},
            )
            conn.execute(
                text(
                    "INSERT INTO artifact (id, project_id, kind, name, storage, sha256, "
                    "size_bytes, job_id) VALUES (:id, :p, 'job-output', 'o', 'blob', :sha, 1, :j)"
                ),
                {"id": uuid.uuid4(), "p": project, "sha": sha, "j": job_id},
            )
    engine.dispose()
    return {
        "store": store,
        "expired": expired,
        "kept": kept,
        "expired_sha": expired_sha,
        "kept_sha": kept_sha,
        "orphan_sha": orphan_sha,
        "stale": stale,
    }


def jobs_left(database_url: str, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id FROM job WHERE id = ANY(:ids)"), {"ids": ids})
            return {r[0] for r in rows}
    finally:
        engine.dispose()


def assert_collected(s: dict[str, Any], database_url: str) -> None:
    assert jobs_left(database_url, [s["expired"], s["kept"]]) == {s["kept"]}
    store = s["store"]
    assert not store.exists(s["expired_sha"]) and not store.exists(s["orphan_sha"])
    assert store.exists(s["kept_sha"])
    assert not s["stale"].exists()


def test_gc_command_collects_and_reports(private_database: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    s = scenario(private_database, data_dir, seed=50)
    done = subprocess.run(
        [sys.executable, "-m", "curvplan.cli", "gc"],
        env=env_for(private_database, data_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["jobs_deleted"] == 1 and summary["outputs_deleted"] == 1
    assert summary["blobs_deleted"] == 2 and summary["temp_files_deleted"] == 1
    assert_collected(s, private_database)


def test_worker_collects_periodically(private_database: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    s = scenario(private_database, data_dir, seed=60)
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "curvplan.cli", "worker", "--queues", "cpu"],
            env=env_for(private_database, data_dir, CURVPLAN_GC_INTERVAL_SECONDS="0.5"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 45
        while s["store"].exists(s["orphan_sha"]) or s["stale"].exists():
            assert worker.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        assert_collected(s, private_database)
    finally:
        worker.terminate()
        worker.wait(20)
