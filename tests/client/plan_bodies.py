"""Plan-job inputs generated from known laws (ground truth for the client, CLI and report tests)."""

from __future__ import annotations

import random
from typing import Any

S_MIN, B_CRIT = 1200.0, 500.0  # McCandlish et al. 2018 §2.3: S = S_min(1 + B_crit/B)
E, A, BETA = 1.7, 400.0, 0.3  # L(D) = E + A·D^(−β)
SUBLAYERS = ("ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out")


def full_measurements(n_losses: int = 300, seed: int = 0) -> dict[str, Any]:
    """Every measurement group, so every section and plot of a report has data."""
    rng = random.Random(seed)
    losses = [rng.expovariate(1.0) for _ in range(n_losses)]
    blocks = []
    for layer in range(2):
        for j, sub in enumerate(SUBLAYERS):
            norm = (1.0 + j) * (1.5 if layer else 1.0)
            blocks.append(
                {
                    "name": f"layers.{layer}.{sub}",
                    "lambda_max": norm,
                    "lambda_min": -0.01 * norm,
                    "spectral_norm": norm,
                    "trace": 3 * norm,
                }
            )
    blocks.append({"name": "head", "lambda_max": 2.5, "lambda_min": 0.0, "spectral_norm": 2.5})
    return {
        "per_sample_losses": losses,
        "loss_bound": max(losses) * 1.5,
        "hessian_norm_bound": 40.0,
        "gradient_noise": {
            "grad_sq_norm": 0.02,
            "trace_sigma": 3.1,
            "gHg": 0.004,
            "trace_h_sigma": 0.9,
        },
        "steps_to_target": [
            {"batch_size": b, "steps": S_MIN * (1 + B_CRIT / b)}
            for b in (32, 64, 128, 256, 512, 1024, 4096)
        ],
        "loss_vs_data": [
            {"n_samples": d, "loss": E + A * d ** (-BETA)} for d in (1e4, 1e5, 1e6, 1e7, 1e8)
        ],
        "blocks": blocks,
    }


def full_targets() -> dict[str, Any]:
    return {
        "tolerances": [0.01, 0.001],
        "radius": 0.1,
        "target_loss": 2.0,
        "orderings": 50,
        "bootstrap": 200,
    }


def small_plan(name: str, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """A quick plan body (a few hundred milliseconds of planner time)."""
    body: dict[str, Any] = {
        "kind": "plan",
        "name": name,
        "measurements": {"per_sample_losses": [0.71, 0.64, 0.80, 0.55, 0.62, 0.70, 0.66, 0.59]},
        "targets": {"orderings": 20, "bootstrap": 0},
    }
    if tags:
        body["tags"] = tags
    return body


def slow_plan(name: str) -> dict[str, Any]:
    """A plan that runs for seconds (to observe running jobs, cancel, restarts): 2,000 losses
    × 10,000 orderings, the most loss evaluations a service plans per job by default
    (CURVPLAN_PLAN_MAX_LOSS_EVALUATIONS), and the most bootstrap draws."""
    rng = random.Random(1)
    return {
        "kind": "plan",
        "name": name,
        "measurements": {"per_sample_losses": [rng.expovariate(1.0) for _ in range(2000)]},
        "targets": {"orderings": 10000, "bootstrap": 10000},
    }
