"""No planner input ever ends in internal-error: over extreme finite
values of every number a plan takes, a body the contract accepts gives a plan whose JSON is
finite, or a ``PlanInputError`` naming the field (a 422); never another exception.

``tolerances: [1e-200]`` was accepted and divided by zero (tolerance² underflows to 0).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from curvplan.types.planner import (
    MAX_MAGNITUDE,
    MIN_MAGNITUDE,
    Measurements,
    PlanInputError,
    Targets,
)
from curvplan_core.planner import make_plan

#: Finite values at the edges of the contract's range (MIN_MAGNITUDE … MAX_MAGNITUDE, losses
#: up to MAX_LOSS_VALUE) and beyond it, to the edges of float64.
EDGES = [
    0.0,
    5e-324,
    1e-300,
    MIN_MAGNITUDE,
    1e-50,
    1e-30,
    1e-8,
    0.5,
    1.0,
    3.0,
    1e8,
    1e30,
    1e50,
    MAX_MAGNITUDE,
]
#: Refused where a strictly positive number is due (a tolerance): too small to divide by.
TOO_SMALL = [5e-324, 1e-300, 1e-200]
#: Refused everywhere (losses go up to MAX_LOSS_VALUE, every other number to MAX_MAGNITUDE).
TOO_LARGE = [1e200, 1.7976931348623157e308]


def _number(low: float = 0.0) -> st.SearchStrategy[float]:
    """Numbers the contract accepts, at the edges of its range and between them (what lies
    beyond is refused: test_numbers_beyond_the_range_are_refused_by_the_contract)."""
    return st.one_of(
        st.sampled_from([x for x in EDGES if x >= low]),
        st.floats(min_value=max(low, MIN_MAGNITUDE), max_value=MAX_MAGNITUDE),
        st.floats(min_value=max(low, 1e-30), max_value=1e30),  # where the planner must answer
    )


def _signed() -> st.SearchStrategy[float]:
    return st.one_of(_number(), _number().map(lambda x: -x))


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    losses = draw(st.lists(_number(), min_size=1, max_size=6))
    n = len(losses)
    measurements: dict[str, Any] = {
        "per_sample_losses": draw(_maybe(st.just(losses))),
        "loss_bound": draw(_maybe(_number())),
        "perturbed_losses": draw(
            _maybe(
                st.fixed_dictionaries(
                    {
                        "radius": _number(),
                        "losses": st.lists(
                            st.lists(_number(), min_size=n, max_size=n), min_size=1, max_size=2
                        ),
                    }
                )
            )
        ),
        "hessian_norm_bound": draw(_maybe(_number())),
        "per_sample_hessian_norms": draw(_maybe(st.lists(_number(), min_size=1, max_size=4))),
        "steps_to_target": draw(
            _maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {"batch_size": st.sampled_from([1, 2, 8, 64, 2**40]), "steps": _number()}
                    ),
                    min_size=1,
                    max_size=4,
                    unique_by=lambda p: p["batch_size"],
                )
            )
        ),
        "loss_vs_data": draw(
            _maybe(
                st.lists(
                    st.fixed_dictionaries({"n_samples": _number(), "loss": _number()}),
                    min_size=1,
                    max_size=4,
                )
            )
        ),
        "blocks": draw(
            _maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": st.sampled_from(["a", "b", "c"]),
                            "lambda_max": _signed(),
                            "lambda_min": _signed(),
                            "spectral_norm": _number(),
                            "trace": _maybe(_signed()),
                        }
                    ),
                    min_size=1,
                    max_size=2,
                    unique_by=lambda b: b["name"],
                )
            )
        ),
        "gradient_noise": draw(
            _maybe(
                st.fixed_dictionaries(
                    {
                        "grad_sq_norm": _signed(),
                        "trace_sigma": _signed(),
                        "gHg": _signed(),
                        "trace_h_sigma": _signed(),
                        "grad_sq_norm_se": _maybe(_number()),
                        "trace_sigma_se": _maybe(_number()),
                    }
                )
            )
        ),
        "gradient_norm_at_w_star": draw(_maybe(_number())),
        "per_sample_gradient_rms": draw(_maybe(_number())),
        "tokens_per_example": draw(_maybe(_number(5e-324))),
    }
    targets: dict[str, Any] = {
        "tolerances": draw(_maybe(st.lists(_number(5e-324), min_size=1, max_size=3))),
        "radius": draw(_maybe(_number())),
        "target_loss": draw(_maybe(_number())),
        "confidence": draw(st.sampled_from([1e-300, 0.5, 0.95, 1 - 1e-16])),
        "orderings": 2,
        "bootstrap": draw(st.sampled_from([0, 5])),
        "available_samples": draw(_maybe(st.sampled_from([1, 1000, 2**62]))),
    }
    drop_none = {k: v for k, v in measurements.items() if v is not None}
    return drop_none, {k: v for k, v in targets.items() if v is not None}


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same cases on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(_bodies())
def test_no_accepted_plan_input_ends_in_an_internal_error(
    body: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    raw_measurements, raw_targets = body
    try:  # what the API accepts: the contract, from JSON (its strict mode takes ints there)
        measurements = Measurements.model_validate_json(json.dumps(raw_measurements))
        targets = Targets.model_validate_json(json.dumps(raw_targets))
    except ValidationError:
        event("refused by the contract")
        return  # a 422 naming the field: fine
    event("planned")
    try:
        plan = make_plan(measurements, targets, seed=1)
    except PlanInputError as exc:  # invalid-request naming the input: the workload cap, or
        event("beyond float64")  # an input outside 1e-30 … 1e30 that a fit cannot carry
        assert exc.field.startswith(("measurements.", "targets."))
        return
    json.dumps(plan.model_dump(mode="json"), allow_nan=False)  # finite JSON


@pytest.mark.parametrize("number", TOO_SMALL + TOO_LARGE)
def test_tolerances_beyond_the_range_are_refused_by_the_contract(number: float) -> None:
    """``tolerances: [1e-200]`` was accepted and ended in internal-error (ZeroDivisionError:
    the tolerance squared underflows to 0)."""
    with pytest.raises(ValidationError, match="tolerances"):
        Targets.model_validate_json(json.dumps({"tolerances": [number]}))


@pytest.mark.parametrize("number", TOO_LARGE)
def test_numbers_beyond_the_range_are_refused_by_the_contract(number: float) -> None:
    with pytest.raises(ValidationError, match="lambda_max"):
        Measurements.model_validate_json(json.dumps({"full_model": {"lambda_max": -number}}))
