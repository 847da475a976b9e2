"""The report's figures, drawn with matplotlib from a job's typed recommendation.

Each :class:`Plot` holds its SVG and PNG (or, when its data are missing, the reason why), a
caption, and the numbers it draws (``numbers.json`` of ``curvplan report --out``). Every
fitted curve and bound is evaluated by the planner's own laws (``curvplan_core.planner.laws``)
with the values the recommendation carries, so the figures cannot disagree with the planner.

Drawing uses matplotlib's object-oriented API on the Agg canvas (``Figure`` +
``FigureCanvasAgg``), never ``pyplot``: pyplot keeps global figure state and is not
thread-safe, and the API renders in a thread pool. Figures are rendered once per succeeded job
and cached (``curvplan_server.reports.cache``).

Plan jobs carry their inputs in ``request.measurements``; analyze jobs keep the engine's
measurements in ``result.measurements`` and the planner's inputs in
``result.planner_inputs.fields``.
"""

from __future__ import annotations

import io
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from curvplan.types.planner import (
    BatchSizeSection,
    CurvatureSection,
    NotComputed,
    PowerLawFit,
    Recommendation,
    SampleSizeSection,
    ScalingSection,
)
from curvplan.types.sweep import NoiseScaleAtLoss
from curvplan_core.planner import laws
from curvplan_server.reports.view import (
    BlockBound,
    BlockRow,
    DataRow,
    JobJson,
    ReportJob,
    StepsRow,
)

# Text stays text in the SVG (searchable, accessible, a tenth of the size of glyph paths).
# Set once at import: a process-wide setting, not per-figure state.
matplotlib.rcParams["svg.fonttype"] = "none"

# Bump when a figure changes: cached figures drawn by another renderer are drawn again.
RENDERER = "matplotlib-2"  # 2: the noise-trend figure; a sweep's own tables
SUBLAYER_ORDER = ("ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out")
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
LAYER_BLOCK = re.compile(r"^layers\.(\d+)\.(.+)$")
CURVE_POINTS = 80
FIGSIZE = (7.6, 4.4)  # inches
PNG_DPI = 150
GREY = "#7f7f7f"
METADATA_SVG = {"Date": None, "Creator": "curvplan"}
METADATA_PNG = {"Software": "curvplan"}


@dataclass
class Plot:
    id: str
    title: str
    caption: str
    empty_reason: str | None = None
    numbers: dict[str, object] = field(default_factory=dict)
    svg: str | None = None  # the whole SVG document
    png: bytes | None = None

    @property
    def drawn(self) -> bool:
        return self.svg is not None


def fmt(value: float | None) -> str:
    """A short human form of a number: 3 significant digits, thousands separators."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    mag = abs(value)
    if 1e-3 <= mag < 1e6:
        if float(value).is_integer() and mag >= 1:
            return f"{int(value):,}"
        return f"{value:.3g}"
    return f"{value:.2e}"


# --------------------------------------------------------------------------- job access
# The job is read through ``curvplan_server.reports.view.ReportJob`` (typed, lenient).


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _computed(section: Any, name: str) -> tuple[Any, str | None]:
    if section is None:
        return None, f"the recommendation has no {name} section"
    if isinstance(section, NotComputed):
        return None, f"not computed: {section.reason}"
    return section, None


def log_grid(lo: float, hi: float, n: int = CURVE_POINTS) -> list[float]:
    """``n`` points evenly spaced in log between lo and hi (both > 0)."""
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def confidence_band(
    ks: Sequence[float], c_ci: Sequence[float | None], alpha_ci: Sequence[float | None]
) -> tuple[list[float], list[float]] | None:
    """Lower/upper envelope of C·k^(−α) over the corners of the C and α intervals.

    C·k^(−α) is monotone in C and in α, so the four corners of [C_lo, C_hi] × [α_lo, α_hi]
    bound the curve for every (C, α) in the rectangle; conservative (it ignores the
    bootstrap correlation of C and α).
    """
    if len(c_ci) != 2 or len(alpha_ci) != 2 or None in (*c_ci, *alpha_ci):
        return None
    corners = [(float(c), float(a)) for c in c_ci for a in alpha_ci]  # type: ignore[arg-type]
    lows = [min(laws.power_law(k, c, a) for c, a in corners) for k in ks]
    highs = [max(laws.power_law(k, c, a) for c, a in corners) for k in ks]
    return lows, highs


# --------------------------------------------------------------------------- drawing
def new_figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=FIGSIZE, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, which="major", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def render(fig: Figure) -> tuple[str, bytes]:
    """(SVG document, PNG bytes) of a figure."""
    fig.draw_without_rendering()  # lay out once (constrained layout), then keep that layout
    fig.set_layout_engine("none")  # for both formats instead of solving it again per save
    svg_buf, png_buf = io.StringIO(), io.BytesIO()
    fig.savefig(svg_buf, format="svg", metadata=METADATA_SVG)
    fig.savefig(png_buf, format="png", dpi=PNG_DPI, metadata=METADATA_PNG)
    return svg_buf.getvalue(), png_buf.getvalue()


def _finish(plot: Plot, fig: Figure) -> Plot:
    plot.svg, plot.png = render(fig)
    return plot


# --------------------------------------------------------------------------- plots
def delta_curve_plot(job: ReportJob, rec: Recommendation) -> Plot:
    plot = Plot("delta-curve", "Loss difference Δ_k vs number of samples k", "")
    section, why = _computed(rec.sample_size, "sample_size")
    curve = section.curve if isinstance(section, SampleSizeSection) else None
    if curve is None or not curve.k:
        plot.empty_reason = why or "the sample-size section has no Δ_k curve (too few losses)"
        return plot
    assert isinstance(section, SampleSizeSection)
    ks = [float(k) for k in curve.k]
    deltas = [float(d) for d in curve.delta]
    plot.numbers = {"k": ks, "delta": deltas}
    grid = log_grid(min(ks), max(ks))
    notes: list[str] = []
    fig, ax = new_figure()
    ax.scatter(ks, deltas, s=14, color="C0", label="measured Δ_k (mean over orderings)", zorder=3)
    fit = section.fit
    if isinstance(fit, PowerLawFit):
        band = confidence_band(grid, fit.C_ci or (), fit.alpha_ci or ())
        if band is not None:
            ax.fill_between(grid, band[0], band[1], color="C1", alpha=0.18, lw=0,
                            label="interval band of C and α")  # fmt: skip
            plot.numbers["band"] = {"k": grid, "low": band[0], "high": band[1]}
        else:
            notes.append("no interval band: the fit has no intervals")
        fitted = [laws.power_law(k, fit.C, fit.alpha) for k in grid]
        ax.plot(grid, fitted, color="C1", lw=2,
                label=f"fit C·k^(−α): C = {fmt(fit.C)}, α = {fmt(fit.alpha)}")  # fmt: skip
        plot.numbers["fit"] = fit.model_dump(
            mode="json", include={"C", "alpha", "C_ci", "alpha_ci", "r2", "window"}
        )
        notes.append(f"fit window k ∈ [{fit.window[0]}, {fit.window[1]}]")
        ax.axvspan(fit.window[0], fit.window[1], color="C1", alpha=0.04, lw=0)
    else:
        notes.append(f"fit not computed: {fit.reason}")
    off_minimum: list[dict[str, float | str]] = []
    for i, off in enumerate(section.off_minimum):
        if isinstance(off.fit, PowerLawFit):
            values = [laws.power_law(k, off.fit.C, off.fit.alpha) for k in grid]
            ax.plot(grid, values, color=f"C{4 + i % 5}", lw=1.4, ls="--",
                    label=f"off-minimum fit at r = {fmt(off.radius)} ({off.kind})")  # fmt: skip
            off_minimum.append(
                {"radius": off.radius, "kind": off.kind, "C": off.fit.C, "alpha": off.fit.alpha}
            )
    if off_minimum:
        plot.numbers["off_minimum"] = off_minimum
    if section.loss_bound is not None:
        m_bound = section.hessian_norm_bound.value if section.hessian_norm_bound else None
        if m_bound is not None and section.radius is not None:
            m_used, r_used = m_bound, section.radius
            label = f"Theorem 7 bound (2ℓ_max + M·R²)/(k+1), R = {fmt(r_used)}"
        else:
            m_used, r_used = 0.0, 0.0
            label = "Theorem 7 bound at w* (R = 0): 2ℓ_max/(k+1)"
            notes.append("bound drawn at R = 0: M or the radius R is unknown")
        constant = laws.theorem7_constant(section.loss_bound.value, m_used, r_used)
        bound = [laws.theorem7_bound(k, constant) for k in grid]
        ax.plot(grid, bound, color=GREY, lw=1.4, ls=":", label=label)
        plot.numbers["theorem7_bound"] = {
            "k": grid,
            "value": bound,
            "constant": constant,
            "loss_bound": section.loss_bound.value,
            "M": m_used,
            "R": r_used,
        }
    else:
        notes.append("no Theorem 7 bound: loss_bound (ℓ_max) was not given")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples k (count, log scale)")
    ax.set_ylabel("Δ_k = |L_{k+1} − L_k| (loss units)")
    ax.set_title(plot.title)
    ax.legend(fontsize=8, loc="lower left")
    plot.caption = ("Log–log axes. " + " ".join(f"{n[0].upper()}{n[1:]}." for n in notes)).strip()
    return _finish(plot, fig)


def _blocks(job: ReportJob, rec: Recommendation) -> list[BlockRow]:
    """Per-block curvature: the recommendation's summary, else the engine's or the inputs'."""
    if isinstance(rec.curvature, CurvatureSection) and rec.curvature.blocks:
        return [BlockRow(name=b.name, spectral_norm=b.spectral_norm) for b in rec.curvature.blocks]
    engine = job.engine().blocks
    if engine:
        return engine
    return job.planner_tables().blocks or []


def _heatmap(ax: Any, fig: Figure, values: list[list[float | None]], label: str) -> None:
    import numpy as np

    data = np.ma.masked_invalid(np.array([[np.nan if v is None else v for v in row]
                                          for row in values], dtype=float))  # fmt: skip
    positive = data[data > 0]
    norm = None
    if positive.count():
        lo, hi = float(positive.min()), float(positive.max())
        norm = LogNorm(vmin=lo, vmax=hi if hi > lo else lo * 10)
        data = np.ma.masked_where(data <= 0, data)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    image = ax.imshow(data, cmap=cmap, norm=norm, aspect="auto")
    fig.colorbar(image, ax=ax, label=label)
    for (i, j), value in np.ndenumerate(np.array(values, dtype=object)):
        if value is not None:
            shade = image.norm(value) if norm is not None and value > 0 else 0.0
            ax.text(j, i, fmt(value), ha="center", va="center", fontsize=7,
                    color="black" if shade > 0.6 else "white")  # fmt: skip
    ax.grid(False)


def block_heatmap_plot(job: ReportJob, rec: Recommendation) -> Plot:
    plot = Plot("block-norms", "Block Hessian spectral norms ‖H_b‖₂ (layers × sublayers)", "")
    blocks = _blocks(job, rec)
    grid: dict[int, dict[str, float | None]] = {}
    others: dict[str, float | None] = {}
    for b in blocks:
        name, norm = b.name, _num(b.spectral_norm)
        match = LAYER_BLOCK.match(name)
        if match:
            grid.setdefault(int(match.group(1)), {})[match.group(2)] = norm
        elif name:
            others[name] = norm
    plot.numbers = {"others": others}
    if not grid:
        plot.empty_reason = (
            "no per-block Hessian norms: give `blocks` in the measurements or run an analyze job"
            if not blocks
            else "no block is named layers.<i>.<sublayer>; nothing to arrange by layer"
        )
        return plot
    subs = [s for s in SUBLAYER_ORDER if any(s in row for row in grid.values())]
    subs += sorted({s for row in grid.values() for s in row} - set(subs))
    layers = sorted(grid)
    values = [[grid[i].get(s) for s in subs] for i in layers]
    plot.numbers.update({"layers": layers, "sublayers": subs, "spectral_norm": values})
    fig, ax = new_figure()
    _heatmap(ax, fig, values, "‖H_b‖₂ (loss/param², log colour)")
    ax.set_xticks(range(len(subs)), subs, rotation=30, ha="right")
    ax.set_yticks(range(len(layers)), [f"layer {i}" for i in layers])
    ax.set_xlabel("sublayer")
    ax.set_ylabel("layer")
    ax.set_title(plot.title)
    plot.caption = "Grey cells: block not measured. Colour is on a log scale."
    if others:
        rest = ", ".join(f"{k} {fmt(v)}" for k, v in others.items())
        plot.caption += f" Blocks outside the layers: {rest}."
    return _finish(plot, fig)


def off_diagonal_plot(job: ReportJob, rec: Recommendation) -> Plot:
    plot = Plot("off-diagonal", "Off-diagonal block norms ‖H_ij‖₂", "")
    off = job.engine().off_diagonal
    if not off:
        plot.empty_reason = (
            "off-diagonal blocks ‖H_ij‖ are measured by analyze jobs; this job has none"
            if job.kind != "analyze"
            else "the analysis measured no off-diagonal blocks (disabled in its options?)"
        )
        return plot
    diag = {b.name: _num(b.spectral_norm) for b in _blocks(job, rec)}
    names: list[str] = []
    for entry in off:
        for name in (entry.row, entry.col):
            if name not in names:
                names.append(name)
    index = {n: i for i, n in enumerate(names)}
    matrix: list[list[float | None]] = [[None] * len(names) for _ in names]
    for n in names:
        matrix[index[n]][index[n]] = diag.get(n)
    for entry in off:
        i, j = index[entry.row], index[entry.col]
        matrix[i][j] = matrix[j][i] = _num(entry.sigma_max)
    plot.numbers = {"blocks": names, "norm": matrix}
    fig, ax = new_figure()
    _heatmap(ax, fig, matrix, "‖H_ij‖₂ (loss/param², log colour)")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("block j")
    ax.set_ylabel("block i")
    ax.set_title(plot.title)
    plot.caption = "Diagonal: ‖H_ii‖₂ of the block itself; grey: pair not measured. Symmetric."
    return _finish(plot, fig)


def bounds_plot(job: ReportJob, rec: Recommendation) -> Plot:
    plot = Plot("bounds", "Measured block norm vs theoretical bound", "")
    blocks = job.engine().blocks
    if not blocks:
        plot.empty_reason = (
            "theoretical block bounds (Petrov et al. 2025 Thms 1, 6) are evaluated by analyze "
            "jobs from the weights; this job has none"
        )
        return plot
    names: list[str] = []
    measured: list[float | None] = []
    bounds: list[float | None] = []
    reasons: list[str] = []
    for b in blocks:
        bound = b.bound or BlockBound()
        names.append(b.name)
        measured.append(_num(b.spectral_norm))
        ok = bound.applicable and _num(bound.value) is not None
        bounds.append(_num(bound.value) if ok else None)
        if not ok and bound.reason:
            reasons.append(bound.reason)
    plot.numbers = {"blocks": names, "measured": measured, "bound": bounds}
    if all(v is None for v in bounds):
        why = "; ".join(sorted(set(reasons))) or "no bound values in the result"
        plot.empty_reason = f"no block bound applies to this model: {why}"
        return plot
    fig, ax = new_figure()
    xs = list(range(len(names)))
    pairs = [(x, v) for x, v in zip(xs, measured, strict=True) if v is not None and v > 0]
    ax.scatter([p[0] for p in pairs], [p[1] for p in pairs], s=30, color="C0",
               label="measured ‖H_b‖₂", zorder=3)  # fmt: skip
    pairs = [(x, v) for x, v in zip(xs, bounds, strict=True) if v is not None and v > 0]
    ax.scatter([p[0] for p in pairs], [p[1] for p in pairs], s=40, marker="^", color="C3",
               label="theoretical bound", zorder=3)  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(xs, names, rotation=30, ha="right", fontsize=7)
    ax.set_xlabel("block")
    ax.set_ylabel("spectral norm (loss/param², log scale)")
    ax.set_title(plot.title)
    ax.legend(fontsize=8)
    plot.caption = (
        "A bound below its measured norm would be a bug; the gap shows the bound's slack."
    )
    if reasons:
        plot.caption += f" Blocks without a bound: {'; '.join(sorted(set(reasons)))}."
    return _finish(plot, fig)


def _points(rows: Sequence[StepsRow] | Sequence[DataRow] | None) -> list[tuple[float, float]]:
    """(x, y) of a planner table's finite rows: (batch size, steps) or (examples, loss)."""
    out = []
    for row in rows or []:
        x, y = (
            (row.batch_size, row.steps) if isinstance(row, StepsRow) else (row.n_samples, row.loss)
        )
        x, y = _num(x), _num(y)
        if x is not None and y is not None:
            out.append((x, y))
    return out


def batch_size_plot(job: ReportJob, rec: Recommendation) -> Plot:
    plot = Plot("batch-size", "Steps to target vs batch size (McCandlish et al. 2018)", "")
    points = _points(job.planner_tables().steps_to_target)
    section, why = _computed(rec.batch_size, "batch_size")
    if not points:
        plot.empty_reason = why or (
            "no steps_to_target table was given (steps to reach a target loss per batch size)"
        )
        return plot
    bs, steps = [p[0] for p in points], [p[1] for p in points]
    plot.numbers = {"batch_size": bs, "steps": steps}
    if min(steps) < sys.float_info.min or not math.isfinite(math.log(max(steps) / min(steps))):
        plot.empty_reason = (
            f"degenerate steps_to_target: steps from {fmt(min(steps))} to {fmt(max(steps))} "
            "give no usable range on a log axis (subnormal or overflowing numbers)"
        )
        return plot
    fig, ax = new_figure()
    ax.scatter(bs, steps, s=24, color="C0", label="measured steps to target", zorder=3)
    crit = section.b_crit if isinstance(section, BatchSizeSection) else None
    plot.caption = "Log–log axes."
    if crit is None or isinstance(crit, NotComputed):
        reason = crit.reason if isinstance(crit, NotComputed) else why
        plot.caption += f" No fit: {reason or 'B_crit was not computed'}."
    else:
        grid = log_grid(min(bs) / 1.5, max(bs) * 1.5)
        ax.plot(grid, [laws.steps_to_target(b, crit.s_min, crit.value) for b in grid], color="C1",
                lw=2, label=f"fit S_min(1 + B_crit/B): S_min = {fmt(crit.s_min)}")  # fmt: skip
        ax.axhline(crit.s_min, color=GREY, ls="--", lw=1.2, label="S_min (infinite batch)")
        if crit.ci is not None and None not in crit.ci:
            ax.axvspan(crit.ci[0], crit.ci[1], color="C3", alpha=0.1, lw=0,
                       label="B_crit interval")  # fmt: skip
        ax.axvline(crit.value, color="C3", lw=1.4, label=f"B_crit = {fmt(crit.value)}")
        plot.numbers["fit"] = {"s_min": crit.s_min, "b_crit": crit.value, "ci": crit.ci}
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size B (examples per step)")
    ax.set_ylabel("steps to target S (steps)")
    ax.set_title(plot.title)
    ax.legend(fontsize=8)
    return _finish(plot, fig)


def loss_vs_data_plot(job: ReportJob, rec: Recommendation) -> Plot:
    plot = Plot("loss-vs-data", "Loss vs dataset size L(D) = E + A·D^(−β)", "")
    points = _points(job.planner_tables().loss_vs_data)
    section, why = _computed(rec.scaling, "scaling")
    if not points:
        plot.empty_reason = why or (
            "no loss_vs_data pilot runs were given (final loss per dataset size)"
        )
        return plot
    ds, losses = [p[0] for p in points], [p[1] for p in points]
    plot.numbers = {"n_samples": ds, "loss": losses}
    fig, ax = new_figure()
    ax.scatter(ds, losses, s=24, color="C0", label="measured final loss", zorder=3)
    plot.caption = "Log x axis."
    if not isinstance(section, ScalingSection):
        plot.caption += f" No fit: {why}."
    else:
        data = rec.budget.data if rec.budget is not None else None
        answered = data is not None and data.source in ("data_sweep", "extrapolated")
        target_n = _num(data.recommended_examples) if data is not None and answered else None
        hi = max(max(ds) * 3, (target_n or 0) * 1.5)
        grid = log_grid(min(ds) / 2, hi)
        fitted = [laws.loss_vs_data(d, section.E, section.A, section.beta) for d in grid]
        ax.plot(grid, fitted, color="C1", lw=2,
                label=f"fit: E = {fmt(section.E)}, A = {fmt(section.A)}, "
                f"β = {fmt(section.beta)}")  # fmt: skip
        ax.axhline(section.E, color=GREY, ls="--", lw=1.2, label="E (irreducible loss)")
        plot.numbers["fit"] = {"E": section.E, "A": section.A, "beta": section.beta}
        if target_n is not None and data is not None:
            note = " (extrapolated)" if data.source == "extrapolated" else ""
            ax.axvline(target_n, color="C3", lw=1.4,
                       label=f"budget.data: D for loss {fmt(data.target_loss)}{note}")  # fmt: skip
            plot.numbers["budget_data_examples"] = target_n
    ax.set_xscale("log")
    ax.set_xlabel("dataset size D (samples, log scale)")
    ax.set_ylabel("loss L (loss units)")
    ax.set_title(plot.title)
    ax.legend(fontsize=8)
    return _finish(plot, fig)


def _estimate(value: Any) -> tuple[float | None, tuple[float | None, float | None]]:
    """(value, (low, high)) of an Estimate-like value; (None, (None, None)) when not one."""
    number = _num(getattr(value, "value", None))
    ci = getattr(value, "ci", None)
    low, high = (ci[0], ci[1]) if ci is not None else (None, None)
    return number, (_num(low), _num(high))


def _draw_series(
    ax: Any, xs: list[float], series: Sequence[tuple[float | None, Any]], **style: Any
) -> int:
    """Points with their interval as error bars (an unbounded end drawn to the point); the
    number of points drawn."""
    pts = [(x, v, ci) for x, (v, ci) in zip(xs, series, strict=True) if v is not None and v > 0]
    if not pts:
        return 0
    x, y = [p[0] for p in pts], [p[1] for p in pts]
    low = [max(v - (ci[0] if ci[0] is not None else v), 0.0) for _, v, ci in pts]
    high = [(ci[1] if ci[1] is not None else v) - v for _, v, ci in pts]
    ax.errorbar(x, y, yerr=[low, high], fmt="o-", ms=5, capsize=3, lw=1.4, **style)
    return len(pts)


def noise_trend_plot(job: ReportJob, rec: Recommendation) -> Plot:
    """B_simple / B_noise over training: an analysis's intermediate checkpoints (by step), or
    a batch sweep's two-batch B_simple per band of evaluation loss."""
    plot = Plot("noise-trend", PLOT_TITLES["noise-trend"], "")
    sweep = job.sweep()
    if job.kind == "sweep" and sweep is not None:
        return _sweep_noise_trend(plot, sweep.b_simple_trend)
    section, why = _computed(rec.batch_size, "batch_size")
    trend = section.trend if isinstance(section, BatchSizeSection) else []
    if not trend:
        note = section.trend_note if isinstance(section, BatchSizeSection) else None
        how = (
            "give measurements.gradient_noise_trend (the noise scales per checkpoint)"
            if job.kind == "plan"
            else "analyze with intermediate checkpoints (or run a batch sweep, whose report "
            "draws its own)"
        )
        plot.empty_reason = note or (
            f"no noise-scale trend: {how}" + (f"; batch_size: {why}" if why else "")
        )
        return plot
    by_step = all(p.step is not None for p in trend)
    xs = [float(p.step) if by_step and p.step is not None else float(i + 1)
          for i, p in enumerate(trend)]  # fmt: skip
    simple = [_estimate(p.b_simple) for p in trend]
    noise = [_estimate(p.b_noise) for p in trend]
    plot.numbers = {
        "x": xs,
        "x_is_step": by_step,
        "checkpoint": [p.checkpoint for p in trend],
        "b_simple": [v for v, _ in simple],
        "b_simple_ci": [ci for _, ci in simple],
        "b_noise": [v for v, _ in noise],
        "b_noise_ci": [ci for _, ci in noise],
    }
    fig, ax = new_figure()
    drawn = _draw_series(ax, xs, simple, color="C0", label="B_simple = tr Σ / |G|²")
    drawn += _draw_series(ax, xs, noise, color="C1", label="B_noise = tr(HΣ) / GᵀHG")
    if not drawn:
        plot.empty_reason = "no checkpoint has a defined B_simple or B_noise (|G|² not significant)"
        return plot
    ax.set_yscale("log")
    ax.set_xlabel("training step (checkpoint metadata)" if by_step else "checkpoint (oldest first)")
    ax.set_ylabel("noise scale B (examples)")
    ax.set_title(plot.title)
    ax.legend(fontsize=8)
    plot.caption = (
        "Per intermediate checkpoint, with intervals; log y axis. The budget evaluates this "
        "trend at the target loss (budget.batch); a late checkpoint's value alone is not the "
        "batch to train at."
    )
    return _finish(plot, fig)


def _sweep_noise_trend(plot: Plot, rows: list[NoiseScaleAtLoss]) -> Plot:
    points = [r for r in rows if _num(r.value) is not None]
    if not points:
        plot.empty_reason = (
            "no two-batch B_simple was defined in any loss band of the sweep's runs (or the "
            "sweep is a data sweep)"
        )
        return plot
    xs = [0.5 * (r.eval_loss_low + r.eval_loss_high) for r in points]
    series: list[tuple[float | None, tuple[float | None, float | None]]] = [
        (r.value, (_num(r.ci[0]), _num(r.ci[1])) if r.ci is not None else (None, None))
        for r in points
    ]
    plot.numbers = {
        "eval_loss": xs,
        "b_simple": [v for v, _ in series],
        "b_simple_ci": [ci for _, ci in series],
        "n_steps": [r.n_steps for r in points],
    }
    fig, ax = new_figure()
    _draw_series(ax, xs, series, color="C0", label="two-batch B_simple of the runs' gradients")
    ax.set_yscale("log")
    ax.invert_xaxis()  # training lowers the loss: progress runs left to right
    ax.set_xlabel("evaluation loss at the window's start (nats per token; training →)")
    ax.set_ylabel("noise scale B_simple (examples)")
    ax.set_title(plot.title)
    ax.legend(fontsize=8)
    plot.caption = (
        "Pooled over the sweep's runs per band of evaluation loss (McCandlish et al. 2018, "
        "App. A), with intervals; log y axis."
    )
    return _finish(plot, fig)


PLOT_BUILDERS: tuple[Callable[[ReportJob, Recommendation], Plot], ...] = (
    delta_curve_plot,
    block_heatmap_plot,
    off_diagonal_plot,
    bounds_plot,
    batch_size_plot,
    loss_vs_data_plot,
    noise_trend_plot,
)
PLOT_IDS = (
    "delta-curve",
    "block-norms",
    "off-diagonal",
    "bounds",
    "batch-size",
    "loss-vs-data",
    "noise-trend",
)
PLOT_TITLES = {
    "delta-curve": "Loss difference Δ_k vs number of samples k",
    "block-norms": "Block Hessian spectral norms ‖H_b‖₂ (layers × sublayers)",
    "off-diagonal": "Off-diagonal block norms ‖H_ij‖₂",
    "bounds": "Measured block norm vs theoretical bound",
    "batch-size": "Steps to target vs batch size (McCandlish et al. 2018)",
    "loss-vs-data": "Loss vs dataset size L(D) = E + A·D^(−β)",
    "noise-trend": "Gradient noise scale over training (McCandlish et al. 2018)",
}


def build_plots(job: JobJson | ReportJob) -> list[Plot]:
    """Every figure of the report, in page order (empty ones carry their reason).

    Only a succeeded job is plotted: the figures show the fits next to their data, and a
    job that did not succeed has no fits (its inputs are in ``request``).
    """
    view = ReportJob.of(job)
    if view.status != "succeeded":
        status = f"the job is {view.status}; plots need a succeeded job"
        return [Plot(pid, PLOT_TITLES[pid], "", status) for pid in PLOT_IDS]
    rec, why = view.recommendation()
    if rec is None:
        return [Plot(pid, PLOT_TITLES[pid], "", why or "no recommendation") for pid in PLOT_IDS]
    return [builder(view, rec) for builder in PLOT_BUILDERS]


def inline_svg(plot: Plot) -> str | None:
    """The SVG element alone (no XML prolog or doctype), with ``id`` = the plot's id, for the
    report page."""
    if plot.svg is None:
        return None
    start = plot.svg.index("<svg")
    body = _METADATA.sub("", plot.svg[start:], count=1)  # RDF names remote vocabularies
    return body.replace("<svg", f'<svg id="{plot.id}" role="img"', 1)
