"""make_plan end to end: docs/openapi.json field names, determinism, robustness on valid input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from curvplan.types.planner import NotComputed
from curvplan_core.planner import Measurements, Recommendation, Targets, make_plan

RNG = np.random.default_rng(7)
BATCHES = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
FULL = {
    "per_sample_losses": RNG.exponential(size=3000).tolist(),
    "loss_bound": 20.0,
    "hessian_norm_bound": 12.3,
    "gradient_noise": {
        "grad_sq_norm": 0.02,
        "trace_sigma": 3.1,
        "gHg": 0.004,
        "trace_h_sigma": 0.9,
        "grad_sq_norm_se": 0.002,
        "trace_sigma_se": 0.1,
    },
    "steps_to_target": [{"batch_size": b, "steps": 1270 * (1 + 2200 / b)} for b in BATCHES],
    "loss_vs_data": [
        {"n_samples": d, "loss": 1.7 + 400 * d**-0.3} for d in (1e5, 3e5, 1e6, 3e6, 1e7)
    ],
    "blocks": [
        {"name": "l0.q", "lambda_max": 3.0, "lambda_min": -0.5, "spectral_norm": 3.0},
        {"name": "l0.v", "lambda_max": 30.0, "lambda_min": 0.0, "spectral_norm": 30.0},
    ],
    "gradient_norm_at_w_star": 0.5,
    "per_sample_gradient_rms": 0.8,
}
TARGETS = {
    "tolerances": [0.01, 0.001],
    "radius": 0.1,
    "target_loss": 3.0,
    "confidence": 0.95,
    "orderings": 20,
    "bootstrap": 200,
}


def _plan(body: dict = FULL, targets: dict = TARGETS, seed: int = 0) -> dict:
    rec = make_plan(Measurements.model_validate(body), Targets.model_validate(targets), seed=seed)
    return json.loads(rec.model_dump_json())


def test_design_field_names_are_present() -> None:
    rec = _plan()
    fit = rec["sample_size"]["fit"]
    assert {"C", "alpha", "alpha_ci", "r2"} <= fit.keys()
    row = rec["sample_size"]["per_tolerance"][0]
    assert row["tolerance"] == 0.01
    assert {"k", "ci"} <= row["empirical"].keys() and "k" in row["theoretical"]
    batch = rec["batch_size"]
    assert {"value", "ci"} <= batch["b_simple"].keys() and {"value", "ci"} <= batch[
        "b_noise"
    ].keys()
    assert {"value", "s_min", "e_min"} <= batch["b_crit"].keys()
    assert "recommended" not in batch and rec["budget"]["batch"]["recommended"] == 2048
    assert {"E", "A", "beta"} <= rec["scaling"].keys()
    assert not {k for k in rec["scaling"] if k.startswith("n_for_target")}
    assert rec["curvature"]["heterogeneity_ratio"] == 10.0
    assert rec["curvature"]["blocks"][1]["block_threshold"] == 2 / 30.0
    codes = {w["code"] for w in rec["warnings"]}
    assert {"negative_curvature", "assumption1_gradient_norm"} <= codes


def test_every_reported_number_names_its_formula() -> None:
    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if ("value" in node or "k" in node) and node.get("status") != "not_computed":
                assert node.get("formula"), path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    rec = _plan()
    for section in ("sample_size", "batch_size"):
        walk(rec[section], section)
    assert rec["scaling"]["formula"] and rec["sample_size"]["fit"]["formula"]


def test_same_seed_same_plan_and_targets_seed_wins() -> None:
    assert _plan(seed=3) == _plan(seed=3)
    assert _plan(seed=3)["sample_size"]["fit"] != _plan(seed=4)["sample_size"]["fit"]
    assert _plan(targets={**TARGETS, "seed": 9}, seed=1)["seed"] == 9


def test_empty_measurements_explain_every_section() -> None:
    rec = _plan({}, {})
    for section in ("sample_size", "batch_size", "scaling", "curvature"):
        assert rec[section]["status"] == "not_computed" and rec[section]["reason"]


_pos = st.floats(1e-6, 1e6, allow_nan=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.dictionaries(st.integers(1, 10**6), _pos, min_size=1, max_size=8),
    scaling=st.lists(st.tuples(_pos, st.floats(0, 100)), min_size=1, max_size=8),
    noise=st.fixed_dictionaries(
        {
            "grad_sq_norm": st.floats(0, 10),
            "trace_sigma": st.floats(0, 10),
            "gHg": st.floats(-10, 10),
            "trace_h_sigma": st.floats(-10, 10),
        }
    ),
    blocks=st.lists(st.tuples(st.floats(-5, 5), st.floats(0, 5)), min_size=1, max_size=4),
    target=st.floats(0, 100),
)
def test_property_any_valid_input_gives_a_finite_json_plan(
    steps: dict, scaling: list, noise: dict, blocks: list, target: float
) -> None:
    body = {
        "steps_to_target": [{"batch_size": b, "steps": s} for b, s in steps.items()],
        "loss_vs_data": [{"n_samples": d, "loss": loss} for d, loss in scaling],
        "gradient_noise": noise,
        "blocks": [
            {
                "name": f"b{i}",
                "lambda_max": hi,
                "lambda_min": hi - width,
                "spectral_norm": max(abs(hi), abs(hi - width)),
            }
            for i, (hi, width) in enumerate(blocks)
        ],
    }
    rec = make_plan(Measurements.model_validate(body), Targets(target_loss=target, bootstrap=50))
    text = rec.model_dump_json()
    assert "NaN" not in text and "Infinity" not in text
    Recommendation.model_validate_json(text)


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)), min_size=1, max_size=20),
    b_small=st.integers(1, 512),
    factor=st.integers(2, 64),
    with_hessian=st.booleans(),
)
def test_property_two_batch_series_never_break_the_plan(
    pairs: list, b_small: int, factor: int, with_hessian: bool
) -> None:
    small, big = [p[0] for p in pairs], [p[1] for p in pairs]
    noise = {
        "b_small": b_small,
        "b_big": b_small * factor,
        "grad_sq_norm_small": small,
        "grad_sq_norm_big": big,
    }
    if with_hessian:
        noise |= {"gHg_small": small, "gHg_big": big}
    rec = make_plan(Measurements.model_validate({"gradient_noise": noise}), Targets(bootstrap=50))
    text = rec.model_dump_json()
    assert "NaN" not in text and "Infinity" not in text
    batch = rec.batch_size
    if isinstance(batch.b_simple, NotComputed):
        assert "b_simple_undefined" in [w.code for w in rec.warnings]
    else:
        assert batch.b_simple.value > 0


def test_assumption1_checks_per_example_gradients_not_the_mean() -> None:
    """At an exact least-squares minimum the mean gradient is 0 but the per-example gradients
    are not: the check uses their RMS, and the mean-gradient ratio alone is not a pass."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(500, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + rng.normal(0, 0.3, 500)
    w_star = np.linalg.lstsq(x, y, rcond=None)[0]
    per_example = 2 * x * (x @ w_star - y)[:, None]  # ∇(xᵀw − y)² at w*
    mean = per_example.mean(axis=0)
    rms = float(np.sqrt(((per_example - mean) ** 2).sum(axis=1).mean()))
    m_bound = float(np.linalg.eigvalsh(2 * x.T @ x / 500).max())
    body = {
        "gradient_norm_at_w_star": float(np.linalg.norm(mean)),
        "per_sample_gradient_rms": rms,
        "hessian_norm_bound": m_bound,
    }
    rec = _plan(body, {"radius": 0.01})
    curvature = rec["curvature"]
    assert curvature["assumption1_mean_gradient_ratio"] < 1e-10
    assert curvature["assumption1_ratio"] == pytest.approx(2 * rms / (m_bound * 0.01))
    assert curvature["assumption1_ratio"] > 10
    assert "assumption1_gradient_norm" in {w["code"] for w in rec["warnings"]}
