"""Unit tests of the SVG renderer: scales, ticks, geometry, colours and escaping."""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from curvplan_server.reports.svg import (
    MARGIN_LEFT,
    MARGIN_TOP,
    VIRIDIS,
    Chart,
    DotChart,
    DotSeries,
    Heatmap,
    Scale,
    Series,
    VLine,
    colour,
    data_range,
    linear_ticks,
    log_ticks,
    power_of_ten,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # raises on malformed XML


def test_log_scale_maps_decades_evenly() -> None:
    s = Scale(1, 1000, 0, 300, log=True)
    assert [s(v) for v in (1, 10, 100, 1000)] == pytest.approx([0, 100, 200, 300])
    y = Scale(0.01, 1, 400, 100, log=True)  # y axes run upwards
    assert y(0.1) == pytest.approx(250)


def test_linear_scale_and_invalid_bounds() -> None:
    assert Scale(-1, 1, 0, 200)(0) == pytest.approx(100)
    with pytest.raises(ValueError):
        Scale(1, 1, 0, 10)
    with pytest.raises(ValueError):
        Scale(0, 10, 0, 10, log=True)


def test_log_ticks_are_powers_of_ten_with_superscript_labels() -> None:
    ticks = log_ticks(3e-4, 2e2)
    assert [v for v, _ in ticks] == pytest.approx([1e-3, 1e-2, 1e-1, 1, 10, 100])
    assert [label for _, label in ticks] == ["10⁻³", "10⁻²", "10⁻¹", "10⁰", "10¹", "10²"]
    assert power_of_ten(-12) == "10⁻¹²"


def test_log_ticks_on_a_narrow_range_add_2_and_5() -> None:
    values = [v for v, _ in log_ticks(3, 40)]
    assert values == pytest.approx([5, 10, 20])


def test_log_ticks_thin_out_many_decades() -> None:
    ticks = log_ticks(1e-20, 1e20)
    assert 4 <= len(ticks) <= 9
    assert all(math.log10(v) == pytest.approx(round(math.log10(v))) for v, _ in ticks)


@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(1e-6, 1e6, allow_nan=False),
)
def test_linear_ticks_are_nice_evenly_spaced_and_inside(lo: float, span: float) -> None:
    span = max(span, 1e-4 * abs(lo))  # plots never span less than 1e-4 of their offset
    hi = lo + span
    ticks = [v for v, _ in linear_ticks(lo, hi)]
    assert 2 <= len(ticks) <= 12
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    step = ticks[1] - ticks[0]
    assert all(abs(d - step) <= 1e-6 * max(1.0, abs(step)) for d in steps)
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 5, 10))
    tol = 1e-9 * max(1.0, abs(lo), abs(hi))
    assert all(lo - tol <= v <= hi + tol for v in ticks)


def test_data_range_needs_plottable_values() -> None:
    with pytest.raises(ValueError):
        data_range([-1.0, 0.0, float("nan")], log=True)
    lo, hi = data_range([10.0, 1000.0], log=True)
    assert lo < 10 and hi > 1000


def test_chart_places_points_on_the_log_axes() -> None:
    chart = Chart(
        "t",
        "samples k (count)",
        "Δ (loss)",
        [Series("pts", [1, 10, 100], [1, 0.1, 0.01], kind="points")],
        x_log=True,
        y_log=True,
        plot_id="p",
    )
    root = parse(chart.render())
    circles = root.findall(f".//{SVG}circle[@class='point']")
    xs = [float(c.get("cx")) for c in circles]
    ys = [float(c.get("cy")) for c in circles]
    # equal ratios in data → equal pixel steps; x grows right, y (falling data) goes down
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.02)
    assert ys[1] - ys[0] == pytest.approx(ys[2] - ys[1], abs=0.02) and ys[2] > ys[0]
    assert xs[0] > MARGIN_LEFT and ys[0] > MARGIN_TOP
    labels = {
        e.get("class"): "".join(e.itertext())
        for e in root.iter(f"{SVG}text")
        if e.get("class") in ("x-label", "y-label", "title")
    }
    assert labels == {"x-label": "samples k (count)", "y-label": "Δ (loss)", "title": "t"}
    x_ticks = ["".join(t.itertext()) for t in root.findall(f".//{SVG}g[@class='tick x-tick']")]
    assert x_ticks == ["10⁰", "10¹", "10²"]


def test_band_line_vline_and_legend() -> None:
    xs = [1.0, 2.0, 3.0]
    chart = Chart(
        "t",
        "x (u)",
        "y (u)",
        [
            Series("band", xs, [1, 2, 3], kind="band", y_hi=[2, 3, 4]),
            Series("fit", xs, [1.5, 2.5, 3.5], dash=True),
        ],
        [VLine(2.0, "B_crit = 2")],
        plot_id="c",
    )
    root = parse(chart.render())
    band = root.find(f".//{SVG}polygon[@class='band']")
    assert band is not None and len(band.get("points").split()) == 6
    line = root.find(f".//{SVG}polyline[@class='line']")
    assert line is not None and line.get("stroke-dasharray") == "6 4"
    assert root.find(f".//{SVG}line[@class='vline']") is not None
    legend = "".join(root.find(f".//{SVG}g[@class='legend']").itertext())
    assert "band" in legend and "fit" in legend


def test_user_strings_are_escaped() -> None:
    evil = '<script>alert("x")</script> & "quotes"'
    chart = Chart(evil, evil, evil, [Series(evil, [1, 2], [1, 2])], plot_id=evil)
    svg = chart.render()
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    root = parse(svg)
    assert root.get("id") == evil  # attribute round-trips exactly
    heat = Heatmap(evil, "x", "y", [evil], [evil], [[1.0]], evil, plot_id="h").render()
    dots = DotChart(evil, "x", "y", [evil], [DotSeries(evil, [1.0])], plot_id="d").render()
    for text in (heat, dots):
        assert "<script>" not in text
        parse(text)


def test_colour_scale_endpoints_and_monotone_brightness() -> None:
    assert colour(0) == "#{:02x}{:02x}{:02x}".format(*VIRIDIS[0])
    assert colour(1) == "#{:02x}{:02x}{:02x}".format(*VIRIDIS[-1])
    assert colour(-3) == colour(0) and colour(7) == colour(1)
    lum = [sum(int(colour(t / 10)[i : i + 2], 16) for i in (1, 3, 5)) for t in range(11)]
    assert lum[-1] > lum[0]


def test_heatmap_cells_follow_the_log_scale_and_mark_missing() -> None:
    values = [[1.0, 10.0, 100.0], [None, 1000.0, float("nan")]]
    heat = Heatmap("h", "sublayer", "layer", ["l0", "l1"], ["a", "b", "c"], values, "‖H‖ (u)")
    root = parse(heat.render())
    cells = root.findall(f".//{SVG}rect")
    measured = [c for c in cells if c.get("class") == "cell"]
    missing = [c for c in cells if c.get("class") == "cell missing"]
    assert len(measured) == 4 and len(missing) == 2
    fills = [c.get("fill") for c in measured]  # 1, 10, 100, 1000 → t = 0, 1/3, 2/3, 1
    assert fills == [colour(0), colour(1 / 3), colour(2 / 3), colour(1)]
    titles = ["".join(c.itertext()) for c in measured]
    assert titles[1] == "l0 × b: 10"
