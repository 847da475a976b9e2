"""A checkpoint weight holding NaN or ±Inf is refused when it is loaded, and the job's error
names the tensor (it failed later, naming nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from curvplan_worker.curvature.checkpoint import (
    CheckpointMismatch,
    load_checkpoint,
    save_checkpoint,
)
from curvplan_worker.curvature.model import build_model

SPEC = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 2,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_weight_is_named_when_loaded(tmp_path: Path, bad: float) -> None:
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(build_model(SPEC, seed=0), path)
    state = load_file(str(path))
    name = "layers.1.ffn_in.weight"
    state[name][2, 3] = bad
    save_file(state, str(path))
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(build_model(SPEC, seed=1), path)
    (issue,) = caught.value.issues
    assert (issue.name, issue.problem) == (name, "non-finite")
    assert issue.found == f"1 NaN or infinite of {state[name].numel()}"
    assert name in str(caught.value)


def test_the_job_error_names_the_tensor(tmp_path: Path) -> None:
    from curvplan_worker.analyze.pipeline import engine_errors
    from curvplan_worker.errors import JobError

    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(build_model(SPEC, seed=0), path)
    state = load_file(str(path))
    state["embed.weight"][0, 0] = float("nan")
    save_file(state, str(path))
    with pytest.raises(JobError) as caught, engine_errors():
        load_checkpoint(build_model(SPEC), path)
    assert "embed.weight non-finite" in str(caught.value)
