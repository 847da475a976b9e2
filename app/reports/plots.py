"""The report's plots, built from a job's JSON (the ``GET /v1/jobs/{id}`` document).

Each :class:`Plot` holds the SVG (or, when its data are missing, the reason why), a
caption, and the numbers it draws (``curvplan report --out`` writes those as JSON).
Plan jobs carry their inputs in ``request.measurements``; analyze jobs keep the
engine's measurements in ``result.measurements`` and the planner's inputs in
``result.planner_inputs.fields``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from curvplan_server.reports.svg import (
    Chart,
    DotChart,
    DotSeries,
    Heatmap,
    Series,
    VLine,
    fmt_number,
)

SUBLAYER_ORDER = ("ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out")
LAYER_BLOCK = re.compile(r"^layers\.(\d+)\.(.+)$")
CURVE_POINTS = 80


@dataclass
class Plot:
    id: str
    title: str
    svg: str | None
    caption: str
    empty_reason: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- formulas
def power_law(k: float, c: float, alpha: float) -> float:
    """Δ_k ≈ C·k^(−α), the fitted loss-difference curve (Petrov et al. 2025 §3.3;
    docs/formulas.md)."""
    return c * k ** (-alpha)


def theorem7_bound(k: float, loss_bound: float, hessian_bound: float, radius: float) -> float:
    """|L_{k+1}(w) − L_k(w)| ≤ (2ℓ_max + M·R²)/(k+1) (Petrov et al. 2025, Theorem 7)."""
    return (2.0 * loss_bound + hessian_bound * radius**2) / (k + 1.0)


def mccandlish_steps(batch_size: float, s_min: float, b_crit: float) -> float:
    """Steps to a target loss S = S_min·(1 + B_crit/B) (McCandlish et al. 2018, §2.3)."""
    return s_min * (1.0 + b_crit / batch_size)


def loss_vs_data(d: float, e: float, a: float, beta: float) -> float:
    """L(D) = E + A·D^(−β), the data scaling law the planner fits (docs/formulas.md)."""
    return e + a * d ** (-beta)


def log_grid(lo: float, hi: float, n: int = CURVE_POINTS) -> list[float]:
    """``n`` points evenly spaced in log between lo and hi (both > 0)."""
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def confidence_band(
    ks: Sequence[float], c_ci: Sequence[float | None], alpha_ci: Sequence[float | None]
) -> tuple[list[float], list[float]] | None:
    """Lower/upper envelope of C·k^(−α) over the corners of the C and α intervals.

    The corners of [C_lo, C_hi] × [α_lo, α_hi] bound the curve for every (C, α) in the
    rectangle because C·k^(−α) is monotone in each; this is conservative (it ignores the
    bootstrap correlation of C and α).
    """
    if None in (*c_ci, *alpha_ci) or len(c_ci) != 2 or len(alpha_ci) != 2:
        return None
    corners = [(c, a) for c in c_ci for a in alpha_ci]
    lows = [min(power_law(k, c, a) for c, a in corners) for k in ks]  # type: ignore[arg-type]
    highs = [max(power_law(k, c, a) for c, a in corners) for k in ks]  # type: ignore[arg-type]
    return lows, highs


# --------------------------------------------------------------------------- job access
def recommendation_of(job: dict[str, Any]) -> dict[str, Any] | None:
    rec = (job.get("result") or {}).get("recommendation")
    return rec if isinstance(rec, dict) else None


def planner_inputs(job: dict[str, Any]) -> dict[str, Any]:
    """The planner's measurement fields: the plan request's, or the analyze result's."""
    request = job.get("request") or {}
    if isinstance(request.get("measurements"), dict):
        return request["measurements"]
    result = job.get("result") or {}
    fields = (result.get("planner_inputs") or {}).get("fields")
    return fields if isinstance(fields, dict) else {}


def engine_measurements(job: dict[str, Any]) -> dict[str, Any]:
    """The curvature engine's result of an analyze job (blocks, off_diagonal, bounds)."""
    measured = (job.get("result") or {}).get("measurements")
    return measured if isinstance(measured, dict) else {}


def _section(rec: dict[str, Any] | None, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """(section, None) when computed, else (None, why not)."""
    if rec is None:
        return None, "the job has no recommendation yet (it has not succeeded)"
    section = rec.get(name)
    if not isinstance(section, dict):
        return None, f"the recommendation has no {name} section"
    if section.get("status") == "not_computed":
        return None, f"not computed: {section.get('reason', 'no reason given')}"
    return section, None


def _why_no_job_result(job: dict[str, Any]) -> str | None:
    if job.get("status") != "succeeded":
        return f"the job is {job.get('status')}; plots need a succeeded job"
    return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


# --------------------------------------------------------------------------- plots
def delta_curve_plot(job: dict[str, Any]) -> Plot:
    title = "Loss difference Δ_k vs number of samples k"
    pid = "delta-curve"
    section, why = _section(recommendation_of(job), "sample_size")
    why = _why_no_job_result(job) or why
    curve = (section or {}).get("curve")
    if section is None or not curve or not curve.get("k"):
        reason = why or "the sample-size section has no Δ_k curve (too few per-sample losses)"
        return Plot(pid, title, None, "", reason)
    ks = [float(k) for k in curve["k"]]
    deltas = [float(d) for d in curve["delta"]]
    series = [Series("measured Δ_k (mean over orderings)", ks, deltas, kind="points")]
    numbers: dict[str, Any] = {"k": ks, "delta": deltas}
    grid = log_grid(min(ks), max(ks))
    notes = []
    fit = section.get("fit") or {}
    if fit.get("status") == "not_computed" or "C" not in fit:
        notes.append(f"fit not computed: {fit.get('reason', 'unknown')}")
    else:
        c, alpha = float(fit["C"]), float(fit["alpha"])
        band = confidence_band(grid, fit.get("C_ci") or (), fit.get("alpha_ci") or ())
        if band is not None:
            series.insert(0, Series("CI band of C and α", grid, band[0], kind="band", y_hi=band[1]))
            numbers["band"] = {"k": grid, "low": band[0], "high": band[1]}
        else:
            notes.append("no confidence band: the fit has no bootstrap intervals")
        fit_label = f"fit C·k^(−α), C = {fmt_number(c)}, α = {fmt_number(alpha)}"
        series.append(Series(fit_label, grid, [power_law(k, c, alpha) for k in grid]))
        numbers["fit"] = {k: fit.get(k) for k in ("C", "alpha", "C_ci", "alpha_ci", "r2", "window")}
        if fit.get("window"):
            notes.append(f"fit window k ∈ [{fit['window'][0]}, {fit['window'][1]}]")
    for off in section.get("off_minimum") or []:
        off_fit = off.get("fit") or {}
        if "C" in off_fit and "alpha" in off_fit:
            c_off, a_off = float(off_fit["C"]), float(off_fit["alpha"])
            label = f"off-minimum fit at r = {fmt_number(float(off['radius']))} ({off['kind']})"
            values = [power_law(k, c_off, a_off) for k in grid]
            series.append(Series(label, grid, values, color="#9467bd", dash=True))
            numbers.setdefault("off_minimum", []).append(
                {"radius": off["radius"], "kind": off["kind"], "C": c_off, "alpha": a_off}
            )
    loss_bound = _num((section.get("loss_bound") or {}).get("value"))
    m_bound = _num((section.get("hessian_norm_bound") or {}).get("value"))
    radius = _num(section.get("radius"))
    if loss_bound is not None:
        if m_bound is not None and radius is not None:
            label = f"Thm 7 bound (2ℓ_max + M·R²)/(k+1), R = {fmt_number(radius)}"
            m_used, r_used = m_bound, radius
        else:
            label = "Thm 7 bound at w* (R = 0): 2ℓ_max/(k+1)"
            m_used, r_used = 0.0, 0.0
            notes.append("bound drawn at R = 0: M or the radius R is unknown")
        bound = [theorem7_bound(k, loss_bound, m_used, r_used) for k in grid]
        series.append(Series(label, grid, bound, color="#7f7f7f", dash=True))
        numbers["theorem7_bound"] = {
            "k": grid,
            "value": bound,
            "loss_bound": loss_bound,
            "M": m_used,
            "R": r_used,
        }
    else:
        notes.append("no Theorem 7 bound: loss_bound (ℓ_max) was not given")
    chart = Chart(
        title,
        "samples k (count, log scale)",
        "Δ_k = |L_{k+1} − L_k| (loss units)",
        series,
        x_log=True,
        y_log=True,
        plot_id=pid,
    )
    caption = "Log–log axes. " + " ".join(f"{n.capitalize()}." for n in notes)
    return Plot(pid, title, chart.render(), caption.strip(), numbers=numbers)


def _blocks(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-block curvature: the recommendation's summary, else the engine's or the inputs'."""
    section, _ = _section(recommendation_of(job), "curvature")
    if section and section.get("blocks"):
        return list(section["blocks"])
    engine = engine_measurements(job).get("blocks")
    if isinstance(engine, list) and engine:
        return engine
    return list(planner_inputs(job).get("blocks") or [])


def block_heatmap_plot(job: dict[str, Any]) -> Plot:
    title = "Block Hessian spectral norms ‖H_b‖₂ (layers × sublayers)"
    pid = "block-norms"
    blocks = _blocks(job)
    grid: dict[int, dict[str, float | None]] = {}
    others: dict[str, float | None] = {}
    for b in blocks:
        name, norm = str(b.get("name", "")), _num(b.get("spectral_norm"))
        match = LAYER_BLOCK.match(name)
        if match:
            grid.setdefault(int(match.group(1)), {})[match.group(2)] = norm
        elif name:
            others[name] = norm
    if not grid:
        reason = _why_no_job_result(job) or (
            "no per-block Hessian norms: give `blocks` in the measurements or run an analyze job"
            if not blocks
            else "no block is named layers.<i>.<sublayer>; nothing to arrange by layer"
        )
        return Plot(pid, title, None, "", reason, numbers={"others": others})
    subs = [s for s in SUBLAYER_ORDER if any(s in row for row in grid.values())]
    subs += sorted({s for row in grid.values() for s in row} - set(subs))
    layers = sorted(grid)
    values = [[grid[i].get(s) for s in subs] for i in layers]
    heat = Heatmap(
        title,
        "sublayer",
        "layer",
        [f"layer {i}" for i in layers],
        subs,
        values,
        "‖H_b‖₂ (loss/param², log colour)",
        plot_id=pid,
    )
    caption = "Grey cells: block not measured. Colour is on a log scale."
    if others:
        rest = ", ".join(
            f"{k} {fmt_number(v) if v is not None else 'n/a'}" for k, v in others.items()
        )
        caption += f" Blocks outside the layers: {rest}."
    numbers = {"layers": layers, "sublayers": subs, "spectral_norm": values, "others": others}
    return Plot(pid, title, heat.render(), caption, numbers=numbers)


def off_diagonal_plot(job: dict[str, Any]) -> Plot:
    title = "Off-diagonal block norms ‖H_ij‖₂"
    pid = "off-diagonal"
    off = engine_measurements(job).get("off_diagonal")
    if not isinstance(off, list) or not off:
        reason = _why_no_job_result(job) or (
            "off-diagonal blocks ‖H_ij‖ are measured by analyze jobs; this job has none"
            if job.get("kind") != "analyze"
            else "the analysis measured no off-diagonal blocks (disabled in its options?)"
        )
        return Plot(pid, title, None, "", reason)
    diag = {str(b.get("name")): _num(b.get("spectral_norm")) for b in _blocks(job)}
    names: list[str] = []
    for entry in off:
        for key in ("row", "col"):
            if str(entry.get(key)) not in names:
                names.append(str(entry.get(key)))
    index = {n: i for i, n in enumerate(names)}
    matrix: list[list[float | None]] = [[None] * len(names) for _ in names]
    for n in names:
        matrix[index[n]][index[n]] = diag.get(n)
    for entry in off:
        i, j = index[str(entry.get("row"))], index[str(entry.get("col"))]
        value = _num(entry.get("sigma_max"))
        matrix[i][j] = matrix[j][i] = value
    heat = Heatmap(
        title,
        "block j",
        "block i",
        names,
        names,
        matrix,
        "‖H_ij‖₂ (loss/param², log colour)",
        plot_id=pid,
    )
    caption = "Diagonal: ‖H_ii‖₂ of the block itself; grey: pair not measured. Symmetric."
    return Plot(pid, title, heat.render(), caption, numbers={"blocks": names, "norm": matrix})


def bounds_plot(job: dict[str, Any]) -> Plot:
    title = "Measured block norm vs theoretical bound"
    pid = "bounds"
    blocks = engine_measurements(job).get("blocks")
    if not isinstance(blocks, list) or not blocks:
        reason = _why_no_job_result(job) or (
            "theoretical block bounds (Petrov et al. 2025 Thms 1, 6) are evaluated by analyze "
            "jobs from the weights; this job has none"
        )
        return Plot(pid, title, None, "", reason)
    names, measured, bounds, reasons = [], [], [], []
    for b in blocks:
        bound = b.get("bound") if isinstance(b.get("bound"), dict) else {}
        names.append(str(b.get("name")))
        measured.append(_num(b.get("spectral_norm")))
        ok = bound.get("applicable", True) and _num(bound.get("value")) is not None
        bounds.append(_num(bound.get("value")) if ok else None)
        if not ok and bound.get("reason"):
            reasons.append(str(bound["reason"]))
    numbers = {"blocks": names, "measured": measured, "bound": bounds}
    if all(v is None for v in bounds):
        why = "; ".join(sorted(set(reasons))) or "no bound values in the result"
        return Plot(
            pid, title, None, "", f"no block bound applies to this model: {why}", numbers=numbers
        )
    chart = DotChart(
        title,
        "block",
        "spectral norm (loss/param², log scale)",
        names,
        [
            DotSeries("measured ‖H_b‖₂", measured),
            DotSeries("theoretical bound", bounds, marker="triangle"),
        ],
        plot_id=pid,
    )
    caption = "A bound below its measured norm would be a bug; the gap shows the bound's slack."
    if reasons:
        caption += f" Blocks without a bound: {'; '.join(sorted(set(reasons)))}."
    return Plot(pid, title, chart.render(), caption, numbers=numbers)


def batch_size_plot(job: dict[str, Any]) -> Plot:
    title = "Steps to target vs batch size (McCandlish et al. 2018)"
    pid = "batch-size"
    points = planner_inputs(job).get("steps_to_target") or []
    section, why = _section(recommendation_of(job), "batch_size")
    if not points:
        reason = (
            _why_no_job_result(job)
            or why
            or ("no steps_to_target table was given (steps to reach a target loss per batch size)")
        )
        return Plot(pid, title, None, "", reason)
    bs = [float(p["batch_size"]) for p in points]
    steps = [float(p["steps"]) for p in points]
    series = [Series("measured steps to target", bs, steps, kind="points")]
    vlines = []
    numbers: dict[str, Any] = {"batch_size": bs, "steps": steps}
    crit = (section or {}).get("b_crit") or {}
    caption = "Log–log axes."
    if crit.get("status") == "not_computed" or "value" not in crit:
        caption += f" No fit: {crit.get('reason') or why or 'B_crit was not computed'}."
    else:
        s_min, b_crit = float(crit["s_min"]), float(crit["value"])
        grid = log_grid(min(bs) / 1.5, max(bs) * 1.5)
        label = f"fit S_min(1 + B_crit/B): S_min = {fmt_number(s_min)}"
        series.append(Series(label, grid, [mccandlish_steps(b, s_min, b_crit) for b in grid]))
        series.append(
            Series("S_min (infinite batch)", grid, [s_min] * len(grid), color="#7f7f7f", dash=True)
        )
        vlines.append(VLine(b_crit, f"B_crit = {fmt_number(b_crit)}"))
        numbers["fit"] = {"s_min": s_min, "b_crit": b_crit, "ci": crit.get("ci")}
    chart = Chart(
        title,
        "batch size B (examples per step)",
        "steps to target S (steps)",
        series,
        vlines,
        x_log=True,
        y_log=True,
        plot_id=pid,
    )
    return Plot(pid, title, chart.render(), caption, numbers=numbers)


def loss_vs_data_plot(job: dict[str, Any]) -> Plot:
    title = "Loss vs dataset size L(D) = E + A·D^(−β)"
    pid = "loss-vs-data"
    points = planner_inputs(job).get("loss_vs_data") or []
    section, why = _section(recommendation_of(job), "scaling")
    if not points:
        reason = (
            _why_no_job_result(job)
            or why
            or ("no loss_vs_data pilot runs were given (final loss per dataset size)")
        )
        return Plot(pid, title, None, "", reason)
    ds = [float(p["n_samples"]) for p in points]
    losses = [float(p["loss"]) for p in points]
    series = [Series("measured final loss", ds, losses, kind="points")]
    numbers: dict[str, Any] = {"n_samples": ds, "loss": losses}
    caption = "Log x axis."
    if section is None:
        caption += f" No fit: {why}."
    else:
        e, a, beta = float(section["E"]), float(section["A"]), float(section["beta"])
        hi = max(ds) * 3
        target_n = _num(section.get("n_for_target_loss"))
        if target_n is not None:
            hi = max(hi, target_n * 1.5)
        grid = log_grid(min(ds) / 2, hi)
        label = f"fit: E = {fmt_number(e)}, A = {fmt_number(a)}, β = {fmt_number(beta)}"
        series.append(Series(label, grid, [loss_vs_data(d, e, a, beta) for d in grid]))
        series.append(
            Series("E (irreducible loss)", grid, [e] * len(grid), color="#7f7f7f", dash=True)
        )
        numbers["fit"] = {"E": e, "A": a, "beta": beta}
        vlines = []
        if target_n is not None:
            vlines.append(VLine(target_n, f"D for loss {fmt_number(section['target_loss'])}"))
            numbers["n_for_target_loss"] = target_n
        chart = Chart(
            title,
            "dataset size D (samples, log scale)",
            "loss L (loss units)",
            series,
            vlines,
            x_log=True,
            plot_id=pid,
        )
        return Plot(pid, title, chart.render(), caption, numbers=numbers)
    chart = Chart(
        title,
        "dataset size D (samples, log scale)",
        "loss L (loss units)",
        series,
        x_log=True,
        plot_id=pid,
    )
    return Plot(pid, title, chart.render(), caption, numbers=numbers)


PLOT_BUILDERS = (
    delta_curve_plot,
    block_heatmap_plot,
    off_diagonal_plot,
    bounds_plot,
    batch_size_plot,
    loss_vs_data_plot,
)


def build_plots(job: dict[str, Any]) -> list[Plot]:
    """Every plot of the report, in page order (empty ones carry their reason).

    Only a succeeded job is plotted: the plots show the fits next to their data, and a
    job that did not succeed has no fits (its inputs are in ``request``).
    """
    why = _why_no_job_result(job)
    plots = [builder(job) for builder in PLOT_BUILDERS]
    if why is not None:
        return [Plot(p.id, p.title, None, "", why) for p in plots]
    return plots
