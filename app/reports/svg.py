"""A small server-side SVG plotting library: axes with linear or log scales, lines, points,
confidence bands, reference lines, categorical dot charts and heatmaps with a colour bar.

Pure Python (no numpy, no JavaScript, no external resources): the output is a standalone
``<svg>`` element that a browser shows offline and a file viewer opens as is. Every
string that reaches the SVG (titles, labels, legend entries, category names) is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 720, 420
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 86, 24, 44, 62
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', sans-serif\""
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def esc(text: object) -> str:
    """Escape text for SVG/HTML content and attribute values (quotes included)."""
    return escape(str(text), quote=True)


def fmt_number(value: float) -> str:
    """A compact tick label: 0.05, 120, 1.5e+06."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        mantissa, exponent = f"{value:.2e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.6g}"


def power_of_ten(exponent: int) -> str:
    """``10⁻³`` for -3."""
    return "10" + str(exponent).translate(SUPERSCRIPT)


# --------------------------------------------------------------------------- scales
@dataclass(frozen=True)
class Scale:
    """Maps data values in [lo, hi] to pixels in [p0, p1] (p1 < p0 for a y axis)."""

    lo: float
    hi: float
    p0: float
    p1: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)) or self.hi <= self.lo:
            raise ValueError(f"scale needs finite lo < hi, got [{self.lo}, {self.hi}]")
        if self.log and self.lo <= 0:
            raise ValueError(f"a log scale needs positive bounds, got lo={self.lo}")

    def _t(self, value: float) -> float:
        return math.log10(value) if self.log else value

    def __call__(self, value: float) -> float:
        a, b = self._t(self.lo), self._t(self.hi)
        return self.p0 + (self._t(value) - a) / (b - a) * (self.p1 - self.p0)

    def contains(self, value: float) -> bool:
        return math.isfinite(value) and (value > 0 or not self.log) and self.lo <= value <= self.hi

    def ticks(self) -> list[tuple[float, str]]:
        return log_ticks(self.lo, self.hi) if self.log else linear_ticks(self.lo, self.hi)


def linear_ticks(lo: float, hi: float, target: int = 6) -> list[tuple[float, str]]:
    """Ticks at 1, 2 or 5 × 10^k steps ("nice numbers"), about ``target`` of them."""
    raw = (hi - lo) / max(1, target - 1)
    exponent = math.floor(math.log10(raw))
    step = min(m * 10**exponent for m in (1, 2, 5, 10) if m * 10**exponent >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    i = first
    while i * step <= hi * (1 + 1e-12) + 1e-12 * step:
        value = i * step
        ticks.append((value, fmt_number(value)))
        i += 1
    return ticks


def log_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """Decades 10^k inside [lo, hi] (every n-th when many); 2× and 5× too when few."""
    k0, k1 = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    decades = list(range(k0, k1 + 1))
    if len(decades) > 8:
        stride = math.ceil(len(decades) / 8)
        decades = [k for k in decades if k % stride == 0]
    ticks = [(10.0**k, power_of_ten(k)) for k in decades]
    if len(ticks) < 3:
        for k in range(k0 - 1, k1 + 1):
            for m in (2, 5):
                v = m * 10.0**k
                if lo <= v <= hi:
                    ticks.append((v, fmt_number(v)))
        ticks.sort()
    return ticks


def data_range(values: Sequence[float], log: bool, pad: float = 0.05) -> tuple[float, float]:
    """[lo, hi] covering ``values`` with a margin (in log space on a log axis)."""
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        raise ValueError("no finite (and, on a log axis, positive) values to plot")
    lo, hi = min(finite), max(finite)
    if log:
        a, b = math.log10(lo), math.log10(hi)
        span = max(b - a, 0.3)
        return 10 ** (a - pad * span - (0.15 if b == a else 0)), 10 ** (
            b + pad * span + (0.15 if b == a else 0)
        )
    span = hi - lo if hi > lo else max(abs(hi), 1.0)
    return lo - pad * span, hi + pad * span


# --------------------------------------------------------------------------- line charts
@dataclass
class Series:
    """One thing drawn on a chart.

    ``kind``: ``line`` (polyline), ``points`` (markers), ``band`` (filled area between
    ``y`` and ``y_hi``).
    """

    label: str
    x: Sequence[float]
    y: Sequence[float]
    kind: str = "line"
    y_hi: Sequence[float] | None = None
    color: str | None = None
    dash: bool = False


@dataclass
class VLine:
    x: float
    label: str
    color: str = "#444"


@dataclass
class Chart:
    """A chart with two numeric axes; ``render()`` returns the ``<svg>`` text."""

    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    vlines: list[VLine] = field(default_factory=list)
    x_log: bool = False
    y_log: bool = False
    width: int = WIDTH
    height: int = HEIGHT
    plot_id: str = "chart"

    def render(self) -> str:
        xs = [v for s in self.series for v in s.x] + [v.x for v in self.vlines]
        ys = [v for s in self.series for v in [*s.y, *(s.y_hi or [])]]
        x0, x1 = data_range(xs, self.x_log)
        y0, y1 = data_range(ys, self.y_log)
        left, right = MARGIN_LEFT, self.width - MARGIN_RIGHT
        top, bottom = MARGIN_TOP, self.height - MARGIN_BOTTOM
        sx = Scale(x0, x1, left, right, self.x_log)
        sy = Scale(y0, y1, bottom, top, self.y_log)
        body = [_frame(self, sx, sy)]
        clip = f"clip-{esc(self.plot_id)}"
        body.append(
            f'<clipPath id="{clip}"><rect x="{left}" y="{top}" width="{right - left}" '
            f'height="{bottom - top}"/></clipPath><g clip-path="url(#{clip})">'
        )
        legend: list[tuple[str, str, str, bool]] = []
        for i, s in enumerate(self.series):
            color = s.color or PALETTE[i % len(PALETTE)]
            body.append(_draw_series(s, sx, sy, color))
            legend.append((s.label, color, s.kind, s.dash))
        for v in self.vlines:
            if sx.contains(v.x):
                px = sx(v.x)
                body.append(
                    f'<line class="vline" x1="{px:.2f}" y1="{top}" x2="{px:.2f}" y2="{bottom}" '
                    f'stroke="{v.color}" stroke-width="1.5" stroke-dasharray="2 3"/>'
                    # written upwards along the line's left side: clear of legend and curves
                    f'<text class="vline-label" x="{px - 5:.2f}" y="{bottom - 24}" '
                    f'font-size="12" {FONT} fill="{v.color}" '
                    f'transform="rotate(-90 {px - 5:.2f} {bottom - 24})">{esc(v.label)}</text>'
                )
        body.append("</g>")
        body.append(_legend(legend, right))
        return _svg(self.width, self.height, self.title, self.plot_id, "".join(body))


def _draw_series(s: Series, sx: Scale, sy: Scale, color: str) -> str:
    pts = [(x, y) for x, y in zip(s.x, s.y, strict=True) if _ok(sx, x) and _ok(sy, y)]
    if s.kind == "band":
        assert s.y_hi is not None
        rows = [
            (x, lo, hi)
            for x, lo, hi in zip(s.x, s.y, s.y_hi, strict=True)
            if _ok(sx, x) and _ok(sy, lo) and _ok(sy, hi)
        ]
        if len(rows) < 2:
            return ""
        upper = [f"{sx(x):.2f},{sy(hi):.2f}" for x, _, hi in rows]
        lower = [f"{sx(x):.2f},{sy(lo):.2f}" for x, lo, _ in reversed(rows)]
        return (
            f'<polygon class="band" points="{" ".join(upper + lower)}" fill="{color}" '
            f'fill-opacity="0.18" stroke="none"><title>{esc(s.label)}</title></polygon>'
        )
    if s.kind == "points":
        return "".join(
            f'<circle class="point" cx="{sx(x):.2f}" cy="{sy(y):.2f}" r="3.2" fill="{color}">'
            f"<title>{esc(s.label)}: ({fmt_number(x)}, {fmt_number(y)})</title></circle>"
            for x, y in pts
        )
    if len(pts) < 2:
        return ""
    dash = ' stroke-dasharray="6 4"' if s.dash else ""
    coords = " ".join(f"{sx(x):.2f},{sy(y):.2f}" for x, y in pts)
    return (
        f'<polyline class="line" points="{coords}" fill="none" stroke="{color}" '
        f'stroke-width="2"{dash}><title>{esc(s.label)}</title></polyline>'
    )


def _ok(scale: Scale, value: float) -> bool:
    return math.isfinite(value) and (value > 0 or not scale.log)


def _frame(chart: Chart, sx: Scale, sy: Scale) -> str:
    left, right = MARGIN_LEFT, chart.width - MARGIN_RIGHT
    top, bottom = MARGIN_TOP, chart.height - MARGIN_BOTTOM
    out = [
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        'fill="#fff" stroke="#888"/>'
    ]
    for value, label in sx.ticks():
        px = sx(value)
        out.append(
            f'<g class="tick x-tick"><line x1="{px:.2f}" y1="{top}" x2="{px:.2f}" y2="{bottom}" '
            f'stroke="#eee"/><line x1="{px:.2f}" y1="{bottom}" x2="{px:.2f}" y2="{bottom + 5}" '
            f'stroke="#888"/><text x="{px:.2f}" y="{bottom + 18}" text-anchor="middle" '
            f'font-size="12" {FONT}>{esc(label)}</text></g>'
        )
    for value, label in sy.ticks():
        py = sy(value)
        out.append(
            f'<g class="tick y-tick"><line x1="{left}" y1="{py:.2f}" x2="{right}" y2="{py:.2f}" '
            f'stroke="#eee"/><line x1="{left - 5}" y1="{py:.2f}" x2="{left}" y2="{py:.2f}" '
            f'stroke="#888"/><text x="{left - 8}" y="{py + 4:.2f}" text-anchor="end" '
            f'font-size="12" {FONT}>{esc(label)}</text></g>'
        )
    out.append(_axis_labels(chart.x_label, chart.y_label, left, right, top, bottom, chart.height))
    return "".join(out)


def _axis_labels(
    x_label: str, y_label: str, left: float, right: float, top: float, bottom: float, height: float
) -> str:
    cy = (top + bottom) / 2
    return (
        f'<text class="x-label" x="{(left + right) / 2:.1f}" y="{height - 16}" '
        f'text-anchor="middle" font-size="13" {FONT}>{esc(x_label)}</text>'
        f'<text class="y-label" x="18" y="{cy:.1f}" text-anchor="middle" font-size="13" {FONT} '
        f'transform="rotate(-90 18 {cy:.1f})">{esc(y_label)}</text>'
    )


def _legend(entries: list[tuple[str, str, str, bool]], right: float) -> str:
    if not entries:
        return ""
    width = 12 + 7 * max(len(label) for label, *_ in entries) + 30
    x = right - width - 8
    y = MARGIN_TOP + 8
    out = [
        f'<g class="legend"><rect x="{x}" y="{y}" width="{width}" height="{18 * len(entries) + 8}" '
        'fill="#fff" fill-opacity="0.85" stroke="#ccc"/>'
    ]
    for i, (label, color, kind, dash) in enumerate(entries):
        ly = y + 16 + 18 * i
        if kind == "band":
            mark = (
                f'<rect x="{x + 8}" y="{ly - 7}" width="22" height="10" fill="{color}" '
                'fill-opacity="0.25"/>'
            )
        elif kind == "points":
            mark = f'<circle cx="{x + 19}" cy="{ly - 2}" r="3.2" fill="{color}"/>'
        else:
            d = ' stroke-dasharray="6 4"' if dash else ""
            mark = (
                f'<line x1="{x + 8}" y1="{ly - 2}" x2="{x + 30}" y2="{ly - 2}" stroke="{color}" '
                f'stroke-width="2"{d}/>'
            )
        out.append(
            f'{mark}<text x="{x + 36}" y="{ly + 2}" font-size="12" {FONT}>{esc(label)}</text>'
        )
    out.append("</g>")
    return "".join(out)


def _svg(width: int, height: int, title: str, plot_id: str, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{esc(plot_id)}" class="plot" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(title)}"><title>{esc(title)}</title>'
        f'<rect width="{width}" height="{height}" fill="#fafafa"/>'
        f'<text class="title" x="{width / 2:.1f}" y="24" text-anchor="middle" font-size="15" '
        f'font-weight="600" {FONT}>{esc(title)}</text>{body}</svg>'
    )


# --------------------------------------------------------------------------- categorical dots
@dataclass
class DotSeries:
    label: str
    values: Sequence[float | None]  # one per category; None = nothing to draw
    color: str | None = None
    marker: str = "circle"  # or "triangle"


@dataclass
class DotChart:
    """Categories along x, a numeric (usually log) y: measured vs bound per block."""

    title: str
    x_label: str
    y_label: str
    categories: Sequence[str]
    series: list[DotSeries]
    y_log: bool = True
    width: int = WIDTH
    height: int = 460
    plot_id: str = "dots"

    def render(self) -> str:
        ys = [v for s in self.series for v in s.values if v is not None]
        y0, y1 = data_range(ys, self.y_log)
        left, right = MARGIN_LEFT, self.width - MARGIN_RIGHT
        top, bottom = MARGIN_TOP, self.height - MARGIN_BOTTOM - 50
        sy = Scale(y0, y1, bottom, top, self.y_log)
        n = len(self.categories)
        step = (right - left) / max(n, 1)
        out = [
            f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
            'fill="#fff" stroke="#888"/>'
        ]
        for value, label in sy.ticks():
            py = sy(value)
            out.append(
                f'<g class="tick y-tick"><line x1="{left}" y1="{py:.2f}" x2="{right}" '
                f'y2="{py:.2f}" stroke="#eee"/><text x="{left - 8}" y="{py + 4:.2f}" '
                f'text-anchor="end" font-size="12" {FONT}>{esc(label)}</text></g>'
            )
        for i, category in enumerate(self.categories):
            cx = left + step * (i + 0.5)
            out.append(
                f'<text class="tick x-tick" x="{cx:.1f}" y="{bottom + 10}" font-size="11" {FONT} '
                f'text-anchor="end" transform="rotate(-45 {cx:.1f} {bottom + 10})">'
                f"{esc(category)}</text>"
            )
        legend = []
        for j, s in enumerate(self.series):
            color = s.color or PALETTE[j % len(PALETTE)]
            legend.append((s.label, color, "points", False))
            for i, value in enumerate(s.values):  # type: ignore[assignment]
                if value is None or not _ok(sy, value):
                    continue
                cx = left + step * (i + 0.5) + (j - (len(self.series) - 1) / 2) * 7
                cy = sy(value)
                name = f"{self.categories[i]} {s.label}"
                tip = f"<title>{esc(name)}: {fmt_number(value)}</title>"
                if s.marker == "triangle":
                    out.append(
                        f'<polygon class="point" points="{cx:.2f},{cy - 5:.2f} {cx - 4.5:.2f},'
                        f'{cy + 3.5:.2f} {cx + 4.5:.2f},{cy + 3.5:.2f}" fill="{color}">{tip}'
                        "</polygon>"
                    )
                else:
                    out.append(
                        f'<circle class="point" cx="{cx:.2f}" cy="{cy:.2f}" r="3.6" '
                        f'fill="{color}">{tip}</circle>'
                    )
        out.append(
            _axis_labels(self.x_label, self.y_label, left, right, top, bottom + 40, self.height)
        )
        out.append(_legend(legend, right))
        return _svg(self.width, self.height, self.title, self.plot_id, "".join(out))


# --------------------------------------------------------------------------- heatmaps
VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def colour(t: float) -> str:
    """Viridis-like colour for t in [0, 1] (piecewise-linear between five anchors)."""
    t = min(1.0, max(0.0, t))
    pos = t * (len(VIRIDIS) - 1)
    i = min(int(pos), len(VIRIDIS) - 2)
    f = pos - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(VIRIDIS[i], VIRIDIS[i + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


@dataclass
class Heatmap:
    """A matrix of non-negative values as coloured cells (log colour scale by default)."""

    title: str
    x_label: str
    y_label: str
    row_labels: Sequence[str]
    col_labels: Sequence[str]
    values: Sequence[Sequence[float | None]]
    colour_label: str
    log: bool = True
    plot_id: str = "heatmap"
    cell: int = 0  # 0: fit the default width

    def render(self) -> str:
        n_rows, n_cols = len(self.row_labels), len(self.col_labels)
        label_w = 14 + 7 * max((len(r) for r in self.row_labels), default=4)
        label_h = 14 + 6 * max((len(c) for c in self.col_labels), default=4)
        cell = self.cell or max(14, min(56, (WIDTH - label_w - 150) // max(n_cols, 1)))
        left, top = 40 + label_w, MARGIN_TOP + 6
        width = left + cell * n_cols + 130
        height = top + cell * n_rows + label_h + 40
        flat = [v for row in self.values for v in row if v is not None and math.isfinite(v)]
        positive = [v for v in flat if v > 0]
        use_log = self.log and bool(positive)
        if use_log:
            lo, hi = min(positive), max(positive)
        else:
            lo, hi = (min(flat), max(flat)) if flat else (0.0, 1.0)
        if hi <= lo:  # one distinct value: widen so the scale is defined
            hi = lo * 10.0 if use_log else lo + 1.0
        scale = Scale(lo, hi, 0.0, 1.0, use_log)
        out = []
        for i, row in enumerate(self.values):
            for j, value in enumerate(row):
                x, y = left + j * cell, top + i * cell
                name = f"{self.row_labels[i]} × {self.col_labels[j]}"
                if value is None or not math.isfinite(value):
                    out.append(
                        f'<rect class="cell missing" x="{x}" y="{y}" width="{cell}" '
                        f'height="{cell}" fill="#ddd" stroke="#fff"><title>{esc(name)}: not '
                        "measured</title></rect>"
                    )
                    continue
                t = scale(value) if (value > 0 or not use_log) else 0.0
                out.append(
                    f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                    f'fill="{colour(t)}" stroke="#fff"><title>{esc(name)}: {fmt_number(value)}'
                    "</title></rect>"
                )
        for i, label in enumerate(self.row_labels):
            out.append(
                f'<text class="row-label" x="{left - 6}" y="{top + i * cell + cell / 2 + 4:.1f}" '
                f'text-anchor="end" font-size="12" {FONT}>{esc(label)}</text>'
            )
        base = top + n_rows * cell + 8
        for j, label in enumerate(self.col_labels):
            cx = left + j * cell + cell / 2
            out.append(
                f'<text class="col-label" x="{cx:.1f}" y="{base:.1f}" text-anchor="end" '
                f'font-size="12" {FONT} transform="rotate(-45 {cx:.1f} {base:.1f})">'
                f"{esc(label)}</text>"
            )
        out.append(
            f'<text class="x-label" x="{left + cell * n_cols / 2:.1f}" y="{height - 10}" '
            f'text-anchor="middle" font-size="13" {FONT}>{esc(self.x_label)}</text>'
            f'<text class="y-label" x="16" y="{top + cell * n_rows / 2:.1f}" text-anchor="middle" '
            f'font-size="13" {FONT} transform="rotate(-90 16 {top + cell * n_rows / 2:.1f})">'
            f"{esc(self.y_label)}</text>"
        )
        out.append(self._colour_bar(left + cell * n_cols + 24, top, max(cell * n_rows, 120), scale))
        return _svg(width, height, self.title, self.plot_id, "".join(out))

    def _colour_bar(self, x: float, top: float, height: float, scale: Scale) -> str:
        steps = 32
        h = height / steps
        out = [f'<g class="colour-bar"><title>{esc(self.colour_label)}</title>']
        for k in range(steps):
            t = 1 - (k + 0.5) / steps
            out.append(
                f'<rect x="{x}" y="{top + k * h:.2f}" width="14" height="{h + 0.5:.2f}" '
                f'fill="{colour(t)}"/>'
            )
        bar_scale = Scale(scale.lo, scale.hi, top + height, top, scale.log)
        for value, label in bar_scale.ticks():
            py = bar_scale(value)
            out.append(
                f'<line x1="{x + 14}" y1="{py:.2f}" x2="{x + 18}" y2="{py:.2f}" stroke="#444"/>'
                f'<text x="{x + 21}" y="{py + 4:.2f}" font-size="11" {FONT}>{esc(label)}</text>'
            )
        cy = top + height / 2
        out.append(
            f'<text class="colour-label" x="{x + 84}" y="{cy:.1f}" text-anchor="middle" '
            f'font-size="12" {FONT} transform="rotate(-90 {x + 84} {cy:.1f})">'
            f"{esc(self.colour_label)}</text></g>"
        )
        return "".join(out)
