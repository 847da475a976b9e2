"""The report's plots and page from job documents: numbers against the formulas they draw,
empty sections with their reasons, escaping of user strings, and report files."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from plan_bodies import B_CRIT, S_MIN

from curvplan_server.reports.files import write_report_files
from curvplan_server.reports.page import render_report
from curvplan_server.reports.plots import build_plots, confidence_band, power_law

PLOT_IDS = ["delta-curve", "block-norms", "off-diagonal", "bounds", "batch-size", "loss-vs-data"]


def by_id(job: dict[str, Any]) -> dict[str, Any]:
    return {p.id: p for p in build_plots(job)}


def test_plan_job_plots_draw_the_fitted_laws(plan_job: dict[str, Any]) -> None:
    plots = by_id(plan_job)
    assert list(plots) == PLOT_IDS
    rec = plan_job["result"]["recommendation"]

    delta = plots["delta-curve"]
    fit = rec["sample_size"]["fit"]
    assert delta.numbers["k"] == rec["sample_size"]["curve"]["k"]
    bound = delta.numbers["theorem7_bound"]
    l_max = plan_job["request"]["measurements"]["loss_bound"]
    m, r = 40.0, 0.1  # hessian_norm_bound and targets.radius of the job
    for k, value in zip(bound["k"], bound["value"], strict=True):
        assert value == pytest.approx((2 * l_max + m * r * r) / (k + 1))  # Theorem 7
    band = delta.numbers["band"]
    for k, lo, hi in zip(band["k"], band["low"], band["high"], strict=True):
        assert lo <= power_law(k, fit["C"], fit["alpha"]) * (1 + 1e-12)
        assert power_law(k, fit["C"], fit["alpha"]) <= hi * (1 + 1e-12)

    batch = plots["batch-size"]
    assert batch.numbers["fit"]["b_crit"] == pytest.approx(B_CRIT, rel=1e-3)
    assert batch.numbers["fit"]["s_min"] == pytest.approx(S_MIN, rel=1e-3)
    assert "B_crit = 500" in (batch.svg or "")

    loss = plots["loss-vs-data"]
    assert loss.numbers["fit"]["beta"] == pytest.approx(0.3, rel=1e-3)

    heat = plots["block-norms"]
    assert heat.numbers["layers"] == [0, 1]
    assert heat.numbers["sublayers"] == ["ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out"]
    assert heat.numbers["spectral_norm"][1][0] == pytest.approx(1.5)  # layers.1.ln1
    assert "head" in heat.caption  # a block outside the layers is listed, not dropped

    for pid in ("off-diagonal", "bounds"):  # plan jobs cannot have these: say why
        assert plots[pid].svg is None and "analyze" in (plots[pid].empty_reason or "")
    for pid in ("delta-curve", "block-norms", "batch-size", "loss-vs-data"):
        ET.fromstring(plots[pid].svg)  # well-formed


def test_band_is_the_corner_envelope() -> None:
    low, high = confidence_band([1.0, 10.0], [1.0, 2.0], [0.5, 1.0])  # type: ignore[misc]
    assert low == pytest.approx([1.0, 0.1]) and high == pytest.approx([2.0, 2 * 10**-0.5])
    assert confidence_band([1.0], [None, 2.0], [0.5, 1.0]) is None


def test_analyze_job_plots_off_diagonal_and_bounds(analyze_job: dict[str, Any]) -> None:
    plots = by_id(analyze_job)
    off = plots["off-diagonal"]
    assert off.svg is not None
    assert off.numbers["blocks"] == ["layers.0.q", "layers.0.k", "layers.0.v"]
    norm = off.numbers["norm"]
    assert norm[0][1] == norm[1][0] == 0.5 and norm[1][2] == norm[2][1] == 2.5
    assert norm[0][2] is None  # not measured: grey, not zero
    bounds = plots["bounds"]
    assert bounds.numbers["bound"] == [4.0, 8.0, 12.0, None]
    assert "GELU breaks Theorem 1" in bounds.caption
    assert plots["batch-size"].svg is not None  # steps_to_target from planner_inputs
    assert plots["loss-vs-data"].svg is None and plots["loss-vs-data"].empty_reason


def test_failed_job_report_says_why_every_plot_is_empty(plan_job: dict[str, Any]) -> None:
    job = {
        **plan_job,
        "status": "failed",
        "result": None,
        "error": {"type": "worker-lost", "title": "Worker lost", "detail": "3 attempts"},
    }
    plots = build_plots(job)
    assert all(p.svg is None and p.empty_reason for p in plots)
    assert any("failed" in (p.empty_reason or "") for p in plots)
    html = render_report(job)
    assert "worker-lost" in html and "No recommendation: the job is failed" in html
    assert html.count('class="empty"') >= len(PLOT_IDS)


def test_page_escapes_user_strings_and_loads_nothing(plan_job: dict[str, Any]) -> None:
    evil = '<img src=x onerror=alert(1)>"'
    job = {**plan_job, "name": evil, "tags": {"t": "<b>bold</b>"}}
    html = render_report(job)
    assert "<img" not in html and "<b>bold" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;&quot;" in html
    assert (
        "<script" not in html
        and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
        and "https://" not in html
    )  # no external resource
    assert html.count("<svg") == 4


def test_report_files(plan_job: dict[str, Any], tmp_path: Path) -> None:
    written = write_report_files(plan_job, tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "delta-curve.svg",
            "block-norms.svg",
            "batch-size.svg",
            "loss-vs-data.svg",
            "report.html",
            "numbers.json",
        ]
    )
    numbers = json.loads((tmp_path / "out" / "numbers.json").read_text())
    assert numbers["plots"]["off-diagonal"]["file"] is None
    assert numbers["plots"]["off-diagonal"]["empty_reason"]
    assert numbers["recommendation"] == plan_job["result"]["recommendation"]
    assert numbers["plots"]["batch-size"]["numbers"]["fit"]["b_crit"] == pytest.approx(
        B_CRIT, rel=1e-3
    )
    svg = (tmp_path / "out" / "delta-curve.svg").read_text()
    assert svg.startswith("<?xml") and ET.fromstring(svg.split("\n", 1)[1]) is not None


def test_off_minimum_fits_are_drawn_with_the_curve(plan_job: dict[str, Any]) -> None:
    job = json.loads(json.dumps(plan_job))
    section = job["result"]["recommendation"]["sample_size"]
    section["off_minimum"] = [
        {"radius": 0.05, "kind": "random", "n_points": 10,
         "fit": {**section["fit"], "C": 3.0, "alpha": 0.9},
         "fit_squared": {"status": "not_computed", "reason": "x"}},
        {"radius": 0.1, "kind": "top_eigenspace", "n_points": 10,
         "fit": {"status": "not_computed", "reason": "too few points"},
         "fit_squared": {"status": "not_computed", "reason": "x"}},
    ]  # fmt: skip
    plot = by_id(job)["delta-curve"]
    assert plot.numbers["off_minimum"] == [
        {"radius": 0.05, "kind": "random", "C": 3.0, "alpha": 0.9}
    ]
    assert "off-minimum fit at r = 0.05 (random)" in (plot.svg or "")
    assert "top_eigenspace" not in (plot.svg or "")  # a fit that was not computed is not drawn
    assert "Fit window k ∈ [" in plot.caption


def test_inputs_section_shortens_long_arrays_and_escapes(plan_job: dict[str, Any]) -> None:
    job = json.loads(json.dumps(plan_job))
    job["request"]["name"] = "</pre><script>x</script>"
    html = render_report(job)
    n = len(plan_job["request"]["measurements"]["per_sample_losses"])
    assert f"… {n - 8} more" in html
    assert "</pre><script>" not in html and "&lt;/pre&gt;&lt;script&gt;" in html
