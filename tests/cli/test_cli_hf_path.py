"""The newcomer's Hugging Face path on the CLI: ``curvplan example --arch gpt2`` writes what a
sweep and the noise-scale trend need, and ``curvplan sweep --model DIR`` trains that model on
the live workers (real serve + worker processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_helpers import run_cli
from live_plugin import LiveService
from safetensors import safe_open

import curvplan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 60  # the example trains this many steps, a Trainer checkpoint every SAVE_STEPS
SAVE_STEPS = 10  # checkpoint-10, checkpoint-20, …, checkpoint-60
SEQ = 32  # the example's sequence length: 32 ids give 31 next-token labels per sequence


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf-path") / "gpt2"
    run = run_cli(["example", "--arch", "gpt2", "--steps", str(STEPS), "--save-steps",
                   str(SAVE_STEPS), "--out", str(out)], dict(os.environ), timeout=300)  # fmt: skip
    assert run.code == 0, run.stderr
    assert "train.safetensors" in run.stdout and "checkpoint-10" in run.stdout
    return out


def _tensors(path: Path) -> tuple[dict[str, str], dict[str, object]]:
    with safe_open(str(path), "pt") as fh:
        return fh.metadata() or {}, {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def test_example_gpt2_writes_intermediate_checkpoints_and_training_data(gpt2_dir: Path) -> None:
    """The Trainer's checkpoint-<n> folders name their step, load into the model and differ
    from each other and from w* (they are the weights along the training run); the last one
    is the final model; train.safetensors is HF data."""
    import torch

    from curvplan_worker.curvature.hf import build_hf_model, load_hf_weights
    from curvplan_worker.curvature.sources import read_model_dir

    summary = json.loads((gpt2_dir / "example.json").read_text())
    assert summary["checkpoints"] == [f"checkpoint-{n}" for n in (10, 20, 30, 40, 50, 60)]
    assert summary["intermediate_checkpoints"] == summary["checkpoints"][:-1]
    model, shards = read_model_dir(gpt2_dir)
    final = build_hf_model(model["config"])
    load_hf_weights(final, shards)
    weights = {}
    for step in (10, 30, 60):
        state = json.loads((gpt2_dir / f"checkpoint-{step}/trainer_state.json").read_text())
        assert state["global_step"] == step
        built = build_hf_model(model["config"])
        shard = gpt2_dir / f"checkpoint-{step}/model.safetensors"
        assert load_hf_weights(built, [shard]) == []
        weights[step] = torch.nn.utils.parameters_to_vector(built.module.parameters()).detach()
    w_star = torch.nn.utils.parameters_to_vector(final.module.parameters()).detach()
    for a, b in ((weights[10], weights[30]), (weights[30], w_star)):
        assert float((a - b).norm()) > 1e-3 * float(b.norm())
    assert torch.equal(weights[60], w_star)  # the top-level model is the last checkpoint
    _, train = _tensors(gpt2_dir / "train.safetensors")
    assert sorted(train) == ["attention_mask", "input_ids"]
    ids = train["input_ids"]
    assert isinstance(ids, torch.Tensor)
    assert ids.shape == (summary["n_train"], SEQ) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < model["config"]["vocab_size"]


def test_sweep_takes_a_model_directory(live: LiveService, gpt2_dir: Path, tmp_path: Path) -> None:
    """``sweep --model RUN_DIR`` (the example's Trainer run folder) sends its last checkpoint's
    config as a Hugging Face model and the workers train that architecture from the given
    start checkpoint: every point's tokens per step are batch × 31 (HF next-token labels),
    not batch × 32 (the reference packing)."""
    env = live.client_env()
    both = run_cli(["sweep", "--model", str(gpt2_dir), "--spec", str(gpt2_dir / "config.json"),
                    "--train", "x", "--eval", "x"], env)  # fmt: skip
    assert both.code == 2 and "--spec" in both.stderr and "--model" in both.stderr
    not_a_model = run_cli(["sweep", "--model", str(gpt2_dir / "nothing"), "--train",
                           str(gpt2_dir / "train.safetensors"), "--eval",
                           str(gpt2_dir / "data.safetensors")], env)  # fmt: skip
    assert not_a_model.code == 2 and "--model" in not_a_model.stderr

    start = json.loads((gpt2_dir / "example.json").read_text())
    target = round(0.5 * (start["eval_loss"] + start["uniform_loss"]), 3)
    run = run_cli(
        ["sweep", "--model", str(gpt2_dir), "--train", str(gpt2_dir / "train.safetensors"),
         "--eval", str(gpt2_dir / "data.safetensors"), "--checkpoint",
         str(gpt2_dir / "checkpoint-10/model.safetensors"), "--type", "batch", "--target-loss",
         str(target),
         "--batch-sizes", "8,16,32", "--max-steps", "300", "--name", "hf-sweep", "--json",
         "--wait", "--timeout", "240"],
        env,
        timeout=300,
    )  # fmt: skip
    assert run.code == 0, run.stderr + live.logs()
    job = json.loads(run.stdout)
    assert job["status"] == "succeeded"
    config = json.loads((gpt2_dir / "config.json").read_text())
    with curvplan.Client(live.url, live.api_key) as api:
        request = api.get_job(job["id"]).request
    assert request is not None and request["model"] == {"source": "huggingface", "config": config}
    sweep = job["result"]["sweep"]
    points = [p["result"] for p in sweep["points"]]
    assert sorted(p["batch_size"] for p in points) == [8, 16, 32]
    for point in points:
        assert point["batch_size_tokens"] == point["batch_size"] * (SEQ - 1)
        assert point["eval_losses"][0] > target  # checkpoint-10 starts above the target …
        assert point["reached_target"] and point["best_eval_loss"] <= target  # … and trains to it
    assert sweep["tokens_per_example"] == SEQ - 1
    assert sweep["batch"]["n_points"] == 3
    # the report by the sweep's name draws the table the sweep measured
    files = run_cli(["report", "hf-sweep", "--out", str(tmp_path / "report")], env)
    assert files.code == 0, files.stderr
    assert "batch-size.svg" in {Path(line).name for line in files.stdout.split()}
    numbers = json.loads((tmp_path / "report" / "numbers.json").read_text())
    assert sorted(numbers["plots"]["batch-size"]["numbers"]["batch_size"]) == [8, 16, 32]
    unknown = run_cli(["report", "no-such-job-name", "--out", str(tmp_path / "x")], env)
    assert unknown.code == 2 and "neither a job id nor the name" in unknown.stderr
