"""curvplan.runs: measurements.batch_sweeps from runs at several token counts, against an
export generated from a known batch scaling law (B_crit(D) = c·D^γ, S = S_min(1 + B_crit/B));
the planner's answer for the target run from them; and every size left out says why."""

from __future__ import annotations

import os
from pathlib import Path

import export_gen
import pytest
import sweep_gen as gen
from typer.testing import CliRunner

from curvplan.cli import app
from curvplan.commands.import_runs import RunSource, report_text
from curvplan.runs import ParamNames, build_tables, read_runs_file
from curvplan.types.planner import Measurements, Targets
from curvplan_core.planner import make_plan

FAST = {"orderings": 8, "bootstrap": 50}
DEAD = {**os.environ, "CURVPLAN_URL": "http://127.0.0.1:9", "CURVPLAN_API_KEY": "k"}


@pytest.fixture(params=["csv", "jsonl"])
def export(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    write = export_gen.write_csv if request.param == "csv" else export_gen.write_jsonl
    return write(tmp_path / f"sweeps.{request.param}", gen.sweep_rows())


def test_batch_sweeps_are_each_token_counts_logged_crossings(export: Path) -> None:
    result = build_tables(read_runs_file(export), gen.TARGET, target_tokens=gen.TARGET_TOKENS)
    assert result.batch_sweeps == gen.expected_sweeps()
    # steps_to_target keeps one size (all have every batch size: the largest), for the
    # pilots' own B_crit
    largest = gen.expected_sweeps()[-1]
    assert result.steps_to_target == largest["steps_to_target"]
    assert result.steps_data_tokens == gen.TOKENS[-1]
    measurements = result.measurements()
    assert measurements["batch_sweeps"] == gen.expected_sweeps()
    assert measurements["steps_to_target_loss"] == gen.TARGET
    report = result.report()
    assert report["target_tokens"] == gen.TARGET_TOKENS
    sweeps = report["tables"]["batch_sweeps"]
    assert sweeps["sent"] and sweeps["rows"] == len(gen.TOKENS)
    assert [g["tokens"] for g in sweeps["groups"] if g["sent"]] == list(gen.TOKENS)
    assert not report["skipped"]
    run = next(e for e in report["used"] if e["run"] == "d1e+07-b8")
    assert run["used_in"]["batch_sweeps"]["steps"] == gen.logged_crossing(1e7, 8)
    assert "steps_to_target holds the runs on 6.4e+08 tokens" in run["reasons"]["steps_to_target"]


def test_the_plan_answers_the_target_run_from_the_law(tmp_path: Path) -> None:
    export = export_gen.write_csv(tmp_path / "sweeps.csv", gen.sweep_rows())
    result = build_tables(read_runs_file(export), gen.TARGET, target_tokens=gen.TARGET_TOKENS)
    targets = Targets(target_loss=gen.TARGET, target_tokens=gen.TARGET_TOKENS, **FAST)
    rec = make_plan(Measurements(**result.measurements()), targets, seed=0)
    batch = rec.budget.batch
    assert batch.source == "batch_scaling_law"
    law = batch.scaling_law
    assert law.gamma_ci[0] <= gen.GAMMA <= law.gamma_ci[1]
    truth = gen.b_crit(gen.TARGET_TOKENS)
    assert batch.critical_ci[0] <= truth <= batch.critical_ci[1]
    assert law.measured_tokens_range == (gen.TOKENS[0], gen.TOKENS[-1])
    # each logged crossing is late by < EVAL_EVERY steps of ≥ 400: B_crit per sweep within 2 %
    assert all(s.used for s in law.sweeps)
    assert [s.b_crit for s in law.sweeps] == pytest.approx(
        [gen.b_crit(d) for d in gen.TOKENS], rel=0.02
    )
    # the pilots' own B_crit, from steps_to_target, is still answered
    assert rec.batch_size.b_crit.value == pytest.approx(gen.b_crit(gen.TOKENS[-1]), rel=0.02)
    assert "extrapolat" not in " ".join(w.detail for w in rec.warnings)


def test_sizes_in_examples_need_the_tokens_per_example(tmp_path: Path) -> None:
    export = export_gen.write_csv(tmp_path / "ex.csv", gen.sweep_rows(in_examples=True))
    records = read_runs_file(export)
    converted = build_tables(
        records,
        gen.TARGET,
        ParamNames(tokens_per_example=gen.TOKENS_PER_EXAMPLE),
        target_tokens=gen.TARGET_TOKENS,
    )
    assert converted.batch_sweeps == gen.expected_sweeps()
    assert converted.measurements()["tokens_per_example"] == gen.TOKENS_PER_EXAMPLE
    refused = build_tables(records, gen.TARGET)  # no target run asked for: still said
    assert refused.batch_sweeps is None and refused.steps_to_target is not None
    note = refused.table_notes["batch_sweeps"]
    assert "0 usable and 4 more at sizes known in examples only" in note
    assert "--tokens-per-example N" in note
    groups = refused.report()["tables"]["batch_sweeps"]["groups"]
    assert all("give --tokens-per-example N" in g["reason"] for g in groups)


def test_too_few_sizes_or_batch_sizes_are_said_per_group(tmp_path: Path) -> None:
    two_batches = gen.sweep_rows(gen.TOKENS[:1], (8, 1024))
    rows = two_batches + gen.sweep_rows(gen.TOKENS[1:])
    result = build_tables(read_runs_file(export_gen.write_csv(tmp_path / "a.csv", rows)), 2.5)
    assert result.batch_sweeps == gen.expected_sweeps(gen.TOKENS[1:])
    skipped = [g for g in result.report()["tables"]["batch_sweeps"]["groups"] if not g["sent"]]
    assert [g["tokens"] for g in skipped] == [gen.TOKENS[0]]
    assert "2 batch sizes reached the target" in skipped[0]["reason"]
    assert "at least 3" in skipped[0]["reason"]  # the plan's own BatchSweep rule
    text = report_text(result, RunSource(None, tmp_path / "a.csv", [], None, None, ParamNames()))
    assert "steps_to_target (target loss 2.5, runs on 6.4e+08 tokens):" in text
    assert "batch_sweeps (B_crit(D) = c·D^γ over 3 token counts; the law give" in text
    assert "  4e+07 tokens: batch 8, 16, 32, 64, 128, 256, 512, 1024" in text
    assert "batch_sweeps: skipped 1e+07 tokens: 2 batch sizes reached the target" in text

    one_size = two_batches + gen.sweep_rows(gen.TOKENS[-1:])
    path = export_gen.write_csv(tmp_path / "b.csv", one_size)
    lone = build_tables(read_runs_file(path), 2.5, target_tokens=gen.TARGET_TOKENS)
    assert lone.batch_sweeps is None and lone.steps_to_target is not None
    assert "at 2 or more token counts; 1 usable" in lone.table_notes["batch_sweeps"]
    # one sweep and no target run: the law is not in question, and not mentioned
    quiet = build_tables(read_runs_file(path), 2.5)
    report = quiet.report()
    assert quiet.sweep_groups is None and "batch_sweeps" not in report["tables"]
    assert not [
        e for e in report["used"] + report["skipped"] if "batch_sweeps" in e.get("reasons", {})
    ]


@pytest.mark.parametrize(
    ("rows", "args", "message"),
    [
        (gen.sweep_rows(in_examples=True), [], "give --tokens-per-example N"),
        (gen.sweep_rows(gen.TOKENS[-1:]), [], "at 2 or more token counts; 1 usable"),
        (gen.sweep_rows(), ["--target-loss", "0.1"], "no run with a batch size reached"),
    ],
    ids=["examples-only", "one-size", "target-never-reached"],
)
def test_target_tokens_without_a_law_submits_nothing(
    tmp_path: Path, rows: list[dict], args: list[str], message: str
) -> None:
    export = export_gen.write_csv(tmp_path / "runs.csv", rows)
    argv = ["plan", "--from-runs", str(export), "--target-loss", "2.5", "--target-tokens", "4e9"]
    out = CliRunner().invoke(app, argv + args, env=DEAD)
    assert out.exit_code == 2, out.output
    assert message in out.stderr and "nothing submitted" in out.stderr


def test_target_tokens_usage_errors(tmp_path: Path) -> None:
    export = export_gen.write_csv(tmp_path / "runs.csv", gen.sweep_rows(gen.TOKENS[:1]))
    measurements = tmp_path / "m.json"
    measurements.write_text('{"measurements": {}}')
    alone = CliRunner().invoke(app, ["plan", str(measurements), "--target-tokens", "4e9"], env=DEAD)
    assert alone.exit_code == 2 and "--target-tokens: only with --from-mlflow" in alone.stderr
    zero = ["plan", "--from-runs", str(export), "--target-loss", "2.5", "--target-tokens", "0"]
    out = CliRunner().invoke(app, zero, env=DEAD)
    assert out.exit_code == 2 and "--target-tokens 0: Input should be greater than 0" in out.stderr
