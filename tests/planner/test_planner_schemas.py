"""Strict input validation: every bad input is a ValidationError whose loc names the field."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from curvplan_core.planner import Measurements, Recommendation, Targets, make_plan

VALID = {
    "per_sample_losses": [0.7, 0.6, 0.9, 1.2],
    "perturbed_losses": {"radius": 0.1, "losses": [[0.8, 0.7, 1.0, 1.3]], "kind": "random"},
    "loss_bound": 5.0,
    "hessian_norm_bound": 12.3,
    "per_sample_hessian_norms": [3.0, 4.0, 5.0, 6.0],
    "gradient_noise": {
        "grad_sq_norm": 0.02,
        "trace_sigma": 3.1,
        "gHg": 0.004,
        "trace_h_sigma": 0.9,
    },
    "steps_to_target": [{"batch_size": 64, "steps": 46000}, {"batch_size": 128, "steps": 24000}],
    "loss_vs_data": [{"n_samples": 1000000, "loss": 3.2}],
    "blocks": [{"name": "l0.v", "lambda_max": 3.0, "lambda_min": -0.1, "spectral_norm": 3.0}],
    "gradient_norm_at_w_star": 0.01,
}


def _locs(body: dict, model=Measurements) -> list[tuple]:
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    return [e["loc"] for e in err.value.errors()]


def test_design_example_validates_from_json() -> None:
    m = Measurements.model_validate_json(json.dumps(VALID))
    assert m.gradient_noise.trace_sigma == 3.1
    t = Targets.model_validate_json(
        '{"tolerances": [0.01, 0.001], "radius": 0.1, "target_loss": 3.0, "confidence": 0.95}'
    )
    assert t.orderings == 100 and t.bootstrap == 1000
    assert Targets.model_validate({"fit_window": [10, 100]}).fit_window == [10, 100]
    assert Targets.model_validate_json('{"fit_window": [10, 100]}').fit_window == [10, 100]


@pytest.mark.parametrize(
    ("path", "value", "loc_tail"),
    [
        (("per_sample_losses",), [], ("per_sample_losses",)),
        (("per_sample_losses",), [0.1, -1.0], ("per_sample_losses", 1)),
        (("per_sample_losses",), [0.1, math.nan], ("per_sample_losses", 1)),
        (("per_sample_losses",), [math.inf], ("per_sample_losses", 0)),
        (("loss_bound",), 0.5, ("loss_bound",)),  # below the largest observed loss
        (("perturbed_losses", "losses"), [[1.0, 2.0]], ("perturbed_losses",)),
        (("perturbed_losses", "kind"), "gaussian", ("perturbed_losses", "kind")),
        (
            ("steps_to_target",),
            [{"batch_size": -4, "steps": 10}],
            ("steps_to_target", 0, "batch_size"),
        ),
        (("steps_to_target",), [{"batch_size": 4, "steps": 0}], ("steps_to_target", 0, "steps")),
        (("steps_to_target",), [], ("steps_to_target",)),
        (("loss_vs_data",), [{"n_samples": -1, "loss": 1.0}], ("loss_vs_data", 0, "n_samples")),
        (
            ("blocks",),
            [{"name": "q", "lambda_max": 1.0, "lambda_min": 2.0, "spectral_norm": 2.0}],
            ("blocks", 0, "lambda_min"),
        ),
        (("per_sample_hessian_norms",), [20.0], ("per_sample_hessian_norms",)),
        (("gradient_noise",), {"grad_sq_norm": 0.1}, ("gradient_noise", "direct")),
        (
            ("gradient_noise",),
            {"b_small": 4, "b_big": 8, "grad_sq_norm_small": [1.0], "grad_sq_norm_big": [1.0, 2.0]},
            ("gradient_noise", "two_batch", "grad_sq_norm_big"),
        ),
        (("unknown_field",), 1, ("unknown_field",)),
    ],
)
def test_bad_measurements_name_the_field(path: tuple, value: object, loc_tail: tuple) -> None:
    body = copy.deepcopy(VALID)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert loc_tail in _locs(body)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"tolerances": [0.1, 0.0]}, ("tolerances", 1)),
        ({"tolerances": [-0.1]}, ("tolerances", 0)),
        ({"tolerances": []}, ("tolerances",)),
        ({"confidence": 1.0}, ("confidence",)),
        ({"orderings": -3}, ("orderings",)),
        ({"bootstrap": -1}, ("bootstrap",)),
        ({"fit_window": [100, 10]}, ("fit_window",)),
        ({"fit_window": [10, 20, 30]}, ("fit_window",)),
        ({"radius": math.nan}, ("radius",)),
        ({"orderings": "100"}, ("orderings",)),
    ],
)
def test_bad_targets_name_the_field(body: dict, loc: tuple) -> None:
    assert loc in _locs(body, Targets)


_bad_float = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-9])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30),
    _bad_float,
    st.data(),
)
def test_property_any_bad_loss_is_rejected_at_its_index(
    losses: list[float], bad: float, data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(losses) - 1))
    losses = list(losses)
    losses[index] = bad
    assert ("per_sample_losses", index) in _locs({"per_sample_losses": losses})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-10, 0.0, allow_nan=False) | _bad_float, min_size=1, max_size=5))
def test_property_non_positive_tolerances_are_rejected(tols: list[float]) -> None:
    locs = _locs({"tolerances": tols}, Targets)
    assert all(loc[0] == "tolerances" for loc in locs)


@settings(max_examples=25, deadline=None)
@given(
    losses=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=60),
    tolerances=st.lists(st.floats(1e-6, 10), min_size=1, max_size=4),
    radius=st.none() | st.floats(0, 5),
    seed=st.integers(0, 2**31),
)
def test_property_valid_input_always_gives_a_serialisable_plan(
    losses: list[float], tolerances: list[float], radius: float | None, seed: int
) -> None:
    m = Measurements(per_sample_losses=losses, hessian_norm_bound=2.0)
    t = Targets(tolerances=tolerances, radius=radius, orderings=4, bootstrap=20, seed=seed)
    rec = make_plan(m, t)
    text = rec.model_dump_json()
    assert "NaN" not in text and "Infinity" not in text
    assert Recommendation.model_validate_json(text) == rec
