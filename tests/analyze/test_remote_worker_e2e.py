"""A worker on another host: the API and the worker share the database and nothing else.

Real processes: ``curvplan serve`` with data directory A and ``curvplan worker`` with data
directory B and ``CURVPLAN_URL`` pointing at the API. The worker is started in a mount
namespace of its own with an empty tmpfs over A (where the system allows it), so it cannot
read A's blob store even by accident. A real analyze job of the tiny reference model must
succeed: its inputs reach B's cache through the API (verified sha256), its outputs reach A's
store through the API, and the worker's credential is revoked when it stops.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import live_plugin
import pytest
from live import wait_terminal
from sqlalchemy import create_engine, text
from test_analyze_e2e import N_EXAMPLES, OPTIONS, SPEC, TARGETS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

WORKER_ARGS = ["worker", "--queues", "gpu,cpu", "--poll-interval", "0.1"]


def _can_hide(directory: Path) -> bool:
    """Whether an unprivileged mount namespace can put a tmpfs over ``directory`` here."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-r", "-m", "sh", "-c", f"mount -t tmpfs none '{directory}'"],
        capture_output=True,
    )
    return probe.returncode == 0


class HiddenDirWorker(live_plugin.Proc):
    """A ``curvplan worker`` that sees an empty tmpfs where ``hidden`` is."""

    def __init__(self, env: dict[str, str], log_path: Path, hidden: Path | None) -> None:
        super().__init__(WORKER_ARGS, env, log_path)
        self.hidden = hidden

    def start(self) -> None:
        command = [sys.executable, "-m", "curvplan.cli", *self.args]
        if self.hidden is not None:
            # exec keeps one process: SIGTERM from stop() reaches the worker itself.
            command = [
                "unshare", "-r", "-m", "sh", "-c",
                'mount -t tmpfs none "$0" && exec "$@"', str(self.hidden), *command,
            ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )


@pytest.fixture(scope="module")
def database(pg_admin_url: str) -> Iterator[str]:
    with live_plugin.private_database(pg_admin_url, "curvplan_remote") as url:
        yield url


def _tiny_files(out: Path) -> dict[str, Path]:
    import torch

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset
    from curvplan_worker.curvature.model import build_model

    save_checkpoint(build_model(SPEC, seed=1), out / "checkpoint.safetensors")
    tokens = torch.randint(0, 11, (N_EXAMPLES, 7), generator=torch.Generator().manual_seed(0))
    save_dataset(Dataset(tokens[:, :-1], tokens[:, 1:]), out / "data.safetensors")
    return {p.stem: p for p in out.iterdir()}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _upload(client: httpx.Client, path: Path, kind: str) -> dict[str, Any]:
    with path.open("rb") as fh:
        response = client.post(
            "/v1/artifacts",
            files={"file": (path.name, fh, "application/octet-stream")},
            data={"kind": kind},
        )
    assert response.status_code == 201, response.text
    return response.json()


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _api_and_remote_worker(
    database: str, tmp_path: Path, **worker_settings: str
) -> tuple[live_plugin.ServerProcess, HiddenDirWorker, Path, Path]:
    """An API with data directory A and a worker with data directory B and ``CURVPLAN_URL``,
    which cannot see A where the system allows it (neither is started)."""
    api_dir, worker_dir = tmp_path / "api-data", tmp_path / "worker-data"
    api_dir.mkdir()
    worker_dir.mkdir()
    server = live_plugin.ServerProcess(
        live_plugin.service_env(database, api_dir), tmp_path / "server.log"
    )
    worker_env = live_plugin.service_env(
        database, worker_dir, CURVPLAN_URL=server.url + "/", **worker_settings
    )
    assert not any(str(api_dir) in value for value in worker_env.values())
    hidden = api_dir if _can_hide(api_dir) else None
    worker = HiddenDirWorker(worker_env, tmp_path / "worker.log", hidden)
    return server, worker, api_dir, worker_dir


def _api_client(server: live_plugin.ServerProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _analyze(
    client: httpx.Client, ckpt: dict[str, Any], data: dict[str, Any], **options: Any
) -> str:
    """Submit the tiny analysis on the uploaded checkpoint and data; its job id."""
    response = client.post(
        "/v1/jobs",
        json={
            "kind": "analyze",
            "name": "remote",
            "model": SPEC,
            "options": {**OPTIONS, **options},
            "targets": TARGETS,
            "checkpoint": ckpt["id"],
            "dataset": data["id"],
        },
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_a_worker_sharing_only_the_database_runs_an_analysis(database: str, tmp_path: Path) -> None:
    server, worker, api_dir, worker_dir = _api_and_remote_worker(database, tmp_path)
    worker.start()  # first: it imports torch while the API starts
    engine = create_engine(database)
    try:
        server.start()
        key = live_plugin.make_api_key(database, f"remote-{uuid.uuid4().hex[:6]}")
        with _api_client(server, key) as client:
            files = _tiny_files(tmp_path)
            ckpt = _upload(client, files["checkpoint"], "checkpoint")
            data = _upload(client, files["data"], "dataset")
            inputs = {ckpt["sha256"], data["sha256"]}
            done = wait_terminal(client, _analyze(client, ckpt, data), timeout=150)
            logs = server.log_path.read_text()[-3000:] + worker.tail()
            assert done["status"] == "succeeded", (done["error"], logs)
            # no transfer needed a retry: one attempt per child, the parent's fan-out + fan-in
            children = done.get("children") or []
            assert done["attempt"] == (2 if children else 1), logs
            assert all(c["attempt"] == 1 for c in children), logs
            outputs = done["result"]["artifacts"]
            assert outputs, done["result"]
            output_shas = set()
            for artifact_id in outputs.values():
                meta = client.get(f"/v1/artifacts/{artifact_id}").json()
                blob = api_dir / "blobs" / "sha256" / meta["sha256"][:2] / meta["sha256"][2:]
                assert _sha256(blob) == meta["sha256"]  # in A's store, intact
                output_shas.add(meta["sha256"])
                # and served to the project from there
                content = client.get(f"/v1/artifacts/{artifact_id}/content")
                assert hashlib.sha256(content.content).hexdigest() == meta["sha256"]

        # B holds the inputs in its cache, verified, and no blob store content at all.
        cached = {p.name for p in (worker_dir / "cache").glob("[0-9a-f][0-9a-f]/*")}
        assert cached == inputs
        for digest in cached:
            assert _sha256(worker_dir / "cache" / digest[:2] / digest) == digest
        assert all(f.startswith("cache/") for f in _files_under(worker_dir)), _files_under(
            worker_dir
        )
        assert not output_shas & cached
    finally:
        worker.stop()
        server.stop()
        try:
            with engine.connect() as conn:
                creds = conn.execute(
                    text(
                        "SELECT revoked_at IS NOT NULL AS revoked, scopes FROM service_credential"
                        " WHERE worker_id IS NOT NULL"
                    )
                ).all()
        finally:
            engine.dispose()
    # One credential per worker slot, scope worker, revoked at the clean stop.
    assert [(c.revoked, list(c.scopes)) for c in creds] == [(True, ["worker"])]


def test_an_unreachable_api_requeues_the_job_until_it_is_back(
    database: str, tmp_path: Path
) -> None:
    """A remote worker that cannot reach the API to fetch its inputs does not fail the job: the
    attempt ends ``crashed`` (a transient failure), the job is queued again with backoff, and
    it succeeds once the API is back — its inputs fetched then, through the API."""
    import os
    import signal
    import time

    server, worker, _, worker_dir = _api_and_remote_worker(
        database,
        tmp_path,
        CURVPLAN_RETRY_BACKOFF_BASE_SECONDS="1",
        CURVPLAN_WORKER_HTTP_TIMEOUT_SECONDS="5",
    )
    worker.start()
    engine = create_engine(database)
    try:
        server.start()
        key = live_plugin.make_api_key(database, f"remote-{uuid.uuid4().hex[:6]}")
        with _api_client(server, key) as client:
            files = _tiny_files(tmp_path)
            ckpt = _upload(client, files["checkpoint"], "checkpoint")
            data = _upload(client, files["data"], "dataset")
            assert worker.proc is not None
            os.kill(worker.proc.pid, signal.SIGSTOP)  # the job waits until the API is gone
            try:
                job_id = _analyze(client, ckpt, data, fan_out=False)
                server.kill()
            finally:
                os.kill(worker.proc.pid, signal.SIGCONT)

        def outcomes() -> list[str | None]:
            with engine.connect() as conn:
                return list(
                    conn.execute(
                        text("SELECT outcome FROM job_attempt WHERE job_id = :id ORDER BY attempt"),
                        {"id": job_id},
                    ).scalars()
                )

        deadline = time.monotonic() + 60
        while outcomes()[:1] != ["crashed"]:
            assert time.monotonic() < deadline, worker.tail()
            time.sleep(0.1)
        with engine.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM job WHERE id = :id"), {"id": job_id}
            ).scalar_one()
        assert status in ("queued", "running"), status  # re-queued, not failed
        server.start()
        with _api_client(server, key) as client:
            done = wait_terminal(client, job_id, timeout=120)
        assert done["status"] == "succeeded", (done["error"], worker.tail())
        seen = outcomes()
        assert seen[-1] == "succeeded" and set(seen[:-1]) == {"crashed"}, seen
        cached = {p.name for p in (worker_dir / "cache").glob("[0-9a-f][0-9a-f]/*")}
        assert cached == {ckpt["sha256"], data["sha256"]}
    finally:
        worker.stop()
        server.stop()
        engine.dispose()
