"""The job as the report reads it: typed, and lenient.

The page and the figures render a job as the API shows it (``JobOut`` dumped to JSON), a job
stored by an older version, or a partial one (tests, a failed job without a result). So every
field has a default and unknown fields are ignored; what the report draws is then read from
typed models, never by key: the recommendation as the contract's
:class:`~curvplan.types.planner.Recommendation`, a sweep's branch table as
:class:`~curvplan.types.sweep.BranchResult`, and the planner's tables and the engine's
per-block numbers as the rows below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from curvplan.types.jobs import JobError
from curvplan.types.planner import Recommendation
from curvplan.types.sweep import BranchResult, NoiseScaleAtLoss

#: A job as JSON (``JobOut.model_dump(mode="json")``, or a stored row's columns).
JobJson = Mapping[str, JsonValue]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


_M = TypeVar("_M", bound=_Lenient)


class StepsRow(_Lenient):
    """One row of a steps_to_target table."""

    batch_size: float | None = None
    steps: float | None = None


class DataRow(_Lenient):
    """One row of a loss_vs_data table."""

    n_samples: float | None = None
    loss: float | None = None


class BlockBound(_Lenient):
    """A block's theoretical norm bound as the engine stores it."""

    value: float | None = None
    applicable: bool = True
    reason: str | None = None


class BlockRow(_Lenient):
    """One block's curvature: the engine's, the planner inputs', or the recommendation's."""

    name: str = ""
    spectral_norm: float | None = None
    bound: BlockBound | None = None


class OffDiagonalRow(_Lenient):
    """‖H_ij‖₂ of one measured pair of blocks."""

    row: str = ""
    col: str = ""
    sigma_max: float | None = None


class Tables(_Lenient):
    """The planner tables and engine measurements a figure draws (each may be absent)."""

    steps_to_target: list[StepsRow] | None = None
    loss_vs_data: list[DataRow] | None = None
    blocks: list[BlockRow] | None = None
    off_diagonal: list[OffDiagonalRow] | None = None


class ReportSweep(_Lenient):
    """What the report draws of a sweep's result."""

    b_simple_trend: list[NoiseScaleAtLoss] = Field(default_factory=list)
    branch: BranchResult | None = None


class PlannerFields(_Lenient):
    fields: dict[str, JsonValue] = Field(default_factory=dict)


class ReportResult(_Lenient):
    recommendation: dict[str, JsonValue] | None = None
    measurements: dict[str, JsonValue] | None = None
    planner_inputs: PlannerFields | None = None
    sweep: dict[str, JsonValue] | None = None


class ReportChild(_Lenient):
    id: str | None = None
    name: str | None = None
    status: str | None = None
    attempt: int | None = None
    error_type: str | None = None


class ReportJob(_Lenient):
    """The job's fields the report shows (timestamps as the API writes them)."""

    id: str | None = None
    kind: str = ""
    status: str = ""
    name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    attempt: int | None = None
    max_attempts: int | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    error: JobError | None = None
    request: dict[str, JsonValue] | None = None
    result: ReportResult | None = None
    children: list[ReportChild] = Field(default_factory=list)

    @field_validator("children", mode="before")
    @classmethod
    def _no_children_listed(cls, value: object) -> object:
        """A job read without its children (the API's ``children: null``) shows none."""
        return [] if value is None else value

    @classmethod
    def of(cls, job: JobJson | ReportJob) -> ReportJob:
        return job if isinstance(job, ReportJob) else cls.model_validate(job)

    def recommendation(self) -> tuple[Recommendation | None, str | None]:
        """(the recommendation as the contract's model, None) or (None, why there is none)."""
        raw = self.result.recommendation if self.result is not None else None
        if raw is None:
            return None, "the job has no recommendation yet (it has not succeeded)"
        try:
            return Recommendation.model_validate(raw), None
        except ValidationError as exc:
            return None, (
                f"the recommendation does not match the current contract: {exc.errors()[0]}"
            )

    def planner_tables(self) -> Tables:
        """The planner's measurement tables: the plan request's, the analyze result's, or
        what a sweep measured and fitted (its steps_to_target or loss_vs_data table)."""
        request = self.request or {}
        measurements = request.get("measurements")
        if isinstance(measurements, dict):
            return _read(Tables, measurements)
        result = self.result or ReportResult()
        if result.planner_inputs is not None:
            return _read(Tables, result.planner_inputs.fields)
        if self.kind == "sweep" and result.measurements is not None:
            return _read(Tables, result.measurements)
        return Tables()

    def engine(self) -> Tables:
        """The curvature engine's per-block numbers of an analyze job (blocks, off-diagonal)."""
        measured = self.result.measurements if self.result is not None else None
        return _read(Tables, measured) if measured is not None else Tables()

    def measured(self) -> dict[str, JsonValue] | None:
        """The engine's measurements as stored (for the model's description)."""
        return self.result.measurements if self.result is not None else None

    def sweep(self) -> ReportSweep | None:
        """A sweep's trend and branch table (None: not a sweep's result)."""
        raw = self.result.sweep if self.result is not None else None
        return None if raw is None else _read(ReportSweep, raw)


def _read(model: type[_M], raw: Mapping[str, JsonValue]) -> _M:
    """``raw`` as ``model``; the model's defaults (nothing to draw) when a stored result of
    another version does not fit it, so that the rest of the report still renders."""
    try:
        return model.model_validate(raw)
    except ValidationError:
        return model()
