"""The client commands end to end: real CLI subprocesses against real serve + worker processes."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from cli_helpers import run_cli, run_cli_in_pty
from live_service import LiveService, free_port
from plan_bodies import B_CRIT, full_measurements, full_targets, slow_plan

import curvplan

pytestmark = pytest.mark.e2e


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"measurements": full_measurements(), "targets": full_targets()}))
    return path


def test_plan_wait_in_a_terminal_draws_progress_and_tables(
    live: LiveService, plan_file: Path
) -> None:
    name = f"cli-tty-{uuid.uuid4().hex[:8]}"
    run = run_cli_in_pty(["plan", str(plan_file), "--wait", "--name", name], live.client_env())
    assert run.code == 0, run.stdout
    out = run.stdout
    assert "\r\x1b[2K[" in out  # the bar is redrawn in place
    assert "#" * 28 in out and "100%" in out and "succeeded" in out  # the final, full bar
    assert "Batch size (McCandlish et al. 2018)" in out
    assert "Sample size" in out and "TOLERANCE" in out and "Curvature per block" in out
    assert "B_crit" in out and "500" in out  # the generated B_crit, printed in the table
    assert "curvplan report" in out


def test_plan_json_in_a_pipe(live: LiveService, plan_file: Path) -> None:
    name = f"cli-json-{uuid.uuid4().hex[:8]}"
    run = run_cli(
        ["plan", str(plan_file), "--wait", "--json", "--name", name, "--tag", "team=nlp"],
        live.client_env(),
    )
    assert run.code == 0, run.stderr
    job = json.loads(run.stdout)  # stdout is pure JSON
    assert job["status"] == "succeeded" and job["name"] == name and job["tags"] == {"team": "nlp"}
    b_crit = job["result"]["recommendation"]["batch_size"]["b_crit"]["value"]
    assert b_crit == pytest.approx(B_CRIT, rel=1e-3)
    assert "\r" not in run.stderr and f"job {job['id']} succeeded" in run.stderr  # plain lines

    listed = run_cli(["jobs", "list", "--name", name, "--json"], live.client_env())
    assert listed.code == 0 and [j["id"] for j in json.loads(listed.stdout)] == [job["id"]]
    shown = run_cli(["jobs", "show", job["id"]], live.client_env())
    assert shown.code == 0 and f"job        {job['id']}" in shown.stdout
    assert "status     succeeded" in shown.stdout and "Batch size" in shown.stdout
    table = run_cli(["jobs", "list", "--name", name], live.client_env())
    assert table.code == 0 and job["id"] in table.stdout and "team=nlp" in table.stdout
    again = run_cli(["jobs", "cancel", job["id"]], live.client_env())
    assert again.code == 2 and "only queued or running jobs can be cancelled" in again.stderr


def test_cancelled_job_exits_non_zero(live: LiveService, tmp_path: Path) -> None:
    body = slow_plan(f"cli-cancel-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({"measurements": body["measurements"], "targets": body["targets"]}))
    name = body["name"]

    def cancel_when_running() -> None:
        with curvplan.Client(live.url, live.api_key) as api:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                jobs = api.list_jobs(name=name).items
                if jobs and jobs[0].status == "running":
                    api.cancel_job(jobs[0].id)
                    return
                time.sleep(0.1)

    helper = threading.Thread(target=cancel_when_running)
    helper.start()
    run = run_cli(["plan", str(path), "--wait", "--json", "--name", name], live.client_env())
    helper.join(60)
    assert run.code == 1, run.stderr
    assert json.loads(run.stdout)["status"] == "cancelled"
    assert "cancelled" in run.stderr.splitlines()[-1]


def test_bad_input_exits_2_with_a_message(live: LiveService, tmp_path: Path) -> None:
    env = live.client_env()
    missing = run_cli(["plan", str(tmp_path / "nope.json")], env)
    assert (
        missing.code == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    )

    shapeless = tmp_path / "shapeless.json"
    shapeless.write_text(json.dumps({"per_sample_losses": [1.0]}))
    run = run_cli(["plan", str(shapeless)], env)
    assert run.code == 2 and "`measurements`" in run.stderr

    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"measurements": {"per_sample_losses": [1.0, -2.0]}}))
    run = run_cli(["plan", str(invalid), "--wait"], env)
    assert run.code == 2 and "body.measurements.per_sample_losses" in run.stderr
    assert "Traceback" not in run.stderr

    run = run_cli(["jobs", "show", str(uuid.uuid4())], env)
    assert run.code == 2 and "404" in run.stderr and "job not found" in run.stderr

    run = run_cli(["jobs", "list", "--tag", "no-equals-sign"], env)
    assert run.code == 2 and "KEY=VALUE" in run.stderr

    unreachable = live.client_env(CURVPLAN_URL=f"http://127.0.0.1:{free_port()}")
    run = run_cli(["jobs", "list"], unreachable)
    assert run.code == 3 and "could not reach" in run.stderr


def test_analyze_rejects_missing_files_before_uploading(live: LiveService, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    run = run_cli(
        [
            "analyze",
            "--spec",
            str(spec),
            "--checkpoint",
            str(tmp_path / "c.safetensors"),
            "--data",
            str(tmp_path / "d.safetensors"),
        ],
        live.client_env(),
    )
    assert run.code == 2 and "--checkpoint: file not found" in run.stderr


def test_help_lists_the_client_commands() -> None:
    run = run_cli(
        ["--help"], {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(Path(sys.prefix))}
    )
    for command in ("analyze", "plan", "jobs", "recommendations", "report"):
        assert command in run.stdout, run.stdout + run.stderr
