"""The client commands end to end: real CLI subprocesses against real serve + worker processes
(terminal output through a pty, JSON through pipes, exit codes), plus in-process runs of the
error paths."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from analyze_files import option_flags, write_analyze_files
from cli_helpers import CLI, run_cli, run_cli_in_pty
from live_plugin import LiveService, free_port
from plan_bodies import B_CRIT, full_measurements, full_targets, small_plan
from typer.testing import CliRunner

import curvplan
from curvplan.cli import app

pytestmark = pytest.mark.e2e


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"measurements": full_measurements(), "targets": full_targets()}))
    return path


@pytest.fixture(scope="module")
def analyze_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_analyze_files(tmp_path_factory.mktemp("analyze-files"))


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # rich's styles and cursor moves on a terminal


def in_process(args: list[str], live: LiveService, **env: str) -> Any:
    """Run the CLI in this process (same code as the console script; no interpreter start)."""
    environ = {"CURVPLAN_URL": live.url, "CURVPLAN_API_KEY": live.api_key, **env}
    return CliRunner().invoke(app, args, env=environ)


def test_analyze_wait_in_a_terminal(live: LiveService, analyze_dir: dict[str, Path]) -> None:
    name = f"cli-analyze-{uuid.uuid4().hex[:6]}"
    args = [
        "analyze", "--spec", str(analyze_dir["spec"]),
        "--checkpoint", str(analyze_dir["checkpoint"]), "--data", str(analyze_dir["data"]),
        "--targets", str(analyze_dir["targets"]), "--name", name, "--tag", "team=nlp",
        *option_flags(), "--wait",
    ]  # fmt: skip
    run = run_cli_in_pty(args, live.client_env(), timeout=240)
    out = run.stdout
    assert run.code == 0, out
    # uploads, then rich's bar redrawn in place, full at the end
    assert "uploading" in out and "\r\x1b[2K" in out and "━" * 28 in out
    plain = ANSI.sub("", out)
    assert "100%" in plain and "succeeded" in plain
    # The engine's stage names reach the terminal: the bar while running, and the timeline of
    # every stage (from the job's progress history) once it has finished.
    timeline = next(line for line in plain.splitlines() if line.startswith("stages: "))
    assert "loading" in timeline and "block spectra" in timeline and "planning" in timeline
    assert "Curvature per block" in out and "layers.0.v" in out
    with curvplan.Client(live.url, live.api_key) as api:
        (listed,) = api.list_jobs(name=name).items
        job = api.get_job(listed.id)  # list pages omit the request
        assert job.kind == "analyze" and job.tags == {"team": "nlp"}
        assert job.request["options"]["off_diagonal"] == [  # type: ignore[index]
            ["layers.0.q", "layers.0.k"], ["layers.0.k", "layers.0.v"]
        ]  # fmt: skip


def test_failed_analyze_exits_1_with_json_in_a_pipe(
    live: LiveService, analyze_dir: dict[str, Path]
) -> None:
    args = [
        "analyze", "--spec", str(analyze_dir["spec"]),
        "--checkpoint", str(analyze_dir["wider"]), "--data", str(analyze_dir["data"]),
        # an earlier save of the same (wider) weights: the API checks it against w*, not the spec
        "--intermediate", str(analyze_dir["wider"]), *option_flags(), "--wait", "--json",
    ]  # fmt: skip
    run = run_cli(args, live.client_env(), timeout=240)
    assert run.code == 1, run.stderr
    job = json.loads(run.stdout)  # stdout is pure JSON even when the job fails
    assert job["status"] == "failed" and job["kind"] == "analyze"
    assert "checkpoint" in job["error"]["detail"]
    assert run.stderr.splitlines()[-1].startswith(f"error: job {job['id']} failed")
    assert len(job["request"]["intermediate_checkpoints"]) == 1  # uploaded and passed on


def test_plan_json_in_a_pipe_and_report_files(
    live: LiveService, plan_file: Path, tmp_path: Path
) -> None:
    name = f"cli-json-{uuid.uuid4().hex[:8]}"
    run = run_cli(
        ["plan", str(plan_file), "--wait", "--json", "--name", name, "--tag", "team=nlp"],
        live.client_env(),
    )
    assert run.code == 0, run.stderr
    job = json.loads(run.stdout)
    assert job["status"] == "succeeded" and job["name"] == name and job["tags"] == {"team": "nlp"}
    b_crit = job["result"]["recommendation"]["batch_size"]["b_crit"]["value"]
    assert b_crit == pytest.approx(B_CRIT, rel=1e-3)
    assert "\r" not in run.stderr and f"job {job['id']} succeeded" in run.stderr  # plain lines

    out = tmp_path / "report"
    files = run_cli(["report", job["id"], "--out", str(out)], live.client_env())
    assert files.code == 0, files.stderr
    written = sorted(Path(line).name for line in files.stdout.split())
    drawn = ["delta-curve", "block-norms", "batch-size", "loss-vs-data"]
    assert written == sorted([*(f"{p}.{fmt}" for p in drawn for fmt in ("svg", "png")),
                              "report.html", "numbers.json"])  # fmt: skip
    for plot in drawn:  # the service's drawings, byte for byte
        assert (out / f"{plot}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert "<svg" in (out / f"{plot}.svg").read_text()
    numbers = json.loads((out / "numbers.json").read_text())
    assert numbers["job"]["id"] == job["id"]
    assert numbers["headline"]["batch.b_crit"] == pytest.approx(b_crit)
    assert numbers["plots"]["batch-size"]["numbers"]["fit"]["b_crit"] == pytest.approx(b_crit)
    assert "analyze" in numbers["plots"]["off-diagonal"]["empty_reason"]


def test_plan_in_a_terminal_and_report_open(
    live: LiveService, plan_file: Path, tmp_path: Path
) -> None:
    name = f"cli-tty-{uuid.uuid4().hex[:8]}"
    run = run_cli_in_pty(["plan", str(plan_file), "--wait", "--name", name], live.client_env())
    assert run.code == 0, run.stdout
    out = run.stdout
    assert "\r\x1b[2K" in out and "━" * 28 in out and "100%" in ANSI.sub("", out)
    assert "Batch size (McCandlish et al. 2018)" in out and "TOLERANCE" in out
    assert "B_crit" in out and "500" in out  # the generated B_crit, printed in the table

    opened = tmp_path / "opened.txt"
    browser = tmp_path / "fake-browser"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(browser.stat().st_mode | stat.S_IEXEC)
    with curvplan.Client(live.url, live.api_key) as api:
        (job,) = api.list_jobs(name=name).items
    result = in_process(["report", str(job.id), "--open"], live, BROWSER=str(browser))
    assert result.exit_code == 0, result.output
    deadline = time.monotonic() + 10
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    url = opened.read_text().strip()
    assert url.startswith(live.url) and "token=" in url and url in result.output
    page = httpx.get(url, timeout=30)  # no key: the signed link is enough
    assert page.status_code == 200 and 'id="delta-curve"' in page.text

    printed = in_process(["report", name, "--json"], live)  # by name; no browser: the link
    assert printed.exit_code == 0, printed.output
    link = json.loads(printed.stdout)
    assert link["url"].startswith(live.url) and "token=" in link["url"]
    assert httpx.get(link["url"], timeout=30).status_code == 200


def test_cancelled_job_exits_1(live: LiveService, tmp_path: Path) -> None:
    body = small_plan(f"cli-cancel-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"measurements": body["measurements"]}))
    with live.worker.paused():  # the job stays queued until cancelled
        proc = subprocess.Popen(
            [*CLI, "plan", str(path), "--wait", "--json", "--name", body["name"]],
            env=live.client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        with curvplan.Client(live.url, live.api_key) as api:
            deadline = time.monotonic() + 60
            while not (jobs := api.list_jobs(name=body["name"]).items):
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
            api.cancel_job(jobs[0].id)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert json.loads(stdout)["status"] == "cancelled"
    assert "cancelled" in stderr.splitlines()[-1]


def test_bad_input_exits_2_in_a_subprocess(live: LiveService, tmp_path: Path) -> None:
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"measurements": {"per_sample_losses": [1.0, -2.0]}}))
    run = run_cli(["plan", str(invalid), "--wait"], live.client_env())
    assert run.code == 2 and "body.measurements.per_sample_losses" in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


def test_error_paths_and_listing_in_process(live: LiveService, tmp_path: Path) -> None:
    missing = in_process(["plan", str(tmp_path / "nope.json")], live)
    assert missing.exit_code == 2 and "cannot read" in missing.output

    shapeless = tmp_path / "shapeless.json"
    shapeless.write_text(json.dumps({"per_sample_losses": [1.0]}))
    result = in_process(["plan", str(shapeless)], live)
    assert result.exit_code == 2 and "`measurements`" in result.output

    result = in_process(["jobs", "show", str(uuid.uuid4())], live)
    assert result.exit_code == 2 and "404" in result.output and "job not found" in result.output
    result = in_process(["jobs", "show", "not-a-uuid"], live)
    assert result.exit_code == 2 and "neither a job id nor the name of a job" in result.output
    result = in_process(["jobs", "list", "--tag", "no-equals-sign"], live)
    assert result.exit_code == 2 and "KEY=VALUE" in result.output
    result = in_process(["jobs", "list"], live, CURVPLAN_API_KEY="wrong")
    assert result.exit_code == 2 and "401" in result.output
    result = in_process(["jobs", "list"], live, CURVPLAN_URL=f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 3 and "could not reach" in result.output
    result = in_process(["report", str(uuid.uuid4())], live)
    assert result.exit_code == 2 and "404" in result.output
    result = in_process(
        ["analyze", "--spec", str(shapeless), "--checkpoint", str(tmp_path / "c.safetensors"),
         "--data", str(tmp_path / "d.safetensors")],
        live,
    )  # fmt: skip
    assert result.exit_code == 2 and "--checkpoint: file not found" in result.output

    name = f"cli-list-{uuid.uuid4().hex[:6]}"
    with curvplan.Client(live.url, live.api_key) as api:
        job = api.submit_job(small_plan(name, {"team": "nlp"}))
        api.wait(job.id, timeout=60)
    listed = in_process(["jobs", "list", "--name", name, "--json"], live)
    assert listed.exit_code == 0 and [j["id"] for j in json.loads(listed.stdout)] == [str(job.id)]
    table = in_process(["jobs", "list", "--name", name], live)
    assert str(job.id) in table.output and "team=nlp" in table.output
    for ref in (str(job.id), name):  # by id, or by name like `report`
        shown = in_process(["jobs", "show", ref], live)
        assert f"job        {job.id}" in shown.output and "status     succeeded" in shown.output
    again = in_process(["jobs", "cancel", str(job.id)], live)
    assert again.exit_code == 2 and "only queued or running jobs can be cancelled" in again.output
    waited = in_process(["jobs", "wait", name, "--json"], live)
    assert waited.exit_code == 0 and json.loads(waited.stdout)["status"] == "succeeded"
    latest = in_process(["recommendations", name, "--json"], live)
    assert latest.exit_code == 0 and json.loads(latest.stdout)["job_id"] == str(job.id)
    text = in_process(["recommendations", name], live)
    assert text.exit_code == 0 and f"plan job {job.id}" in text.output
    assert "Sample size" in text.output
    nobody = in_process(["recommendations", f"{name}-nobody"], live)
    assert nobody.exit_code == 1 and "no succeeded job named" in nobody.output


def test_help_lists_the_client_commands() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    run = run_cli(["--help"], env)
    for command in ("analyze", "plan", "jobs", "recommendations", "report"):
        assert command in run.stdout, run.stdout + run.stderr
    version = run_cli(["--version"], env)
    assert version.stdout.strip() == f"curvplan {curvplan.__version__}"
    # Brackets in help text are text, not markup: the extra to install and the defaults stay.
    analyze_help = run_cli(["analyze", "--help"], env).stdout
    assert "curvplan[mlflow]" in analyze_help, analyze_help
    sweep_help = run_cli(["sweep", "--help"], env).stdout
    assert "[default: batch]" in sweep_help and "--idempotency-key" in sweep_help


def test_wait_timeout_exits_4(live: LiveService, tmp_path: Path) -> None:
    body = small_plan(f"cli-timeout-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"measurements": body["measurements"], "name": body["name"]}))
    with live.worker.paused():
        result = in_process(["plan", str(path), "--wait", "--timeout", "0.5"], live)
        assert result.exit_code == 4, result.output
        assert "still queued after 0.5 s" in result.output and "curvplan jobs show" in result.output
        with curvplan.Client(live.url, live.api_key) as api:
            (job,) = api.list_jobs(name=body["name"]).items  # the name came from the file
            assert api.cancel_job(job.id).status == "cancelled"


def test_branch_sweep_command_uploads_every_checkpoint_in_order(
    live: LiveService, analyze_dir: dict[str, Path], tmp_path: Path
) -> None:
    """``curvplan sweep --type branch --checkpoint A --checkpoint B`` sends the checkpoints as
    the branch sweep's list (their stored bytes are the files') with the branch flags; a
    repeated --checkpoint on another sweep type exits 2 before anything is sent."""
    import hashlib

    files = [
        "--spec", str(analyze_dir["spec"]),
        "--train", str(analyze_dir["data"]), "--eval", str(analyze_dir["data"]),
    ]  # fmt: skip
    from safetensors.numpy import load_file, save_file

    late = tmp_path / "late.safetensors"  # a later save of the same model: other values
    save_file({k: v + 1e-3 for k, v in load_file(analyze_dir["checkpoint"]).items()}, late)
    both = ["--checkpoint", str(analyze_dir["checkpoint"]), "--checkpoint", str(late)]
    twice = in_process(["sweep", *files, *both, "--type", "batch", "--target-loss", "1"], live)
    assert twice.exit_code == 2 and "repeat it only for --type branch" in twice.output
    no_window = in_process(["sweep", *files, *both, "--type", "branch", "--json"], live)
    assert no_window.exit_code == 2 and "window_tokens" in no_window.output

    name = f"cli-branch-{uuid.uuid4().hex[:8]}"
    with live.worker.paused():  # stays queued: only the submitted request is under test
        run = in_process(
            ["sweep", *files, *both, "--type", "branch", "--batch-sizes", "4,2",
             "--window-tokens", "96", "--tolerance", "0.02", "--compare", "window",
             "--checkpoint-steps", "5,9", "--name", name, "--json"],
            live,
        )  # fmt: skip
        assert run.exit_code == 0, run.output
        job_id = json.loads(run.stdout)["id"]
        with curvplan.Client(live.url, live.api_key) as api:
            request = api.get_job(job_id).request
            digests = [api.get_artifact(c).sha256 for c in request["checkpoints"]]
            api.cancel_job(job_id)
    assert digests == [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in both[1::2]]
    assert request.get("checkpoint") is None
    sweep = request["sweep"]
    assert (sweep["type"], sweep["window_tokens"], sweep["tolerance"]) == ("branch", 96, 0.02)
    assert sweep["compare"] == "window" and sweep["checkpoint_steps"] == [5, 9]
    assert sorted(sweep["batch_sizes"]) == [2, 4]


def test_sweep_command_submits_what_it_was_given(
    live: LiveService, analyze_dir: dict[str, Path], tmp_path: Path
) -> None:
    """``curvplan sweep`` uploads both datasets (the stored bytes are the files') and sends the
    flags as the sweep request; bad flags exit 2 naming the flag, before anything is sent."""
    import hashlib

    files = [
        "--spec", str(analyze_dir["spec"]),
        "--train", str(analyze_dir["data"]), "--eval", str(analyze_dir["data"]),
    ]  # fmt: skip
    bad = in_process(["sweep", *files, "--batch-sizes", "4,x"], live)
    assert bad.exit_code == 2 and "--batch-sizes: expected comma-separated integers" in bad.output
    missing = in_process(["sweep", *files[:2], "--train", str(tmp_path / "no.safetensors"),
                          "--eval", str(analyze_dir["data"])], live)  # fmt: skip
    assert missing.exit_code == 2 and "--train: file not found" in missing.output
    invalid = in_process(["sweep", *files, "--type", "learning-rate"], live)
    assert invalid.exit_code == 2 and "body.sweep" in invalid.output

    name = f"cli-sweep-{uuid.uuid4().hex[:8]}"
    with curvplan.Client(live.url, live.api_key) as api:
        api.create_webhook_secret()  # a webhook URL needs the project's signing secret
    with live.worker.paused():  # stays queued: only the submitted request is under test
        args = ["sweep", *files, "--batch-sizes", "16,4,8", "--target-loss", "0.3",
                "--lr", "0.01", "--lr-rule", "linear", "--max-steps", "50", "--name", name,
                "--tag", "team=nlp", "--idempotency-key", name,
                "--webhook-url", "http://127.0.0.1:9/hook", "--json"]  # fmt: skip
        run = in_process(args, live)
        assert run.exit_code == 0, run.output
        job_id = json.loads(run.stdout)["id"]
        replay = in_process(args, live)  # the same key: the same job, not a second sweep
        assert replay.exit_code == 0 and json.loads(replay.stdout)["id"] == job_id
        with curvplan.Client(live.url, live.api_key) as api:
            job = api.get_job(job_id)
            request = job.request
            digest = hashlib.sha256(analyze_dir["data"].read_bytes()).hexdigest()
            for key in ("train_data", "eval_data"):
                assert api.get_artifact(request[key]).sha256 == digest
            api.cancel_job(job_id)
    assert job.kind == "sweep" and job.name == name and job.tags == {"team": "nlp"}
    assert request["model"] == json.loads(analyze_dir["spec"].read_text())
    assert request["sweep"]["type"] == "batch" and request["sweep"]["target_loss"] == 0.3
    assert sorted(request["sweep"]["batch_sizes"]) == [4, 8, 16]
    assert request["sweep"]["max_steps"] == 50
    assert request["optimizer"]["lr"] == 0.01 and request["optimizer"]["lr_rule"] == "linear"
    assert request["webhook_url"] == "http://127.0.0.1:9/hook"
