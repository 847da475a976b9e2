"""Figures are drawn once per succeeded job and kept in ``job_plot``.

A succeeded job never changes, so its figures never go stale; rows drawn by another
renderer version (``plots.RENDERER``) are drawn again. Two requests that race on a job
both draw and the second upsert wins with the same content.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from curvplan_server.reports.models import JobPlot
from curvplan_server.reports.plots import PLOT_IDS, RENDERER, Plot, build_plots
from curvplan_server.reports.view import ReportJob


def _from_row(row: Any, with_png: bool) -> Plot:
    return Plot(
        id=row.name,
        title=row.title,
        caption=row.caption,
        empty_reason=row.empty_reason,
        numbers=row.numbers,
        svg=row.svg,
        png=row.png if with_png else None,
    )


def cached_plots(
    session: Session, job_id: uuid.UUID, *, with_png: bool = False
) -> list[Plot] | None:
    """The kept figures of a job in page order, or None when none (or stale ones) are kept."""
    t = JobPlot.__table__.c
    columns = [t.name, t.renderer, t.title, t.caption, t.empty_reason, t.numbers, t.svg]
    if with_png:
        columns.append(t.png)
    rows = session.execute(select(*columns).where(t.job_id == job_id).order_by(t.position)).all()
    if [r.name for r in rows] != list(PLOT_IDS) or any(r.renderer != RENDERER for r in rows):
        return None
    return [_from_row(r, with_png) for r in rows]


def job_plots(session: Session, job: ReportJob, *, with_png: bool = False) -> list[Plot]:
    """Every figure of ``job`` (as the API shows it): the kept ones, else drawn now and kept.

    Jobs that have not succeeded are not drawn (every figure carries the reason) and
    nothing is kept for them.
    """
    if job.status != "succeeded":
        return build_plots(job)
    job_id = uuid.UUID(str(job.id))
    kept = cached_plots(session, job_id, with_png=with_png)
    if kept is not None:
        return kept
    plots = build_plots(job)
    store_plots(session, job_id, plots)
    session.commit()
    return plots


def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as None (JSONB has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def store_plots(session: Session, job_id: uuid.UUID, plots: list[Plot]) -> None:
    """Keep ``plots`` (in page order) as the figures of ``job_id``, replacing older ones."""
    for position, plot in enumerate(plots):
        values = {
            "job_id": job_id,
            "name": plot.id,
            "position": position,
            "renderer": RENDERER,
            "title": plot.title,
            "caption": plot.caption,
            "empty_reason": plot.empty_reason,
            "numbers": _json_safe(plot.numbers),
            "svg": plot.svg,
            "png": plot.png,
        }
        stmt = insert(JobPlot).values(**values)
        update = {k: stmt.excluded[k] for k in values if k not in ("job_id", "name")}
        session.execute(stmt.on_conflict_do_update(index_elements=["job_id", "name"], set_=update))
