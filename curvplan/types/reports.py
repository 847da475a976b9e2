"""Response models of a job's figures (``GET /v1/jobs/{id}/plots``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

PLOT_FORMATS: tuple[Literal["svg", "png"], ...] = ("svg", "png")


class PlotFiles(BaseModel):
    """Paths of one drawn figure, relative to the service root."""

    svg: str
    png: str


class PlotInfo(BaseModel):
    """One figure of the report: drawn (``files``) or empty (``empty_reason``)."""

    id: str = Field(description="Stable name, e.g. 'delta-curve', 'batch-size'.")
    title: str
    caption: str
    empty_reason: str | None = Field(None, description="Why the figure has no data.")
    files: PlotFiles | None = None
    numbers: dict[str, Any] = Field(
        default_factory=dict, description="Every number the figure draws."
    )


class PlotList(BaseModel):
    job_id: str
    plots: list[PlotInfo]
