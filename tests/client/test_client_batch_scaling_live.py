"""A plan with batch sweeps at several token counts, through real ``curvplan serve`` and
``curvplan worker`` processes: budget.batch answers a larger target run from the law."""

from __future__ import annotations

import math

import pytest
from live_plugin import LiveService

import curvplan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

C_TRUE, GAMMA_TRUE = 0.02, 0.45


def _sweep(tokens: float) -> dict[str, object]:
    """Exact S = S_min(1 + B_crit(D)/B), B_crit(D) = c·D^γ, with a ±3 % seeded ripple."""
    b_crit = C_TRUE * tokens**GAMMA_TRUE
    ripple = [1.03, 0.98, 1.01, 0.97, 1.02, 0.99, 1.0]
    rows = [
        {"batch_size": b, "steps": 1e4 * (1 + b_crit / b) * r}
        for b, r in zip((8, 16, 32, 64, 128, 256, 512), ripple, strict=True)
    ]
    return {"tokens": tokens, "steps_to_target": rows}


def test_the_service_answers_the_target_runs_batch_from_the_law(live: LiveService) -> None:
    measurements = {
        "batch_sweeps": [_sweep(1e8), _sweep(4e8), _sweep(1.6e9)],
        "tokens_per_example": 256.0,
    }
    target = 3.2e10  # 20× the largest pilot
    with curvplan.Client(live.url, live.api_key) as api:
        job = api.submit_plan(measurements, {"target_tokens": target, "bootstrap": 100})
        done = api.wait(job.id, timeout=90)
        assert done.status == "succeeded", done.error
        rec = api.get_recommendation(job.id)
        html = api.get_report_html(job.id)
    batch = rec.budget.batch
    assert batch.source == "batch_scaling_law"
    law = batch.scaling_law
    assert law is not None and law.measured_tokens_range == (1e8, 1.6e9)
    assert law.gamma_ci[0] <= GAMMA_TRUE <= law.gamma_ci[1]
    lo, hi = batch.critical_ci
    assert lo <= C_TRUE * target**GAMMA_TRUE <= hi
    assert batch.recommended == 2 ** round(math.log2(batch.critical))
    assert any("20× the largest pilot" in w for w in rec.budget.warnings)
    assert html.startswith("<!DOCTYPE html>")
