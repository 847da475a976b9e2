"""λ_max of the whole-model Hessian (one Lanczos over all parameters) against the dense Hessian
of a tiny model, computed independently (one plain forward, double backward: _engine_cases);
the analysis carries it, and a dataset's ``groups`` reach the per-sample section."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _engine_cases import TINY_CLASSIFIER_SPEC

from curvplan.types.options import MachineSettings
from curvplan.types.spec import ModelSpec
from curvplan_worker.curvature.analyze import analyze
from curvplan_worker.curvature.data import DataError, Dataset, load_dataset, save_dataset
from curvplan_worker.curvature.full_model import full_model_lambda_max
from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.model import build_model

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("name", ["lm_post_gelu_tied", "cls_pre_relu_rms"])
def test_full_model_lambda_max_matches_the_dense_hessian(name):
    from _engine_cases import build_case

    case = build_case(name)
    exact = np.linalg.eigvalsh(0.5 * (case.hessian + case.hessian.T).numpy())
    with CurvatureEngine(case.model, case.objective, case.batches) as engine:
        record = full_model_lambda_max(
            engine, generator=torch.Generator().manual_seed(0), tol=1e-8, max_iter=None, floor=1e-3
        )
        block_max = max(
            float(np.linalg.eigvalsh(case.sub(m, m).numpy())[-1]) for m in case.blocks.values()
        )
    assert record["available"] and record["converged"]
    assert record["lambda_max"] == pytest.approx(exact[-1], rel=1e-7)
    assert record["n_params"] == case.hessian.shape[0] and record["n_products"] > 0
    assert block_max <= exact[-1] * (1 + 1e-9)  # interlacing: a block bounds it from below


def test_full_model_run_is_skipped_when_its_basis_would_not_fit():
    from _engine_cases import build_case

    case = build_case("cls_pre_relu_rms")
    with CurvatureEngine(case.model, case.objective, case.batches) as engine:
        record = full_model_lambda_max(
            engine,
            generator=torch.Generator().manual_seed(0),
            tol=1e-8,
            max_iter=None,
            floor=1e-3,
            basis_bytes=1000,
        )
    assert record["available"] is False and "GiB" in record["reason"]


def test_analysis_reports_the_full_model_lambda_max_and_the_groups():
    model = build_model(TINY_CLASSIFIER_SPEC, seed=0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    data = Dataset(
        torch.randn(10, 3, 2, generator=gen, dtype=torch.float64),
        torch.randint(0, 3, (10,), generator=gen),
        torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4]),
    )
    out = analyze(
        TINY_CLASSIFIER_SPEC,
        None,
        None,
        {"precision": "float64", "gradient_noise": False, "bounds": False, "hessian_subsample": 0},
        machine=MachineSettings(threads=1),
        model=model,
        data=data,
    )
    full = out["full_model"]
    assert full["available"] and full["converged"]
    assert max(b["lambda_max"] for b in out["blocks"]) <= full["lambda_max"] * (1 + 1e-9)
    # the same run's exact dense Hessian (small models get it automatically)
    assert full["lambda_max"] == pytest.approx(out["dense"]["lambda_max"], rel=1e-6)
    assert out["per_sample"]["groups"] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_dataset_groups_round_trip_and_are_checked(tmp_path):
    spec = ModelSpec.model_validate(TINY_CLASSIFIER_SPEC)
    x = torch.randn(4, 3, 2, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0])
    path = tmp_path / "d.safetensors"
    save_dataset(Dataset(x, y, torch.tensor([7, 7, 9, 9])), path)
    loaded = load_dataset(spec, path)
    assert loaded.groups is not None and loaded.groups.tolist() == [7, 7, 9, 9]
    assert loaded.subset(slice(1, 3)).groups.tolist() == [7, 9]
    save_dataset(Dataset(x, y, torch.tensor([0.5, 1.0, 1.0, 2.0])), path)
    with pytest.raises(DataError, match=r"'groups'.*int64"):
        load_dataset(spec, path)
    save_dataset(Dataset(x, y, torch.tensor([1, 2, 3])), path)
    with pytest.raises(DataError, match=r"'groups'.*shape"):
        load_dataset(spec, path)
