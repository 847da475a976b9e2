"""The report page opens with the budget and lists a fan-out's children."""

from __future__ import annotations

import numpy as np

from curvplan.types.planner import Measurements, Targets
from curvplan_core.planner import make_plan
from curvplan_server.reports.page import render_report


def _job(recommendation: dict, children: list[dict] | None = None) -> dict:
    return {
        "id": "00000000-0000-0000-0000-000000000001",
        "kind": "sweep",
        "status": "succeeded",
        "name": "tiny",
        "tags": {},
        "attempt": 2,
        "max_attempts": 4,
        "request": {"kind": "plan"},
        "result": {"recommendation": recommendation},
        "children": children or [],
    }


def test_budget_comes_first_with_units_and_the_children_are_listed():
    losses = list(np.random.default_rng(0).gamma(4.0, 0.5, size=200))
    steps = [{"batch_size": b, "steps": 40 * (1 + 64 / b)} for b in (8, 16, 32, 64, 128)]
    rec = make_plan(
        Measurements(per_sample_losses=losses, steps_to_target=steps, tokens_per_example=16),
        Targets(orderings=8, bootstrap=50),
        seed=0,
    ).model_dump(mode="json")
    child = {"id": "c1", "name": "B=8", "status": "failed", "attempt": 1, "error_type": "diverged"}
    html = render_report(_job(rec, [child]), plots=[])
    assert html.index("<h2>Budget</h2>") < html.index("<h2>Summary</h2>")
    budget = html[html.index('<section id="budget">') : html.index("</section>")]
    assert "examples" in budget and "tokens" in budget and "batch_sweep" in budget
    assert str(rec["budget"]["batch"]["recommended"]) in budget
    assert "not a divergence limit" in budget and "edge of stability" in budget
    assert "<h2>Child jobs</h2>" in html and "diverged" in html


def test_a_job_without_recommendation_says_so_in_the_budget():
    job = _job({})
    job["result"] = None
    html = render_report(job, plots=[])
    assert "No budget" in html


def test_the_batch_scaling_law_is_shown_beside_the_target_runs_batch():
    """The law's γ and c with their intervals and the pilots' token range are on the page."""
    sizes = (8, 16, 32, 64, 128, 256)
    sweeps = [
        {
            "tokens": d,
            "steps_to_target": [
                {"batch_size": b, "steps": 1e4 * (1 + 0.02 * d**0.45 / b)} for b in sizes
            ],
        }
        for d in (1e8, 1e9)
    ]
    rec = make_plan(
        Measurements.model_validate({"batch_sweeps": sweeps}),
        Targets(target_tokens=2e10, bootstrap=50, orderings=8),
    )
    html = render_report(_job(rec.model_dump(mode="json")))
    assert "batch_scaling_law" in html
    assert "law B_crit = c·D^γ: γ" in html and "law B_crit = c·D^γ: c" in html
    assert "0.45" in html
    # the same wording as the CLI's budget table (one budget summary)
    assert "pilots 1.000e+08–1.000e+09 tokens; target 2.000e+10" in html
