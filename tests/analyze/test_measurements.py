"""Engine result → stored result + job artifacts + planner measurements (no processes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from curvplan.types.results import EngineMeasurements, GradientNoiseEstimate
from curvplan_core.planner import Measurements
from curvplan_worker.analyze.measurements import planner_fields, split_bulky
from curvplan_worker.analyze.pipeline import job_stage

HEADER = {
    "device": "cpu",
    "dtype": "float64",
    "seed": 0,
    "seed_derivation": {"scheme": "sha256"},
    "options": {},
    "machine": {},
    "model": {"source": "reference"},
    "precision_limited": {"limited": False},
    "n_parameters": 100,
    "n_examples": 40,
}


def _noise(stats: list[dict[str, Any]]) -> list[GradientNoiseEstimate]:
    return [GradientNoiseEstimate.model_validate(s) for s in stats]


def _typed(result: dict[str, Any]) -> EngineMeasurements:
    """The engine's measurements of a result JSON (the header a run always writes added)."""
    return EngineMeasurements.model_validate({**HEADER, **result})


def _result() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    losses = rng.uniform(0.1, 2.0, size=40).tolist()
    return {
        "loss": float(np.mean(losses)),
        "gradient_norm": 0.01,
        "blocks": [
            {
                "name": "layers.0.q",
                "params": ["layers.0.attn.q.weight"],
                "lambda_max": 2.0,
                "lambda_min": -0.5,
                "spectral_norm": 2.0,
                "trace": {"value": 3.0, "stderr": 0.1},
            }
        ],
        "per_sample": {
            "losses": losses,
            "perturbed": [
                {"radius": 0.1, "kind": "random", "losses": rng.uniform(0, 3, (4, 40)).tolist()}
            ],
            "hessian_norms": {"norms": [1.5, 2.5], "indices": [3, 7], "all_converged": True},
        },
        "dense": {"matrix": rng.standard_normal((9, 9)).tolist(), "trace": 1.0},
        "top_eigenspace": {
            "values": [1.0, 0.5],
            "residuals": [1e-6, 1e-5],
            "converged": True,
            "n_products": 9,
        },
    }


def _resolve(slim: Any, groups: dict[str, dict[str, np.ndarray]]) -> Any:
    """Put the arrays back where their references are."""
    if isinstance(slim, dict):
        if set(slim) == {"artifact", "tensor", "shape"}:
            array = groups[slim["artifact"]][slim["tensor"]]
            assert list(array.shape) == slim["shape"]
            return array.tolist()
        return {k: _resolve(v, groups) for k, v in slim.items()}
    if isinstance(slim, list):
        return [_resolve(v, groups) for v in slim]
    return slim


def test_split_bulky_moves_arrays_out_and_loses_nothing() -> None:
    result = _result()
    slim, groups = split_bulky(_typed(result))
    assert set(groups) == {"per_sample_losses", "perturbed_losses", "dense"}
    assert groups["per_sample_losses"]["per_sample.losses"].shape == (40,)
    assert groups["perturbed_losses"]["per_sample.perturbed.0.losses"].shape == (4, 40)
    assert groups["dense"]["dense.matrix"].shape == (9, 9)
    assert slim["top_eigenspace"] == result["top_eigenspace"]  # not declared bulky: inline
    assert slim["per_sample"]["hessian_norms"] == result["per_sample"]["hessian_norms"]
    assert _resolve(slim, groups) == {**HEADER, **result}


def test_planner_fields_validate_and_take_noise_from_the_last_intermediate() -> None:
    result = _result()
    noise = [
        {"grad_sq_norm": 9.0, "trace_sigma": 90.0, "gHg": 1.0, "trace_h_sigma": 5.0},
        {"grad_sq_norm": 4.0, "trace_sigma": 80.0, "gHg": 2.0, "trace_h_sigma": 6.0},
    ]
    fields, notes = planner_fields(_typed(result), _noise(noise))
    measurements = Measurements.model_validate_json(Measurements(**fields).model_dump_json())
    assert measurements.per_sample_losses == pytest.approx(result["per_sample"]["losses"])
    # M is left to the planner as the max measured per-sample norm (labelled a lower estimate)
    assert measurements.hessian_norm_bound is None
    assert max(measurements.per_sample_hessian_norms or []) == 2.5
    assert measurements.gradient_noise is not None
    assert measurements.gradient_noise.grad_sq_norm == 4.0
    assert measurements.blocks is not None and measurements.blocks[0].trace == 3.0
    assert measurements.gradient_norm_at_w_star == 0.01
    assert notes == []
    assert measurements.theory is None  # no bounds in this result
    with_bounds = {**result, "bounds": {"applicable": False, "reasons": ["n_heads=4 > 1"]}}
    theory = Measurements(**planner_fields(_typed(with_bounds), _noise(noise))[0]).theory
    assert theory is not None and not theory.applicable and theory.reasons == ["n_heads=4 > 1"]
    without, notes = planner_fields(_typed(result), [])
    assert "gradient_noise" not in without
    assert any("undefined" in n for n in notes)
    # every intermediate checkpoint, oldest first, is the trend; names travel with it
    named = [{**n, "checkpoint": f"ckpt-{i}"} for i, n in enumerate(noise)]
    trend = Measurements(**planner_fields(_typed(result), _noise(named))[0]).gradient_noise_trend
    assert [p.checkpoint for p in trend] == ["ckpt-0", "ckpt-1"]
    assert [p.grad_sq_norm for p in trend] == [9.0, 4.0]


def test_planner_fields_carry_the_rms_per_example_gradient_and_tokens_per_example() -> None:
    result = {
        **_result(),
        "gradient_noise": {
            "grad_sq_norm": -0.1,
            "trace_sigma": 3.0,
            "rms_deviation": 1.7,
            "mean_count": 31.5,
            "gradient_norm": 0.01,
        },
    }
    fields, _ = planner_fields(_typed(result), [])
    measurements = Measurements(**fields)
    assert measurements.per_sample_gradient_rms == 1.7
    assert measurements.tokens_per_example == 31.5


@pytest.mark.parametrize(
    ("stage", "message", "expected"),
    [
        ("blocks", "block layers.0.q (3/10)", "block spectra 3/10"),
        ("load", "building the model", "loading"),
        ("off_diagonal", "H[a, b]", "off-diagonal"),
        ("per_sample", "…", "per-sample losses"),
        ("gradient_noise", "…", "gradient noise"),
        ("bounds", "…", "bounds"),
    ],
)
def test_engine_stages_get_the_job_stage_names(stage: str, message: str, expected: str) -> None:
    from curvplan_worker.curvature.analyze import ProgressEvent

    index = total = None
    if stage == "blocks":  # structured: the block counter is a field, never parsed from text
        index, total = 3, 10
    event = ProgressEvent(0.5, stage, message, index=index, total=total)
    assert job_stage(event) == expected


def test_groups_and_the_full_model_lambda_reach_the_planner_and_the_replan_references() -> None:
    from curvplan_worker.analyze.pipeline import _inline_planner_inputs

    result = _result()
    groups = [i // 4 for i in range(40)]
    result["per_sample"]["groups"] = groups
    result["full_model"] = {
        "available": True,
        "lambda_max": 3.5,
        "residual": 1e-9,
        "converged": True,
        "n_products": 21,
    }
    _, arrays = split_bulky(_typed(result))
    stored = arrays["per_sample_losses"]["per_sample.groups"]
    assert stored.dtype == np.int64 and stored.tolist() == groups
    fields, _ = planner_fields(_typed(result), [])
    m = Measurements(**fields)
    assert m.per_sample_groups == groups
    assert m.full_model is not None and m.full_model.lambda_max == 3.5
    inputs = _inline_planner_inputs(
        fields, {"per_sample_losses": "a1", "perturbed_losses": "a2"}, _typed(result)
    )
    assert "per_sample_groups" not in inputs.fields
    assert inputs.arrays["per_sample_groups"].model_dump(exclude_unset=True) == {
        "artifact_id": "a1",
        "tensor": "per_sample.groups",
    }
    skipped = {**result, "full_model": {"available": False, "reason": "basis too big"}}
    fields, notes = planner_fields(_typed(skipped), [])
    assert "full_model" not in fields and any("basis too big" in n for n in notes)


def test_bulky_arrays_are_the_declared_fields_not_any_long_list() -> None:
    """A field declared bulky moves (sample-sized ones past 64 entries); an undeclared
    numeric list stays inline whatever its length."""
    long = [float(i) for i in range(100)]
    result = {
        **_result(),
        "gradient_noise": {"grad_indices": list(range(100)), "hessian_indices": [1, 2]},
        "bounds": {"applicable": True, "reasons": [], "per_layer": long},
    }
    slim, groups = split_bulky(_typed(result))
    assert groups["arrays"]["gradient_noise.grad_indices"].tolist() == list(range(100))
    assert slim["gradient_noise"]["hessian_indices"] == [1, 2]  # sample-sized, short: inline
    assert slim["bounds"]["per_layer"] == long  # not declared: inline
    assert "bounds.per_layer" not in groups["arrays"]


def test_the_stored_form_reads_back_as_the_same_models_with_array_references() -> None:
    """split_bulky's slim result (what the job stores) validates as the engine's own model:
    every bulky field, dense matrices included, holds an ArrayRef of the array's shape."""
    from curvplan.types.results import ArrayRef

    result = {
        **_result(),
        "dense": {
            "n_parameters": 3,
            "lambda_max": 2.0,
            "block_names": ["a", "b"],
            "block_norm_matrix": [[2.0, 0.5], [0.5, 1.0]],
            "blocks": [{"name": "a", "lambda_max": 2.0}, {"name": "b", "lambda_max": 1.0}],
        },
    }
    slim, groups = split_bulky(_typed(result))
    stored = EngineMeasurements.model_validate(slim)
    dense = stored.dense
    assert dense is not None and isinstance(dense.block_norm_matrix, ArrayRef)
    assert dense.block_norm_matrix.shape == [2, 2]
    assert groups["dense"]["dense.block_norm_matrix"].tolist() == [[2.0, 0.5], [0.5, 1.0]]
    assert dense.blocks is not None and [b.name for b in dense.blocks] == ["a", "b"]
    per_sample = stored.per_sample
    assert per_sample is not None and isinstance(per_sample.losses, ArrayRef)
    assert per_sample.losses.shape == [40]
    assert isinstance(per_sample.perturbed[0].losses, ArrayRef)
    assert per_sample.perturbed[0].losses.shape == [4, 40]
    # short sample-sized lists stay inline, as the engine wrote them
    assert per_sample.hessian_norms is not None and per_sample.hessian_norms.norms == [1.5, 2.5]
