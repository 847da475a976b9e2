"""analyze() and the CLI end to end on tiny models; the iterative numbers are checked against
the exact dense Hessian that the same run computes (small models get it automatically)."""

from __future__ import annotations

import json

import pytest
import torch
from _engine_cases import TINY_CLASSIFIER_SPEC
from typer.testing import CliRunner

from curvplan.types.options import MachineSettings
from curvplan_worker.curvature.analyze import Cancelled, OptionsError, analyze, parse_options
from curvplan_worker.curvature.checkpoint import save_checkpoint
from curvplan_worker.curvature.data import Dataset, save_dataset
from curvplan_worker.curvature.model import build_model

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = TINY_CLASSIFIER_SPEC


def _trained_like_model(seed: int = 0):
    model = build_model(SPEC, seed=seed, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.4 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def _data(n: int = 10, seed: int = 1) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    return Dataset(
        torch.randn(n, 3, 2, generator=gen, dtype=torch.float64),
        torch.randint(0, 3, (n,), generator=gen),
    )


@pytest.fixture(scope="module")
def result() -> dict:
    stages: list[tuple[float, str]] = []
    out = analyze(
        SPEC,
        None,
        None,
        {
            # strict against the dense oracle: 1e-6 in float64, and every block (≤ 30
            # parameters) traced exactly
            "precision": "float64",
            "tolerance": 1e-6,
            "trace_probes": 30,
            "off_diagonal": [["layers.0.q", "layers.0.k"], ["layers.0.v", "head"]],
            "ggn": True,
            "eval_batch_size": 4,
            "hessian_subsample": 3,
            "n_directions": 2,
        },
        progress=lambda e: stages.append((e.fraction, e.stage)),
        machine=MachineSettings(threads=1),
        model=_trained_like_model(),
        data=_data(),
    )
    out["_stages"] = stages
    return out


def test_result_has_the_contract_fields_and_is_strict_json(result):
    stages = result.pop("_stages")
    json.dumps(result, allow_nan=False)
    for key in ("versions", "device", "dtype", "seed", "spec", "n_parameters", "n_examples"):
        assert key in result
    assert result["versions"]["torch"] == torch.__version__
    for block in result["blocks"]:
        for key in ("name", "lambda_max", "lambda_min", "spectral_norm", "converged"):
            assert key in block
        assert block["n_products"] > 0 and "stderr" in block["trace"]
        assert "applicable" in block["bound"]
    fractions = [f for f, _ in stages]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert {"blocks", "dense", "per_sample", "gradient_noise", "bounds"} <= {s for _, s in stages}


def test_block_spectra_and_traces_match_the_dense_hessian_of_the_same_run(result):
    dense = {b["name"]: b for b in result["dense"]["blocks"]}
    for block in result["blocks"]:
        exact = dense[block["name"]]
        norm = exact["spectral_norm"]
        assert block["converged"], block["name"]
        for key in ("lambda_max", "lambda_min"):
            assert abs(block[key] - exact[key]) <= 1e-6 * max(abs(exact[key]), 1e-3 * norm)
        assert block["trace"]["value"] == pytest.approx(exact["trace"], rel=1e-9, abs=1e-12)
        # triangle inequality: ‖H‖ ≤ ‖GGN‖ + ‖functional‖
        parts = block["ggn"]["spectral_norm"] + block["functional"]["spectral_norm"]
        assert block["spectral_norm"] <= parts * (1 + 1e-8)
        assert block["ggn"]["lambda_min"] >= -1e-10 * block["ggn"]["spectral_norm"]  # PSD


def test_off_diagonal_sigma_matches_the_dense_block_norms(result):
    names = result["dense"]["block_names"]
    matrix = result["dense"]["block_norm_matrix"]
    for rec in result["off_diagonal"]:
        want = matrix[names.index(rec["row"])][names.index(rec["col"])]
        assert rec["converged"]
        assert rec["sigma_max"] == pytest.approx(want, rel=1e-6)


def test_loss_and_gradient_norm(result):
    model, data = _trained_like_model(), _data()
    logits = model(data.inputs)
    loss = torch.nn.functional.cross_entropy(logits, data.targets)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert result["loss"] == pytest.approx(float(loss.detach()), rel=1e-12)
    norm = float(torch.sqrt(sum((g * g).sum() for g in grads)))
    assert result["gradient_norm"] == pytest.approx(norm, rel=1e-10)
    assert result["n_eval_batches"] == 3  # 10 examples in batches of 4: 4, 4, 2


def test_cancel_during_block_spectra_restores_the_model_mode():
    model = _trained_like_model()
    model.train()
    stages: list[str] = []

    def should_cancel() -> bool:
        # the first check once the block spectra have started: inside the Lanczos loop or the
        # (batched) product it is waiting on, not at a stage boundary
        return bool(stages) and stages[-1] == "blocks"

    with pytest.raises(Cancelled, match=r"lanczos|Hessian product"):
        analyze(
            SPEC,
            None,
            None,
            {"precision": "float64"},
            lambda event: stages.append(event.stage),
            should_cancel,
            model=model,
            data=_data(),
        )
    assert stages[-1] == "blocks"
    assert all(m.training for m in model.modules())


def test_options_errors_name_the_field():
    with pytest.raises(OptionsError) as err:
        parse_options({"tolerance": 2.0, "precision": "float16", "bogus": 1})
    fields = {f for f, _ in err.value.errors}
    assert {"tolerance", "precision", "bogus"} <= fields


def test_the_machine_device_is_the_callers_setting_and_errors_name_it():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: device 'cuda' is valid here")
    with pytest.raises(ValueError, match=r"device.*CUDA"):
        analyze(
            SPEC,
            None,
            None,
            {},
            model=_trained_like_model(),
            data=_data(),
            machine=MachineSettings(device="cuda", self_test=False),
        )
    with pytest.raises(OptionsError, match="worker setting"):
        parse_options({"device": "cpu"})


def test_cli_curvature_writes_the_result_and_reports_mismatches(tmp_path):
    from curvplan.cli import app

    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    save_checkpoint(_trained_like_model(), tmp_path / "ckpt.safetensors")
    data = _data()
    save_dataset(Dataset(data.inputs.float(), data.targets), tmp_path / "data.safetensors")
    runner = CliRunner()
    args = [
        "curvature",
        "--spec",
        str(tmp_path / "spec.json"),
        "--checkpoint",
        str(tmp_path / "ckpt.safetensors"),
        "--data",
        str(tmp_path / "data.safetensors"),
        "--out",
        str(tmp_path / "r.json"),
        "--precision",
        "float64",
        "--no-per-sample",
        "--no-gradient-noise",
        "--quiet",
        "--block",
        "layers.0.*",
        "--threads",
        "1",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["blocks"][0]["name"] == "layers.0.ln1"
    assert all(b["name"].startswith("layers.0.") for b in out["blocks"])
    assert out["dtype"] == "float64" and "bounds" in out

    other = {**SPEC, "d_ff": 8}
    (tmp_path / "spec.json").write_text(json.dumps(other))
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "layers.0.ffn_in.weight" in res.output and "shape" in res.output


def test_cli_example_writes_a_learnable_checkpoint(tmp_path):
    from curvplan.cli import app

    res = CliRunner().invoke(app, ["example", "--out", str(tmp_path), "--steps", "40"])
    assert res.exit_code == 0, res.output
    for name in ("spec.json", "checkpoint.safetensors", "data.safetensors"):
        assert (tmp_path / name).is_file()
    summary = json.loads((tmp_path / "example.json").read_text())
    assert summary["eval_loss"] < summary["uniform_loss"] - 0.3  # it learned the chain
    # each intermediate checkpoint has its Adam moments beside it, for a branch sweep
    from curvplan_worker.curvature.checkpoint import load_checkpoint
    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.sweep.moments import read_moments

    spec = json.loads((tmp_path / "spec.json").read_text())
    model = load_checkpoint(build_model(spec), tmp_path / "step_25.safetensors")
    assert read_moments(tmp_path / "step_25.optimizer.safetensors", model).step == 25


def test_blas_threads_are_pinned_around_the_small_eigenproblems_and_restored() -> None:
    """numpy's BLAS runs the Lanczos projection's eigh on one thread (it must not oversubscribe
    torch's cores, docs/numerics.md#threads), and gets its own count back afterwards, on every
    call, not only the first (the controller is made once a process)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from curvplan_worker.curvature.device import pinned_blas_threads

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    assert blas_threads(), "numpy has a BLAS threadpoolctl can see"
    with threadpool_limits(limits=2, user_api="blas"):
        outer = blas_threads()
        for _ in range(3):
            with pinned_blas_threads(1):
                assert set(blas_threads()) == {1}
            assert blas_threads() == outer
