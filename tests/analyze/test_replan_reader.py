"""A re-plan's typed reader (no processes, no database): what the analyze job stores of the
planner's inputs (inline fields as JSONB, bulky arrays in safetensors artifacts) reads back
to the very ``Measurements`` the analysis planned with."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from curvplan.types.planner import Measurements, Targets
from curvplan.types.results import EngineMeasurements, GradientNoiseEstimate
from curvplan_core.planner import make_plan
from curvplan_server.analyze.replan import (
    StoredPlannerInputs,
    planner_measurements,
    read_arrays,
)
from curvplan_server.problems import Problem
from curvplan_worker.analyze.measurements import planner_fields, split_bulky
from curvplan_worker.analyze.pipeline import _inline_planner_inputs

N = 30


def _engine_result(*, groups: bool) -> EngineMeasurements:
    """An engine result with every input the planner takes from an analysis (per-sample and
    perturbed losses of both kinds, Hessian norms, blocks, whole-model λ_max, gradient
    noise), float64 values that a decimal JSON round trip must not alter."""
    rng = np.random.default_rng(7)
    losses = rng.uniform(0.1, 2.0, size=N).tolist()
    per_sample: dict[str, Any] = {
        "losses": losses,
        "perturbed": [
            {
                "radius": 0.05,
                "kind": "top_eigenspace",
                "losses": rng.uniform(0, 3, (2, N)).tolist(),
            },
            {"radius": 0.05, "kind": "random", "losses": rng.uniform(0, 3, (3, N)).tolist()},
        ],
        "hessian_norms": {"norms": [1.5, 2.5], "indices": [3, 7], "all_converged": True},
    }
    if groups:
        per_sample["groups"] = [i // 3 for i in range(N)]
    return EngineMeasurements.model_validate(
        {
            "device": "cpu",
            "dtype": "float64",
            "seed": 0,
            "seed_derivation": {"scheme": "sha256"},
            "options": {},
            "machine": {},
            "model": {"source": "reference"},
            "precision_limited": {"limited": False},
            "n_parameters": 100,
            "n_examples": N,
            "loss": float(np.mean(losses)),
            "gradient_norm": 0.01,
            "blocks": [
                {
                    "name": "layers.0.q",
                    "params": ["layers.0.attn.q.weight"],
                    "lambda_max": 2.0 / 3.0,
                    "lambda_min": -0.1,
                    "spectral_norm": 2.0 / 3.0,
                    "trace": {"value": 3.0, "stderr": 0.1},
                }
            ],
            "full_model": {
                "available": True,
                "lambda_max": 3.5,
                "residual": 1e-9,
                "converged": True,
                "n_products": 21,
            },
            "per_sample": per_sample,
            "gradient_noise": {
                "grad_sq_norm": 0.1 / 3,
                "trace_sigma": 3.0,
                "gHg": 1.0 / 7,
                "trace_h_sigma": 5.0,
                "n_samples": 12,
                "rms_deviation": 1.7,
                "mean_count": 6.0,
                "gradient_norm": 0.01,
            },
        }
    )


def _stored(result: EngineMeasurements) -> tuple[Measurements, StoredPlannerInputs, Any]:
    """(the Measurements the analysis plans with, its stored planner inputs read back from
    JSON, a loader of its artifacts by id) — each as the analyze job writes them."""
    noise = [GradientNoiseEstimate.model_validate({"grad_sq_norm": 4.0, "trace_sigma": 80.0})]
    fields, _ = planner_fields(result, noise)
    planned = Measurements.model_validate(fields)  # the analyze job's own validation
    _, groups = split_bulky(result)
    ids = {name: uuid.uuid4() for name in groups}
    files = {ids[name]: save_safetensors(tensors) for name, tensors in groups.items()}
    inline = _inline_planner_inputs(dict(fields), {k: str(v) for k, v in ids.items()}, result)
    stored = StoredPlannerInputs.model_validate(json.loads(inline.model_dump_json()))  # JSONB

    def load(artifact_id: uuid.UUID) -> dict[str, np.ndarray]:
        return dict(load_safetensors(files[artifact_id]))

    return planned, stored, load


@pytest.mark.parametrize("groups", [False, True])
def test_stored_planner_inputs_read_back_to_the_measurements_the_analysis_planned_with(
    groups: bool,
) -> None:
    planned, stored, load = _stored(_engine_result(groups=groups))
    assert stored.arrays.per_sample_losses is not None  # the bulky fields were moved out
    assert stored.arrays.perturbed_losses is not None
    assert (stored.arrays.per_sample_groups is not None) == groups
    assert "per_sample_losses" not in stored.fields
    replanned = planner_measurements(stored, load)
    assert replanned == planned  # every value, bit for bit
    assert replanned.perturbed_losses is not None and replanned.perturbed_losses.kind == "random"
    # hence the same plan for the same targets and seed
    targets = Targets(tolerances=[0.1], radius=0.05, orderings=4, bootstrap=10)
    assert make_plan(replanned, targets, seed=5) == make_plan(planned, targets, seed=5)


def test_the_stored_fields_are_validated_strictly_as_a_plan_job_s() -> None:
    planned, stored, load = _stored(_engine_result(groups=True))
    assert planned.model_parameters is None
    # a float where the planner takes an integer is refused, not truncated
    loose = stored.model_copy(update={"fields": {**stored.fields, "model_parameters": 3.0}})
    with pytest.raises(Problem) as caught:
        planner_measurements(loose, load)
    assert caught.value.status == 409
    assert "no longer fit the planner" in str(caught.value.detail)
    assert "model_parameters" in str(caught.value.detail)
    # the cross-field checks run on the arrays read back (groups: one per loss)
    short = {**stored.fields, "loss_bound": 1e-3}
    with pytest.raises(Problem) as caught:
        planner_measurements(stored.model_copy(update={"fields": short}), load)
    assert caught.value.status == 409 and "loss_bound" in str(caught.value.detail)


def test_a_reference_to_a_missing_tensor_is_a_conflict_and_arrays_are_read_once() -> None:
    _, stored, load = _stored(_engine_result(groups=True))
    calls: list[uuid.UUID] = []

    def counting(artifact_id: uuid.UUID) -> dict[str, np.ndarray]:
        calls.append(artifact_id)
        return load(artifact_id)

    arrays = read_arrays(stored.arrays, counting)
    # losses and groups share one artifact: it is read once
    assert len(calls) == len(set(calls)) == 2
    assert len(arrays["per_sample_groups"]) == len(arrays["per_sample_losses"]) == N
    ref = stored.arrays.per_sample_losses
    assert ref is not None
    renamed = stored.arrays.model_copy(
        update={"per_sample_losses": ref.model_copy(update={"tensor": "per_sample.nope"})}
    )
    with pytest.raises(Problem) as caught:
        read_arrays(renamed, load)
    assert caught.value.status == 409 and "per_sample.nope" in str(caught.value.detail)


def test_unknown_stored_arrays_are_refused_rather_than_dropped() -> None:
    _, stored, _ = _stored(_engine_result(groups=False))
    raw = json.loads(stored.model_dump_json())
    raw["arrays"]["per_sample_weights"] = {"artifact_id": str(uuid.uuid4()), "tensor": "w"}
    with pytest.raises(ValueError, match="per_sample_weights"):
        StoredPlannerInputs.model_validate(raw)
