"""PostgreSQL restarted under a steady submit load (a private embedded server, never 5432).

Every raw POST answers 202 or 503 problem+json with ``Retry-After`` (never a 500); every
202 job finishes exactly once; the Python client riding through the restart loses and
duplicates nothing. The full figures (20/s for 30 s) are in benchmarks/bench_db_restart.py.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import restart_load

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def private_pg() -> Iterator[restart_load.PrivatePostgres]:
    pg = restart_load.PrivatePostgres()
    try:
        yield pg
    finally:
        pg.cleanup()


def test_submissions_ride_through_a_database_restart(
    private_pg: restart_load.PrivatePostgres, tmp_path: Path
) -> None:
    from live_plugin import free_port, make_api_key

    url = private_pg.create_database()
    key = make_api_key(url, f"restart-{uuid.uuid4().hex[:6]}")
    port = free_port()
    server, worker = restart_load.start_service(url, tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    try:
        result = restart_load.run_load(
            base, key, private_pg, rate=8, seconds=6, restart_at=2.0, down_seconds=1.0
        )
        logs = (tmp_path / "server.log").read_text()[-3000:]
        assert not result.unexpected, (result.unexpected[:5], logs)
        assert result.statuses.get(503, 0) > 0, "the restart was not seen by any request"
        assert result.statuses.get(202, 0) > 0
        assert not result.client_errors, result.client_errors
        assert len(set(result.client_submitted)) == len(result.client_submitted)

        accepted = result.accepted + result.client_submitted
        state = restart_load.wait_finished(url, accepted, timeout=120)
        assert state["pending"] == [], (len(state["pending"]), state["pending"][:3])
        jobs = state["jobs"]
        for job_id in accepted:
            row = jobs[job_id]
            assert row.status == "succeeded", (job_id, row.status)
            assert row.succeeded_attempts == 1, (job_id, row.attempts)
        names = [row.name for row in jobs.values()]
        # The client's retries reuse one Idempotency-Key per submission: no extra row.
        assert names.count(restart_load.CLIENT_NAME) == len(result.client_submitted)
        # A raw POST answered 503 may have committed before its answer was lost; nothing
        # else adds a row.
        extra = names.count(restart_load.RAW_NAME) - len(result.accepted)
        assert 0 <= extra <= result.statuses.get(503, 0)
    finally:
        restart_load.stop_process(worker)
        restart_load.stop_process(server)
