"""The report's figures and page from job documents: the numbers drawn against the closed
forms they stand for, the drawings themselves (SVG parsed, PNG decoded), empty figures with
their reasons, escaping of user strings."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from plan_bodies import B_CRIT, S_MIN

from curvplan_server.reports.page import render_report
from curvplan_server.reports.plots import (
    Plot,
    build_plots,
    confidence_band,
    inline_svg,
)

PLOT_IDS = [
    "delta-curve", "block-norms", "off-diagonal", "bounds",
    "batch-size", "loss-vs-data", "noise-trend",
]  # fmt: skip
SVG = "{http://www.w3.org/2000/svg}"


def by_id(plots: list[Plot]) -> dict[str, Plot]:
    return {p.id: p for p in plots}


def svg_texts(svg: str) -> list[str]:
    root = ET.fromstring(svg.encode())
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def png_pixels(png: bytes) -> Any:
    from matplotlib.image import imread

    return imread(io.BytesIO(png), format="png")


def test_plan_job_figures_draw_the_fitted_laws(
    plan_job: dict[str, Any], plan_plots: list[Plot]
) -> None:
    plots = by_id(plan_plots)
    assert list(plots) == PLOT_IDS
    rec = plan_job["result"]["recommendation"]

    delta = plots["delta-curve"]
    fit = rec["sample_size"]["fit"]
    assert delta.numbers["k"] == rec["sample_size"]["curve"]["k"]
    bound = delta.numbers["theorem7_bound"]
    l_max = plan_job["request"]["measurements"]["loss_bound"]
    m, r = 40.0, 0.1  # hessian_norm_bound and targets.radius of the job
    assert bound["constant"] == pytest.approx(2 * l_max + m * r * r)  # Theorem 7
    for k, value in zip(bound["k"], bound["value"], strict=True):
        assert value == pytest.approx((2 * l_max + m * r * r) / (k + 1))
    band = delta.numbers["band"]
    for k, lo, hi in zip(band["k"], band["low"], band["high"], strict=True):
        assert lo <= fit["C"] * k ** -fit["alpha"] * (1 + 1e-12)
        assert fit["C"] * k ** -fit["alpha"] <= hi * (1 + 1e-12)

    batch = plots["batch-size"]
    assert batch.numbers["fit"]["b_crit"] == pytest.approx(B_CRIT, rel=1e-3)
    assert batch.numbers["fit"]["s_min"] == pytest.approx(S_MIN, rel=1e-3)
    assert "B_crit = 500" in svg_texts(batch.svg or "")  # the legend names the value

    loss = plots["loss-vs-data"]
    assert loss.numbers["fit"]["beta"] == pytest.approx(0.3, rel=1e-3)

    heat = plots["block-norms"]
    assert heat.numbers["layers"] == [0, 1]
    assert heat.numbers["sublayers"] == ["ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out"]
    assert heat.numbers["spectral_norm"][1][0] == pytest.approx(1.5)  # layers.1.ln1
    assert "head" in heat.caption  # a block outside the layers is listed, not dropped
    assert "12" in svg_texts(heat.svg or "")  # cells carry their values (layers.1.ffn_out)

    for pid in ("off-diagonal", "bounds"):  # plan jobs cannot have these: say why
        assert not plots[pid].drawn and "analyze" in (plots[pid].empty_reason or "")
        assert plots[pid].png is None


def test_figures_have_labelled_axes_with_units_and_real_pixels(plan_plots: list[Plot]) -> None:
    units = {
        "delta-curve": ("samples k (count, log scale)", "(loss units)"),
        "batch-size": ("examples per step", "steps to target S (steps)"),
        "loss-vs-data": ("dataset size D (samples, log scale)", "loss L (loss units)"),
        "block-norms": ("sublayer", "layer"),
    }
    for plot in plan_plots:
        if not plot.drawn:
            continue
        texts = svg_texts(plot.svg or "")
        assert plot.title in texts
        for label in units[plot.id]:
            assert any(label in t for t in texts), (plot.id, label)
        pixels = png_pixels(plot.png or b"")
        assert pixels.shape[:2] == (660, 1140)  # 7.6 × 4.4 in at 150 dpi
        assert pixels[..., :3].std() > 0.05  # drawn, not a blank canvas


def test_drawing_never_imports_pyplot(plan_job: dict[str, Any]) -> None:
    """Never pyplot (global state, not thread-safe). Checked in a fresh interpreter: another
    library in this test process (Lightning, for one) may have imported it already."""
    code = (
        "import json, sys\n"
        "from curvplan_server.reports.plots import build_plots\n"
        "plots = build_plots(json.load(sys.stdin))\n"
        "assert any(p.drawn for p in plots)\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(plan_job, default=str),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_band_is_the_corner_envelope() -> None:
    low, high = confidence_band([1.0, 10.0], [1.0, 2.0], [0.5, 1.0])  # type: ignore[misc]
    assert low == pytest.approx([1.0, 0.1]) and high == pytest.approx([2.0, 2 * 10**-0.5])
    assert confidence_band([1.0], [None, 2.0], [0.5, 1.0]) is None


def test_analyze_job_figures_off_diagonal_and_bounds(analyze_plots: list[Plot]) -> None:
    plots = by_id(analyze_plots)
    off = plots["off-diagonal"]
    assert off.drawn
    assert off.numbers["blocks"] == ["layers.0.q", "layers.0.k", "layers.0.v"]
    norm = off.numbers["norm"]
    assert norm[0][1] == norm[1][0] == 0.5 and norm[1][2] == norm[2][1] == 2.5
    assert norm[0][2] is None  # not measured: grey, not zero
    bounds = plots["bounds"]
    assert bounds.numbers["bound"] == [4.0, 8.0, 12.0, None]
    assert "GELU breaks Theorem 1" in bounds.caption
    assert plots["batch-size"].drawn  # steps_to_target from planner_inputs
    assert not plots["loss-vs-data"].drawn and plots["loss-vs-data"].empty_reason


def test_failed_job_report_says_why_every_figure_is_empty(plan_job: dict[str, Any]) -> None:
    job = {
        **plan_job,
        "status": "failed",
        "result": None,
        "error": {"type": "worker-lost", "title": "Worker lost", "detail": "3 attempts"},
    }
    plots = build_plots(job)
    assert all(not p.drawn and p.empty_reason for p in plots)
    assert all("failed" in (p.empty_reason or "") for p in plots)
    html = render_report(job, plots)
    assert "worker-lost" in html and "No recommendation: the job is failed" in html
    assert html.count('class="empty"') >= len(PLOT_IDS)


def test_page_has_the_budget_first_escapes_and_loads_nothing(
    plan_job: dict[str, Any], plan_plots: list[Plot]
) -> None:
    evil = '<img src=x onerror=alert(1)>"'
    job = {**plan_job, "name": evil, "tags": {"t": "<b>bold</b>"}}
    html = render_report(job, plan_plots)
    assert "<img" not in html and "<b>bold" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;&quot;" in html
    outside = html.replace("http://www.w3.org/2000/svg", "").replace(
        "http://www.w3.org/1999/xlink", ""
    )
    assert "<script" not in html and "http://" not in outside and "https://" not in outside
    assert html.count("<svg") == 4
    budget = html.index('id="budget"')
    assert budget < html.index("<h2>Summary</h2>") < html.index('id="delta-curve"')
    b_crit = plan_job["result"]["recommendation"]["budget"]["batch"]["critical"]
    assert "critical B_crit" in html[budget : html.index("<h2>Summary</h2>")]
    assert f"{b_crit:.3g}" in html[budget : html.index("<h2>Summary</h2>")]


def test_inline_svg_is_an_element_with_the_plot_id(plan_plots: list[Plot]) -> None:
    plot = plan_plots[0]
    inline = inline_svg(plot) or ""
    assert inline.startswith('<svg id="delta-curve"') and "<?xml" not in inline
    assert ET.fromstring(inline.encode()).get("id") == "delta-curve"
    assert (plot.svg or "").startswith("<?xml")  # the served file stays a full document


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
    from curvplan.types.planner import Recommendation
    from curvplan_server.reports.plots import delta_curve_plot

    plot = delta_curve_plot(job, Recommendation.model_validate(job["result"]["recommendation"]))
    assert plot.numbers["off_minimum"] == [
        {"radius": 0.05, "kind": "random", "C": 3.0, "alpha": 0.9}
    ]
    texts = svg_texts(plot.svg or "")
    assert "off-minimum fit at r = 0.05 (random)" in texts
    assert not any("top_eigenspace" in t for t in texts)  # a fit not computed is not drawn
    assert "Fit window k ∈ [" in plot.caption


def test_inputs_section_shortens_long_arrays_and_escapes(
    plan_job: dict[str, Any], plan_plots: list[Plot]
) -> None:
    job = json.loads(json.dumps(plan_job))
    job["request"]["name"] = "</pre><script>x</script>"
    html = render_report(job, plan_plots)
    n = len(plan_job["request"]["measurements"]["per_sample_losses"])
    assert f"… {n - 8} more" in html
    assert "</pre><script>" not in html and "&lt;/pre&gt;&lt;script&gt;" in html
