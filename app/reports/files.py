"""``curvplan report JOB --out DIR``: the report's plots and numbers as files.

Writes ``<plot>.svg`` for every plot that has data, ``report.html`` (the same page the
service serves) and ``numbers.json`` (the recommendation and every plotted number,
with the reason for each empty plot). PNG is not written: rasterising SVG needs a
renderer (cairo, a browser) that curvplan does not depend on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from curvplan_server.reports.page import render_report
from curvplan_server.reports.plots import build_plots, recommendation_of


def report_numbers(job: dict[str, Any], plots: list[Any]) -> dict[str, Any]:
    return {
        "job": {k: job.get(k) for k in ("id", "kind", "status", "name", "tags", "finished_at")},
        "recommendation": recommendation_of(job),
        "plots": {
            p.id: {
                "title": p.title,
                "file": f"{p.id}.svg" if p.svg is not None else None,
                "caption": p.caption,
                "empty_reason": p.empty_reason,
                "numbers": p.numbers,
            }
            for p in plots
        },
    }


def write_report_files(job: dict[str, Any], out: Path) -> list[Path]:
    """Write the report of ``job`` (its API JSON) under ``out``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    plots = build_plots(job)
    written = []
    for plot in plots:
        if plot.svg is not None:
            path = out / f"{plot.id}.svg"
            path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n' + plot.svg, "utf-8")
            written.append(path)
    html = out / "report.html"
    html.write_text(render_report(job, plots), "utf-8")
    numbers = out / "numbers.json"
    numbers.write_text(
        json.dumps(report_numbers(job, plots), indent=2, ensure_ascii=False, allow_nan=False),
        "utf-8",
    )
    return [*written, html, numbers]
