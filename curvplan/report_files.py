"""Download a job's report as files: the page, every figure (SVG and PNG) and the numbers.

The service draws the figures (``GET /v1/jobs/{id}/plots/{name}.{svg,png}``); the client
only downloads them, so it needs no plotting library. Used by ``curvplan report --out`` and
by the MLflow logging (``curvplan.integrations.mlflow``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from pydantic import JsonValue

from curvplan.client import Client
from curvplan.client import models as m
from curvplan.headline import headline_dict


class PlotNumbers(TypedDict):
    """One figure in ``numbers.json``."""

    title: str
    files: list[str] | None
    caption: str
    empty_reason: str | None
    numbers: dict[str, JsonValue]  # PlotInfo.numbers: what the service's figure draws


class ReportNumbers(TypedDict):
    """``numbers.json``: the job's summary and recommendation as their JSON, the headline
    numbers by stable name, every figure's numbers by figure id."""

    job: dict[str, JsonValue]  # part of the JobOut, as its JSON
    recommendation: dict[str, JsonValue] | None  # the Recommendation as its JSON
    headline: dict[str, float]
    plots: dict[str, PlotNumbers]


def report_numbers(job: m.JobOut, plots: m.PlotList) -> ReportNumbers:
    """``numbers.json``: the job, its recommendation, the headline numbers and every figure's
    numbers (with the reason for each empty figure)."""
    headline: dict[str, float] = {}
    try:
        rec = m.job_recommendation(job)
    except ValueError:  # a recommendation of another contract version: numbers only
        rec = None
    if rec is not None:
        headline = headline_dict(rec)
    summary = job.model_dump(mode="json", include={"id", "kind", "status", "name", "tags"})
    summary["finished_at"] = job.finished_at.isoformat() if job.finished_at else None
    return {
        "job": summary,
        "recommendation": rec.model_dump(mode="json") if rec is not None else None,
        "headline": headline,
        "plots": {
            p.id: {
                "title": p.title,
                "files": [f"{p.id}.svg", f"{p.id}.png"] if p.files is not None else None,
                "caption": p.caption,
                "empty_reason": p.empty_reason,
                "numbers": p.numbers,
            }
            for p in plots.plots
        },
    }


def download_report(client: Client, job_id: str, out: Path) -> list[Path]:
    """Write ``report.html``, ``<plot>.svg``/``<plot>.png`` for every drawn figure and
    ``numbers.json`` under ``out``; return the paths written."""
    job = client.get_job(job_id)
    plots = client.list_plots(job.id)
    html = client.get_report_html(job.id)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for plot in plots.plots:
        if plot.files is None:
            continue
        for fmt in ("svg", "png"):
            path = out / f"{plot.id}.{fmt}"
            path.write_bytes(client.get_plot(job.id, plot.id, fmt))
            written.append(path)
    page = out / "report.html"
    page.write_text(html, "utf-8")
    numbers = out / "numbers.json"
    numbers.write_text(
        json.dumps(report_numbers(job, plots), indent=2, ensure_ascii=False, allow_nan=False),
        "utf-8",
    )
    return [*written, page, numbers]
