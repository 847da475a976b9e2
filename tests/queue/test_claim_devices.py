"""Several devices per job: a job is claimed only by a worker that gives one job at least as
many devices as its ``resources.devices`` (the ``worker.devices`` column); it waits otherwise."""

from __future__ import annotations

import pytest
from queue_helpers import insert_jobs, job_row, plan_request
from sqlalchemy import text
from typer.testing import CliRunner

from curvplan.cli import app
from curvplan_core.config import Settings, get_settings
from curvplan_core.jobs import lifecycle, store
from curvplan_worker.options import WorkerOptions


def test_a_job_waits_for_a_worker_with_enough_devices(db, project_id):
    small_job, big_job = insert_jobs(
        db, project_id, [plan_request(), {**plan_request(), "resources": {"devices": 2}}]
    )
    with db.begin() as conn:
        conn.execute(text("UPDATE job SET priority = 5 WHERE id = :id"), {"id": big_job})
        store.register_worker(conn, "one-device", "h", 1, ["cpu"])
        store.register_worker(conn, "two-devices", "h", 2, ["cpu"], devices=2)
    with db.begin() as conn:  # the big job comes first by priority, but needs 2 devices
        claimed = lifecycle.claim(conn, "one-device", ["cpu"], 30)
        assert claimed is not None and claimed.fence.job_id == small_job
    with db.begin() as conn:
        assert lifecycle.claim(conn, "one-device", ["cpu"], 30) is None
    assert job_row(db, big_job).status == "queued"  # waiting, not failed
    with db.begin() as conn:
        claimed = lifecycle.claim(conn, "two-devices", ["cpu"], 30)
        assert claimed is not None and claimed.fence.job_id == big_job
        devices = conn.execute(text("SELECT devices FROM worker WHERE id = 'two-devices'"))
        assert devices.scalar() == 2


def test_the_worker_devices_option_comes_from_the_environment_and_must_be_positive():
    url = "postgresql+psycopg://u@127.0.0.1/x"
    settings = Settings(database_url=url, worker_devices=3)  # type: ignore[call-arg]
    assert WorkerOptions.from_settings(settings, ["gpu"]).devices == 3
    with pytest.raises(ValueError, match="devices"):
        WorkerOptions.from_settings(settings, ["gpu"], devices=0)


def test_the_cli_flag_reaches_the_job_processes_and_refuses_zero(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)  # the command stops before running
    monkeypatch.setenv("CURVPLAN_WORKER_DEVICES", "1")
    monkeypatch.setenv("CURVPLAN_LEASE_SECONDS", "30")
    get_settings.cache_clear()
    try:
        refused = CliRunner().invoke(app, ["worker", "--devices", "0"])
        CliRunner().invoke(app, ["worker", "--devices", "2", "--lease-seconds", "12"])
        assert get_settings().worker_devices == 2
        assert get_settings().lease_seconds == 12  # the ranks' group timeout derives from it
    finally:
        get_settings.cache_clear()
    assert refused.exit_code == 2 and "--devices" in refused.output
