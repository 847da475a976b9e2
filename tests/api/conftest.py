"""Helpers for the API tests: a valid plan-job body and problem+json assertions."""

from __future__ import annotations

import copy
from typing import Any

import pytest

PLAN_BODY: dict[str, Any] = {
    "kind": "plan",
    "name": "gpt-small-pilot",
    "tags": {"team": "nlp"},
    "measurements": {
        "per_sample_losses": [0.71, 0.64, 0.80, 0.55, 0.62, 0.70, 0.66, 0.59],
        "loss_bound": 5.0,
        "hessian_norm_bound": 12.3,
        "steps_to_target": [
            {"batch_size": 64, "steps": 46000},
            {"batch_size": 256, "steps": 14000},
        ],
        "loss_vs_data": [{"n_samples": 1000000, "loss": 3.2}, {"n_samples": 4000000, "loss": 2.9}],
    },
    "targets": {"tolerances": [0.01, 0.001], "radius": 0.1, "confidence": 0.95},
}


@pytest.fixture
def plan_body() -> dict[str, Any]:
    """A fresh copy of a valid plan body (docs/openapi.json)."""
    return copy.deepcopy(PLAN_BODY)
