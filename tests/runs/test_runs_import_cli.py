"""``curvplan plan --from-runs FILE``: a tracker's CSV export to a budget in one command (the
live service), and the usage errors that submit nothing (in-process, no service: the URL is a
closed port, so a submission attempt would exit 3, not 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import export_gen as gen
import pytest
import sweep_gen
from cli_helpers import run_cli
from live_plugin import LiveService
from typer.testing import CliRunner

from curvplan.cli import app

DEAD = {**os.environ, "CURVPLAN_URL": "http://127.0.0.1:9", "CURVPLAN_API_KEY": "k"}


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return gen.write_csv(tmp_path / "runs.csv", gen.all_rows())


def test_from_runs_csv_to_a_budget(live: LiveService, export: Path, tmp_path: Path) -> None:
    args = ["plan", "--from-runs", str(export), "--target-loss", str(gen.TARGET), "--wait",
            "--json"]  # fmt: skip
    out = run_cli(args, live.client_env(), timeout=240)
    assert out.code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["runs"]["used"]) == len(gen.BATCH_SIZES) + len(gen.DATA_SIZES)
    assert doc["runs"]["skipped"] == []
    assert "steps_to_target (target loss 2.5" in out.stderr  # the report, off stdout
    job = doc["job"]
    assert job["status"] == "succeeded"
    budget = job["result"]["recommendation"]["budget"]
    assert budget["batch"]["source"] == "batch_sweep"
    assert budget["batch"]["critical"] == pytest.approx(gen.B_CRIT, rel=0.03)
    d_target = (gen.A / (gen.TARGET - gen.E)) ** (1 / gen.BETA)
    assert budget["data"]["source"] == "data_sweep"
    assert budget["data"]["recommended_examples"] == pytest.approx(d_target, rel=0.01)

    # in words, without waiting: the tables and the submitted job on stdout
    words = run_cli(["plan", "--from-runs", str(export), "--target-loss", "2.5"],
                    live.client_env(), timeout=120)  # fmt: skip
    assert words.code == 0, words.stderr
    assert "runs from" in words.stdout and "13 used, 0 skipped" in words.stdout
    assert f"batch 8: {gen.logged_crossing(8)} steps (± {gen.EVAL_EVERY})" in words.stdout
    assert "submitted job" in words.stdout


def test_from_runs_at_several_token_counts_to_the_target_runs_batch(
    live: LiveService, tmp_path: Path
) -> None:
    """Runs at 4 token counts, each a batch sweep, sized in examples: with
    --tokens-per-example and --target-tokens the job answers budget.batch from the law."""
    export = gen.write_jsonl(tmp_path / "sweeps.jsonl", sweep_gen.sweep_rows(in_examples=True))
    args = ["plan", "--from-runs", str(export), "--target-loss", str(sweep_gen.TARGET),
            "--tokens-per-example", str(sweep_gen.TOKENS_PER_EXAMPLE),
            "--target-tokens", str(sweep_gen.TARGET_TOKENS), "--wait", "--json"]  # fmt: skip
    out = run_cli(args, live.client_env(), timeout=240)
    assert out.code == 0, out.stderr
    doc = json.loads(out.stdout)
    sweeps = doc["runs"]["tables"]["batch_sweeps"]
    assert sweeps["sent"] and [g["tokens"] for g in sweeps["groups"]] == list(sweep_gen.TOKENS)
    assert "the law answers the target run's 4e+09 tokens" in out.stderr
    job = doc["job"]
    assert job["status"] == "succeeded"
    batch = job["result"]["recommendation"]["budget"]["batch"]
    assert batch["source"] == "batch_scaling_law"
    assert batch["scaling_law"]["target_tokens"] == sweep_gen.TARGET_TOKENS
    lo, hi = batch["scaling_law"]["gamma_ci"]
    assert lo <= sweep_gen.GAMMA <= hi
    truth = sweep_gen.b_crit(sweep_gen.TARGET_TOKENS)
    assert batch["critical_ci"][0] <= truth <= batch["critical_ci"][1]
    # the target run's steps: its tokens over (recommended batch × tokens per example)
    steps = sweep_gen.TARGET_TOKENS / (batch["recommended"] * sweep_gen.TOKENS_PER_EXAMPLE)
    assert batch["expected_steps"] == pytest.approx(steps)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan"], "give a MEASUREMENTS file, --from-mlflow EXPERIMENT or --from-runs FILE"),
        (["plan", "--from-runs", "{export}", "--from-mlflow", "x"], "not both"),
        (["plan", "--from-runs", "{export}", "--run-id", "abc"], "--run-id need --from-mlflow"),
        (["plan", "{clash}", "--devices", "2"], "--devices: only with --from-mlflow or"),
        (["plan", "--from-runs", "{export}", "--param", "bs=batch"], "unknown parameter role"),
        (["plan", "--from-runs", "{export}", "--loss-metric", "val"], "no loss column"),
        (["plan", "--from-runs", "{tmp}/missing.csv"], "cannot read"),
        (["plan", "{clash}", "--from-runs", "{export}", "--target-loss", "2.5"],
         "already gives steps_to_target"),
        # a target no run reaches and too few data sizes for L(D): nothing usable
        (["plan", "--from-runs", "{small}", "--target-loss", "0.1"], "no usable run"),
    ],
)  # fmt: skip
def test_usage_errors_submit_nothing(
    export: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps({"measurements": {"steps_to_target": [
        {"batch_size": 8, "steps": 10}]}}))  # fmt: skip
    small = gen.write_csv(tmp_path / "small.csv", [r for r in gen.all_rows()
                          if r["run"] in ("batch-8", "data-1000")])  # fmt: skip
    paths = {"export": export, "tmp": tmp_path, "clash": clash, "small": small}
    out = CliRunner().invoke(app, [a.format(**paths) for a in args], env=DEAD)
    assert out.exit_code == 2, out.output
    assert message in out.stderr
