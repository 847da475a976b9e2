"""A sweep's report draws the tables the sweep measured (not "no steps_to_target table was
given"), and the noise-trend figure draws B_simple / B_noise over training: an analysis's
checkpoints by step, a batch sweep's two-batch B_simple per loss band. Numbers are checked
against the closed forms the inputs were generated from."""

from __future__ import annotations

from typing import Any

import pytest

from curvplan.types.planner import Measurements, Targets
from curvplan_core.planner import make_plan
from curvplan_server.reports.page import render_report
from curvplan_server.reports.plots import build_plots

FAST = {"orderings": 8, "bootstrap": 50}
S_MIN, B_CRIT = 40.0, 60.0


def _job(kind: str, rec: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "5d7e9c1a-3b2f-4c8e-9a1d-2e3f4a5b6c7d",
        "kind": kind,
        "status": "succeeded",
        "name": kind,
        "tags": {},
        "attempt": 2,
        "max_attempts": 4,
        "request": {"kind": kind},
        "result": {**result, "recommendation": rec.model_dump(mode="json")},
        "error": None,
        "children": [{"id": "x", "kind": "sweep_point", "name": "b=8", "status": "succeeded"}],
        "created_at": "2026-12-01T08:00:00+00:00",
        "started_at": "2026-12-01T08:00:01+00:00",
        "finished_at": "2026-12-01T08:00:02+00:00",
    }


def test_a_batch_sweeps_report_draws_its_own_table_and_noise_trend() -> None:
    table = [{"batch_size": b, "steps": S_MIN * (1 + B_CRIT / b)} for b in (8, 16, 32, 64, 128)]
    rec = make_plan(Measurements(steps_to_target=table), Targets(target_loss=1.6, **FAST), seed=0)
    bands = [  # what the sweep kind stores in result.sweep.b_simple_trend
        {"eval_loss_low": lo, "eval_loss_high": lo + 0.2, "value": v, "ci": [v / 2, v * 2],
         "n_steps": 40, "formula": "B_simple", "value_tokens": None}
        for lo, v in ((2.2, 5.0), (2.0, 9.0), (1.8, 20.0))
    ]  # fmt: skip
    job = _job(
        "sweep",
        rec,
        {
            "sweep": {"type": "batch", "b_simple_trend": bands},
            "measurements": {"steps_to_target": table},
        },
    )
    plots = {p.id: p for p in build_plots(job)}
    batch = plots["batch-size"]
    assert batch.drawn, batch.empty_reason
    assert batch.numbers["batch_size"] == [8, 16, 32, 64, 128]
    assert batch.numbers["fit"]["b_crit"] == pytest.approx(B_CRIT, rel=1e-3)
    assert batch.numbers["fit"]["s_min"] == pytest.approx(S_MIN, rel=1e-3)
    trend = plots["noise-trend"]
    assert trend.drawn, trend.empty_reason
    assert trend.numbers["eval_loss"] == pytest.approx([2.3, 2.1, 1.9])
    assert trend.numbers["b_simple"] == [5.0, 9.0, 20.0]
    html = render_report(job, list(plots.values()))
    assert "no steps_to_target table was given" not in html
    assert 'id="noise-trend"' in html


def _trend_point(step: int, loss: float, b_noise: float, b_simple: float) -> dict[str, Any]:
    g2 = 1.0
    return {
        "checkpoint": f"step_{step}.safetensors",
        "step": step,
        "loss": loss,
        "grad_sq_norm": g2,
        "trace_sigma": b_simple * g2,  # B_simple = tr Σ / |G|²
        "gHg": 2.0,
        "trace_h_sigma": 2.0 * b_noise,  # B_noise = tr(HΣ) / GᵀHG
        "log_b_noise_se": 0.05,
        "log_b_simple_se": 0.05,
    }


def test_an_analysis_noise_trend_is_drawn_by_step_at_the_generated_values() -> None:
    truth = [(25, 2.0, 8.0, 6.0), (50, 1.7, 16.0, 12.0), (100, 1.5, 32.0, 24.0)]
    trend = [_trend_point(*t) for t in truth]
    rec = make_plan(
        Measurements(gradient_noise_trend=trend), Targets(target_loss=1.6, **FAST), seed=0
    )
    job = _job("analyze", rec, {"planner_inputs": {"fields": {"gradient_noise_trend": trend}}})
    plot = {p.id: p for p in build_plots(job)}["noise-trend"]
    assert plot.drawn, plot.empty_reason
    assert plot.numbers["x"] == [25.0, 50.0, 100.0] and plot.numbers["x_is_step"] is True
    assert plot.numbers["checkpoint"] == [f"step_{s}.safetensors" for s, *_ in truth]
    assert plot.numbers["b_noise"] == pytest.approx([b for _, _, b, _ in truth], rel=1e-9)
    assert plot.numbers["b_simple"] == pytest.approx([b for *_, b in truth], rel=1e-9)
    for value, (lo, hi) in zip(plot.numbers["b_noise"], plot.numbers["b_noise_ci"], strict=True):
        assert lo < value < hi


def test_without_a_trend_the_figure_says_how_to_get_one() -> None:
    rec = make_plan(Measurements(per_sample_losses=[0.5, 0.7, 0.6, 0.9]), Targets(**FAST), seed=0)
    plot = {p.id: p for p in build_plots(_job("analyze", rec, {}))}["noise-trend"]
    assert not plot.drawn and "intermediate checkpoints" in (plot.empty_reason or "")
