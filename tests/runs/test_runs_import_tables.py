"""curvplan.runs: the steps-to-target and L(D) tables from a tracker's runs, against an
export generated from known laws (S = S_min(1 + B_crit/B), L(D) = E + A·D^(−β)); what the
planner recovers from them; and every run that is left out says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import export_gen as gen
import pytest

from curvplan.runs import (
    ParamNames,
    RunRecord,
    RunsInputError,
    build_tables,
    first_crossing,
    read_runs_file,
    resolve_run,
)
from curvplan.types.planner import Measurements, StepsPoint, Targets
from curvplan_core.planner import make_plan

FAST = {"orderings": 8, "bootstrap": 50}


@pytest.fixture(params=["csv", "jsonl"])
def export(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    write = gen.write_csv if request.param == "csv" else gen.write_jsonl
    return write(tmp_path / f"runs.{request.param}", gen.all_rows())


def test_the_tables_are_the_logged_crossings_and_final_losses(export: Path) -> None:
    result = build_tables(read_runs_file(export), gen.TARGET)
    assert result.steps_to_target == [
        {"batch_size": b, "steps": gen.logged_crossing(b), "steps_uncertainty": gen.EVAL_EVERY}
        for b in gen.BATCH_SIZES
    ]
    assert result.steps_data_examples == gen.BATCH_RUN_EXAMPLES
    assert result.loss_vs_data == [
        {"n_samples": d, "loss": pytest.approx(gen.E + gen.A * d ** (-gen.BETA), rel=1e-12)}
        for d in gen.DATA_SIZES
    ]
    report = result.report()
    assert not report["skipped"]
    reasons = {e["run"]: e.get("reasons", {}) for e in report["used"]}
    # the batch runs stopped at the target: their last loss is not an L(D) point
    assert "stopped at its first evaluation" in reasons["batch-8"]["loss_vs_data"]
    # the data runs each trained on another size than the batch sweep
    assert "steps_to_target holds the runs on 1e+07" in reasons["data-1000000"]["steps_to_target"]


def test_the_plan_recovers_b_crit_and_the_data_law(export: Path) -> None:
    result = build_tables(read_runs_file(export), gen.TARGET)
    rec = make_plan(
        Measurements(**result.measurements()), Targets(target_loss=gen.TARGET, **FAST), seed=0
    )
    b_crit = rec.batch_size.b_crit
    # the logged crossings are late by < EVAL_EVERY steps of ≥ 420: B_crit within 3 %
    assert b_crit.value == pytest.approx(gen.B_CRIT, rel=0.03)
    assert b_crit.s_min == pytest.approx(gen.S_MIN, rel=0.03)
    fitted = (rec.scaling.E, rec.scaling.A, rec.scaling.beta)
    assert fitted == pytest.approx((gen.E, gen.A, gen.BETA), rel=1e-2)
    budget = rec.budget
    assert budget.batch.source == "batch_sweep" and budget.data.source == "data_sweep"
    assert budget.batch.critical == pytest.approx(gen.B_CRIT, rel=0.03)
    d_target = (gen.A / (gen.TARGET - gen.E)) ** (1 / gen.BETA)
    assert budget.data.recommended_examples == pytest.approx(d_target, rel=0.01)
    assert "steps_to_target_coarse" not in [w.code for w in rec.warnings]


def test_first_crossing_and_why_there_is_none() -> None:
    history = [(10.0, 3.0), (20.0, 2.6), (35.0, 2.4), (50.0, 2.0)]
    crossing = first_crossing(history, 2.5)
    assert not isinstance(crossing, str)
    assert (crossing.steps, crossing.uncertainty) == (35.0, 15.0)  # between 20 and 35
    exact = first_crossing(history, 2.6)  # "at or below"
    assert not isinstance(exact, str) and exact.steps == 20.0
    first = first_crossing(history, 3.5)  # the first evaluation: from step 0
    assert not isinstance(first, str) and (first.steps, first.uncertainty) == (10.0, 10.0)
    never = first_crossing(history, 1.5)
    assert isinstance(never, str)
    assert "never reaches the target 1.5" in never and "lowest 2 at step 50" in never
    at_zero = first_crossing([(0.0, 1.0), (5.0, 0.9)], 2.0)
    assert isinstance(at_zero, str) and "step 0" in at_zero


def _record(run: str, params: dict[str, str], history=((10.0, 1.0),), **kw) -> RunRecord:
    return RunRecord(run=run, params=params, history=list(history), **kw)


def test_batch_and_data_params_are_mapped_or_named_as_missing() -> None:
    hf = {"per_device_train_batch_size": "8", "gradient_accumulation_steps": "4"}
    missing_devices = resolve_run(_record("a", hf), ParamNames())
    assert missing_devices.batch_size is None
    assert "per_device_train_batch_size=8 is per device" in missing_devices.batch_note
    assert "--devices" in missing_devices.batch_note
    assert resolve_run(_record("a", hf), ParamNames(devices=2)).batch_size == 64
    with_world = resolve_run(_record("a", {**hf, "world_size": "4"}), ParamNames())
    assert with_world.batch_size == 128
    mapped = ParamNames({"batch_size": "bs", "examples": "n"})
    run = resolve_run(_record("b", {"bs": "16", "n": "5000", "learning_rate": "3e-4"}), mapped)
    assert (run.batch_size, run.data_examples, run.lr) == (16, 5000.0, 3e-4)
    named = resolve_run(_record("c", {"batch_size": "16"}), mapped)
    assert named.batch_size is None and "tried bs" in named.batch_note
    not_a_number = resolve_run(_record("d", {"batch_size": "auto"}), ParamNames())
    assert "batch_size='auto' is not a number" in not_a_number.batch_note
    tokens = {"batch_size": "4", "train_tokens": "2048000"}
    no_tpe = resolve_run(_record("e", tokens), ParamNames())
    assert no_tpe.data_examples is None and "--tokens-per-example" in no_tpe.data_note
    converted = resolve_run(_record("e", tokens), ParamNames(tokens_per_example=512))
    assert (converted.data_examples, converted.data_tokens) == (4000.0, 2048000.0)
    with pytest.raises(RunsInputError, match="unknown parameter role"):
        ParamNames({"batchsize": "bs"})


def test_fastest_learning_rate_kept_and_repeats_averaged() -> None:
    def run(name: str, batch: int, lr: str, cross: float) -> RunRecord:
        history = [(s, 2.0 if s < cross else 1.0) for s in range(10, 400, 10)]
        return _record(name, {"batch_size": str(batch), "lr": lr}, history)

    records = [
        run("slow", 8, "0.1", 300), run("fast-1", 8, "0.3", 200), run("fast-2", 8, "0.3", 220),
        run("b16", 16, "0.3", 120),
    ]  # fmt: skip
    result = build_tables(records, 1.5)
    assert result.steps_to_target == [
        {"batch_size": 8, "steps": 210.0, "steps_uncertainty": 10.0},
        {"batch_size": 16, "steps": 120.0, "steps_uncertainty": 10.0},
    ]
    slow = next(e for e in result.report()["skipped"] if e["run"] == "slow")
    assert (
        "learning rate 0.3 reached the target in fewer steps" in slow["reasons"]["steps_to_target"]
    )


def test_bad_runs_are_skipped_with_reasons_and_nothing_usable_is_said() -> None:
    records = [
        _record("no-params", {"lr": "0.1"}, [(10.0, 3.0), (20.0, 2.0)]),
        _record("never", {"batch_size": "8", "examples": "100"}, [(10.0, 3.0), (20.0, 2.9)]),
        _record(
            "failed",
            {"batch_size": "16", "examples": "200"},
            [(10.0, 1.0)],
            status="FAILED",
            finished=False,
        ),
        _record("no-metric", {"batch_size": "32"}, [], history_note="no eval_loss metric"),
    ]
    result = build_tables(records, 2.5)
    assert not result.usable and result.measurements() == {}
    reasons = {e["run"]: e["reasons"] for e in result.report()["skipped"]}
    assert "no batch-size param" in reasons["no-params"]["steps_to_target"]
    assert "no dataset-size param" in reasons["no-params"]["loss_vs_data"]
    assert "never reaches the target 2.5 (lowest 2.9" in reasons["never"]["steps_to_target"]
    assert "status FAILED" in reasons["failed"]["loss_vs_data"]
    assert "only 1 batch size reached the target" in reasons["failed"]["steps_to_target"]
    assert reasons["no-metric"]["steps_to_target"] == "no eval_loss metric"
    no_target = build_tables(records, None)
    assert "no target loss" in no_target.table_notes["steps_to_target"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run,batch_size,step,loss\na,8,10,1.0\na,16,20,0.9\n", "a parameter is constant"),
        ("run,batch_size,step,loss\na,8,10,low\n", "loss 'low' is not a number"),
        ("run,batch_size,loss\na,8,1.0\n", "no step column"),
        ("batch_size,step,loss\n8,10,1.0\n", "no run column"),
        ('{"run": "a", "step": 1, "loss": 2}\n[1, 2]\n', ":2: each line must be a JSON object"),
        ("", "is empty"),
        ("run,step,loss\n", "has no rows"),
    ],
)
def test_unreadable_exports_name_the_line_and_column(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(text)
    with pytest.raises(RunsInputError, match=message):
        read_runs_file(path)


def test_steps_uncertainty_is_validated_and_a_coarse_table_warned() -> None:
    with pytest.raises(ValueError, match=r"steps_uncertainty 20\.0 exceeds steps 10\.0"):
        StepsPoint(batch_size=8, steps=10.0, steps_uncertainty=20.0)
    table = [
        {"batch_size": b, "steps": gen.steps_for(b), "steps_uncertainty": 0.3 * gen.steps_for(b)}
        for b in gen.BATCH_SIZES
    ]
    rec = make_plan(Measurements(steps_to_target=table), Targets(**FAST))
    coarse = [w for w in rec.warnings if w.code == "steps_to_target_coarse"]
    assert len(coarse) == 1 and "B=8:" in coarse[0].detail


def test_the_import_needs_neither_numpy_nor_mlflow(tmp_path: Path) -> None:
    """The client package imports curvplan.runs without numpy, and --from-mlflow without
    MLflow installed fails with the install hint, submitting nothing."""
    export = gen.write_csv(tmp_path / "runs.csv", gen.all_rows())
    code = f"""
import sys
sys.modules["numpy"] = None  # as if not installed
sys.modules["mlflow"] = None
from pathlib import Path
from curvplan.runs import build_tables, read_runs_file
result = build_tables(read_runs_file(Path({str(export)!r})), {gen.TARGET})
assert result.usable and result.steps_to_target and result.loss_vs_data
from curvplan.cli import main
sys.argv = ["curvplan", "plan", "--from-mlflow", "pilots", "--url", "http://127.0.0.1:9"]
main()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "pip install 'curvplan[mlflow]'" in out.stderr
    assert "Traceback" not in out.stderr
