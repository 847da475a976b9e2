"""A Hugging Face Trainer output folder as an analysis takes it (curvplan/client/trainer_run.py):
what the parser reads back equals what the Trainer logged, and every bad folder is refused by
the client naming the file and the field, before anything is uploaded."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from curvplan.cli import app
from curvplan.client import _common as c
from curvplan.client.trainer_run import TrainerRunError, is_trainer_run, read_trainer_run
from curvplan.types.jobs import AnalyzeJobCreate

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: reaching the service would be exit 3


def _trainer_log(summary: dict[str, Any], step: int) -> float | None:
    """The oracle: the Trainer's in-memory log_history, last training loss at or before step."""
    losses = [e["loss"] for e in summary["log_history"] if "loss" in e and e["step"] <= step]
    return losses[-1] if losses else None


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("*.bin"))
    return out


def _cli(args: list[str]) -> Any:
    env = {"CURVPLAN_URL": DEAD_URL, "CURVPLAN_API_KEY": "k"}
    return CliRunner().invoke(app, args, env=env)


def test_steps_and_logged_losses_are_the_trainers(trainer_run: tuple[Path, dict]) -> None:
    run_dir, summary = trainer_run
    assert is_trainer_run(run_dir)
    run = read_trainer_run(run_dir)
    steps = [int(name.removeprefix("checkpoint-")) for name in summary["checkpoints"]]
    assert steps == [50, 100, 150, 200, 250, 300]
    assert run.w_star.name == "checkpoint-300" and run.w_star.step == 300
    assert [c.step for c in run.intermediates] == steps[:-1]  # oldest first, w* excluded
    for ckpt in (*run.intermediates, run.w_star):
        assert ckpt.logged_loss == _trainer_log(summary, ckpt.step)
        assert ckpt.logged_loss is not None  # logging every 10 steps: logged at the save
        assert ckpt.pretrained.shards == (run_dir / ckpt.name / "model.safetensors",)
    assert run.model["config"] == json.loads((run_dir / "checkpoint-300/config.json").read_text())
    # the losses fall over the run, as the trend needs them to
    assert run.intermediates[0].logged_loss > run.w_star.logged_loss  # type: ignore[operator]

    named = read_trainer_run(run_dir, "checkpoint-150")
    assert named.w_star.step == 150 and [c.step for c in named.intermediates] == [50, 100]
    assert read_trainer_run(run_dir, "150").w_star.name == "checkpoint-150"
    with pytest.raises(TrainerRunError, match=r"no checkpoint-7 \(it has checkpoint-50, "):
        read_trainer_run(run_dir, "7")


def test_the_submission_carries_each_checkpoints_step_and_loss(
    trainer_run: tuple[Path, dict],
) -> None:
    """The analyze body the client builds from the folder: w*'s config and weights, every
    earlier checkpoint's weights with its step and logged loss, and it validates."""
    run_dir, summary = trainer_run
    data = str(uuid.uuid4())
    sources = c.analyze_sources(run_dir, None, data, ())
    assert sources.checkpoint == run_dir / "checkpoint-300/model.safetensors"
    assert sources.intermediates == [
        run_dir / f"checkpoint-{s}/model.safetensors" for s in (50, 100, 150, 200, 250)
    ]
    ids = {p: str(uuid.uuid4()) for p, _ in sources.uploads()}
    ckpt, dataset, intermediates = sources.resolved(ids)
    body = c.analyze_body(sources.model, ckpt, dataset, None, None, None, None, None, intermediates)
    body = c.with_intermediate_logs(body, sources)
    assert body["intermediate_steps"] == [50, 100, 150, 200, 250]
    logged = [_trainer_log(summary, s) for s in body["intermediate_steps"]]
    assert body["intermediate_logged_losses"] == logged
    parsed = AnalyzeJobCreate.model_validate(body)
    assert parsed.model.model_dump()["config"]["model_type"] == "gpt2"
    with pytest.raises(ValueError, match="intermediate_checkpoints: the run folder's"):
        c.analyze_sources(run_dir, None, data, [run_dir / "checkpoint-50"])
    with pytest.raises(ValueError, match="w_star: names a checkpoint-<step> subfolder"):
        c.analyze_sources({"not": "a run"}, "x", data, (), w_star="10")


def test_a_folder_without_checkpoints_is_refused(trainer_run: tuple[Path, dict], tmp_path):
    run_dir, _ = trainer_run
    logs_only = tmp_path / "logs-only"
    logs_only.mkdir()
    shutil.copy(run_dir / "checkpoint-50/trainer_state.json", logs_only / "trainer_state.json")
    assert is_trainer_run(logs_only)
    with pytest.raises(TrainerRunError, match="no checkpoint-<step> subfolders"):
        read_trainer_run(logs_only)
    res = _cli(["analyze", "--model", str(logs_only), "--data", str(run_dir / "data.safetensors")])
    assert res.exit_code == 2, res.output  # before any upload: the dead URL was never tried
    assert "--model" in res.output and "no checkpoint-<step> subfolders" in res.output


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"global_step": "50", "log_history": []}', "global_step must be a non-negative"),
        ('{"global_step": 40, "log_history": []}', "global_step is 40 but the folder is"),
        ('{"global_step": 50, "log_history": {"loss": 1}}', "log_history must be a list"),
        (
            '{"global_step": 50, "log_history": [{"loss": 2.0, "step": 10}, '
            '{"loss": "high", "step": 20}]}',
            r"log_history\[1\]\.loss must be a finite",
        ),
        (
            '{"global_step": 50, "log_history": [{"loss": NaN, "step": 10}]}',
            r"log_history\[0\]\.loss must be a finite",
        ),
        ('{"global_step": 50, "log_history": [{"loss": 2.0}]}', r"log_history\[0\]\.step"),
    ],
)
def test_a_trainer_state_that_does_not_parse_is_named(
    trainer_run: tuple[Path, dict], tmp_path: Path, state: str, field: str
) -> None:
    run_dir = _copy(trainer_run[0], tmp_path)
    (run_dir / "checkpoint-50/trainer_state.json").write_text(state)
    with pytest.raises(TrainerRunError, match=field) as err:
        read_trainer_run(run_dir)
    assert "checkpoint-50/trainer_state.json" in str(err.value)


def test_checkpoints_of_another_model_are_refused(trainer_run: tuple[Path, dict], tmp_path):
    """A checkpoint of another architecture (its config) or of other tensors (its weights) in
    the run: named by folder and field, by the client and by the CLI before any upload."""
    from safetensors.torch import save_file

    from curvplan_worker.curvature.hf import build_hf_model, save_hf_weights
    from curvplan_worker.curvature.hf_example import EXAMPLE_CONFIGS

    run_dir = _copy(trainer_run[0], tmp_path)
    llama = EXAMPLE_CONFIGS["llama"]
    (run_dir / "checkpoint-100/config.json").write_text(json.dumps(llama))
    save_hf_weights(build_hf_model(llama), run_dir / "checkpoint-100/model.safetensors")
    with pytest.raises(TrainerRunError, match="model_type is 'llama' but checkpoint-300") as err:
        read_trainer_run(run_dir)
    assert "checkpoint-100/config.json" in str(err.value)
    res = _cli(["analyze", "--model", str(run_dir), "--data", str(run_dir / "data.safetensors")])
    assert res.exit_code == 2 and "model_type is 'llama'" in res.output, res.output

    # same config, weights of another size: the tensors are named
    shutil.copy(run_dir / "checkpoint-50/config.json", run_dir / "checkpoint-100/config.json")
    wide = build_hf_model({**EXAMPLE_CONFIGS["gpt2"], "n_embd": 64})
    tensors = {n: p.detach().contiguous() for n, p in wide.module.named_parameters()}
    save_file(tensors, str(run_dir / "checkpoint-100/model.safetensors"))
    with pytest.raises(TrainerRunError, match=r"other shape transformer\.h\.0") as err:
        read_trainer_run(run_dir)
    assert "checkpoint-100" in str(err.value) and "not the tensors of checkpoint-300" in str(
        err.value
    )
    # w* named before the odd checkpoint: the run up to it is fine
    assert read_trainer_run(run_dir, "checkpoint-50").intermediates == ()


def test_cli_options_that_do_not_fit_a_run_folder(trainer_run: tuple[Path, dict]) -> None:
    run_dir, _ = trainer_run
    data = str(run_dir / "data.safetensors")
    res = _cli(["analyze", "--model", str(run_dir), "--data", data, "--intermediate", data])
    assert res.exit_code == 2 and "drop --intermediate" in res.output, res.output
    res = _cli(["analyze", "--model", str(run_dir), "--data", data, "--w-star", "checkpoint-9"])
    assert res.exit_code == 2 and "no checkpoint-9" in res.output, res.output
    top = run_dir / "checkpoint-300"  # a save_pretrained directory, not a run
    res = _cli(["analyze", "--model", str(top), "--data", data, "--w-star", "300"])
    assert res.exit_code == 2 and "not a Trainer output folder" in res.output, res.output


def test_intermediate_logs_must_match_the_checkpoints() -> None:
    """Server-side schema: one step and one logged loss per intermediate, steps increasing."""
    from pydantic import ValidationError

    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    body = {
        "kind": "analyze",
        "model": {"source": "huggingface", "config": {"model_type": "gpt2"}},
        "checkpoint": a,
        "dataset": b,
        "intermediate_checkpoints": [a, b],
    }
    for extra, loc, text in (
        ({"intermediate_steps": [5]}, "intermediate_steps", "1 entries for 2"),
        ({"intermediate_steps": [9, 5]}, "intermediate_steps", "must increase"),
        ({"intermediate_logged_losses": [1.0, 2.0, 3.0]}, "intermediate_logged_losses", "3 e"),
        ({"intermediate_logged_losses": [1.0, -1.0]}, "intermediate_logged_losses", "greater"),
    ):
        with pytest.raises(ValidationError) as err:
            AnalyzeJobCreate.model_validate({**body, **extra})
        (error,) = err.value.errors()
        assert error["loc"][0] == loc and text in error["msg"], error
    ok = AnalyzeJobCreate.model_validate(
        {**body, "intermediate_steps": [5, None], "intermediate_logged_losses": [None, 1.5]}
    )
    assert ok.intermediate_steps == [5, None] and ok.intermediate_logged_losses == [None, 1.5]


def test_next_step_repeats_how_the_analysis_was_submitted() -> None:
    """A Hugging Face analysis is told `sweep --model MODEL_DIR` with its evaluation file, a
    reference-spec analysis `--spec model.json`; never the other's flags."""
    from curvplan.types.huggingface import HuggingFaceModel
    from curvplan.types.spec import ModelSpec
    from curvplan_core.planner.budget_section import data_sweep_next_step
    from curvplan_worker.analyze.pipeline import command_flags
    from curvplan_worker.curvature.hf_example import EXAMPLE_CONFIGS

    hf = HuggingFaceModel.model_validate(
        {"source": "huggingface", "config": EXAMPLE_CONFIGS["gpt2"]}
    )
    step = command_flags(hf, "data.safetensors").applied(data_sweep_next_step(1.3, 4096, 31.0))
    assert step is not None
    assert step.command.startswith("curvplan sweep --type data --model MODEL_DIR --train ")
    assert "--eval data.safetensors" in step.command and "--spec" not in step.command
    assert "curvplan analyze --model MODEL_DIR --data data.safetensors --sweep" in (
        step.estimated_cost
    )
    from curvplan_worker.curvature.example import EXAMPLE_SPEC

    spec = ModelSpec.model_validate(EXAMPLE_SPEC)
    ref = command_flags(spec, "my data.safetensors").applied(data_sweep_next_step(1.3, 4096, None))
    assert ref is not None
    assert "--spec model.json" in ref.command and "--model" not in ref.command
    assert "--eval 'my data.safetensors'" in ref.command  # shell-quoted as uploaded
