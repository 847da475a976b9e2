"""An analysis's ``sweeps``: finished sweep jobs of the project read into planner fields.

Several sweeps of one type that measured the same setup are combined into one table
(docs/budget.md#data-sweep): the data sweeps' L(D) points (a next round run as its own sweep
beside the first) and the batch sweeps' steps to target. Sweeps of one type but different
setups are refused, naming ``sweeps.i`` and the setting that differs: a table mixing them
would fit one curve through two experiments. A branch sweep's critical batch per checkpoint
is one run's schedule: the last branch sweep given is used.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from curvplan.types.jobs import SweepJobCreate
from curvplan.types.planner import LossPoint, StepsPoint
from curvplan_worker.errors import JobError

DATA_SETUP = ("batch_size", "epochs", "min_steps", "max_steps", "schedule", "cooldown_fraction")
"""The data sweep's settings (besides model, artifacts and optimizer) that change L(D): the
batch size and the steps rule (epochs, floor, cap) and decayed schedule of every run.
``init_seed`` is left out: two seeds of one setup are two draws of the same curve."""

BATCH_SETUP = ("target_loss",)
"""The batch sweep's setting that changes its steps-to-target table: the target loss."""

#: A sweep's request as stored, compared setting by setting (:func:`sweep_setup`): JSON on
#: purpose, since a request an older version stored may no longer validate as SweepJobCreate.
StoredRequest = dict[str, JsonValue]


class LossRow(TypedDict):
    """A point of the combined L(D) table (the planner's ``LossPoint``, as JSON)."""

    n_samples: float
    loss: float


class StepsRow(TypedDict):
    """A row of the combined steps-to-target table (the planner's ``StepsPoint``, as JSON)."""

    batch_size: int
    steps: float
    steps_uncertainty: NotRequired[float | None]


class SweepMeasurements(TypedDict, total=False):
    """A sweep job's ``result.measurements``: the planner's ``Measurements`` fields it gives
    an analysis that lists it in ``sweeps``, as JSON."""

    loss_vs_data: list[LossRow]
    steps_to_target: list[StepsRow]
    # A branch sweep's BranchedCriticalBatch as JSON (its model_dump): passed through to the
    # planner, whose Measurements validates it with the rest.
    branched_critical_batch: dict[str, JsonValue]
    tokens_per_example: float


class SweepFields(SweepMeasurements, total=False):
    """The planner's ``Measurements`` fields an analysis takes from its sweeps, as JSON."""

    steps_to_target_loss: float


@dataclass
class SweepInputs:
    """The planner fields the sweeps give, the target loss they imply, which sweep ids each
    table came from and notes for the analysis's result."""

    fields: SweepFields = field(default_factory=lambda: SweepFields())
    target_loss: float | None = None
    used: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class _StoredSweep(BaseModel):
    """What an analysis reads of a sweep job's ``result.sweep``."""

    type: str | None = None
    target_loss: float | None = None
    tokens_per_example: float | None = None


class _StoredMeasurements(BaseModel):
    """A sweep job's ``result.measurements``: the planner measurements it gives an analysis
    (the planner's own row models, as the sweep wrote them)."""

    loss_vs_data: list[LossPoint] | None = None
    steps_to_target: list[StepsPoint] | None = None
    branched_critical_batch: dict[str, JsonValue] | None = None  # see SweepMeasurements


class _StoredSweepResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    sweep: _StoredSweep = Field(default_factory=_StoredSweep)
    measurements: _StoredMeasurements = Field(default_factory=_StoredMeasurements)


@dataclass
class _Sweep:
    index: int
    job_id: str
    type: str
    request: StoredRequest
    measured: _StoredMeasurements
    sweep: _StoredSweep


def read_sweeps(engine: Any, project_id: uuid.UUID, sweeps: list[uuid.UUID]) -> SweepInputs:
    """The planner's fields from the finished sweep jobs ``sweeps`` of the project: the batch
    sweeps' steps to target (their target as ``steps_to_target_loss``, the loss budget.batch
    answers), the data sweeps' L(D) and the branch sweep's critical batch per checkpoint;
    the target loss used when targets.target_loss is not given is the last data sweep's (the
    loss budget.data answers), else the last batch sweep's. Errors name ``sweeps.i``."""
    loaded = [_load(engine, project_id, i, sweep_id) for i, sweep_id in enumerate(sweeps)]
    out = SweepInputs()
    batch = [s for s in loaded if s.type == "batch" and s.measured.steps_to_target is not None]
    if batch:
        _same_setup(batch)
        steps, repeated = combine_steps_to_target(s.measured.steps_to_target or [] for s in batch)
        out.fields["steps_to_target"] = steps
        _combined(out, "steps_to_target", batch, len(steps), repeated)
    data = [s for s in loaded if s.type == "data" and s.measured.loss_vs_data is not None]
    if data:
        _same_setup(data)
        losses, repeated = combine_loss_vs_data(s.measured.loss_vs_data or [] for s in data)
        out.fields["loss_vs_data"] = losses
        _combined(out, "loss_vs_data", data, len(losses), repeated)
    branch = [
        s for s in loaded if s.type == "branch" and s.measured.branched_critical_batch is not None
    ]
    if branch and (branched := branch[-1].measured.branched_critical_batch) is not None:
        out.fields["branched_critical_batch"] = branched
        out.used["branched_critical_batch"] = [branch[-1].job_id]
    for s in loaded:
        if s.sweep.tokens_per_example:
            out.fields["tokens_per_example"] = s.sweep.tokens_per_example
        swept = s.sweep.target_loss
        if swept is not None and s.type == "batch":
            out.fields["steps_to_target_loss"] = swept  # budget.batch answers this loss
        # budget.data answers the data sweep's target; the batch sweep's only without one
        if swept is not None and (out.target_loss is None or s.type == "data"):
            out.target_loss = swept
    return out


def _combined(
    out: SweepInputs, key: str, group: list[_Sweep], points: int, repeated: list[int]
) -> None:
    """Record which sweeps a table came from (and, when several, a note saying so)."""
    out.used[key] = [s.job_id for s in group]
    if len(group) > 1:
        out.notes.append(
            f"{key}: {points} points combined from {len(group)} {group[0].type} sweeps of one "
            f"setup ({', '.join(f'sweeps.{s.index}' for s in group)})"
            + (f"; measured twice or more, averaged: {repeated}" if repeated else "")
        )


def combine_loss_vs_data(tables: Iterable[list[LossPoint]]) -> tuple[list[LossRow], list[int]]:
    """One L(D) table from the tables of data sweeps of one setup, by size; a size measured
    by more than one sweep gets the mean of their losses (returned: those sizes).

    The mean, not the lower loss: the setups are the same (lr grid and lr rule included), so
    two losses at one size are two draws of the same measurement (another seed or batch
    order); the mean halves their variance, where the lower of two draws is biased low by
    about 0.56 σ. (Within a sweep the lower loss over the lr grid is kept because the grid's
    runs are different settings: there it is a choice of lr, not of a noise draw.)"""
    by_size: dict[float, list[float]] = defaultdict(list)
    for table in tables:
        for point in table:
            by_size[point.n_samples].append(point.loss)
    combined = [LossRow(n_samples=d, loss=sum(v) / len(v)) for d, v in sorted(by_size.items())]
    return combined, [int(d) for d, v in sorted(by_size.items()) if len(v) > 1]


def combine_steps_to_target(
    tables: Iterable[list[StepsPoint]],
) -> tuple[list[StepsRow], list[int]]:
    """One steps-to-target table from batch sweeps of one setup and target loss, by batch
    size; a batch size measured more than once gets the mean of the steps (the same reason as
    :func:`combine_loss_vs_data`) and the largest ``steps_uncertainty`` given (returned:
    those batch sizes)."""
    by_batch: dict[int, list[StepsPoint]] = defaultdict(list)
    for table in tables:
        for point in table:
            by_batch[point.batch_size].append(point)
    combined: list[StepsRow] = []
    for batch, points in sorted(by_batch.items()):
        row = StepsRow(batch_size=batch, steps=sum(p.steps for p in points) / len(points))
        spreads = [p.steps_uncertainty for p in points if p.steps_uncertainty]
        if spreads:
            row["steps_uncertainty"] = max(spreads)
        combined.append(row)
    return combined, [b for b, points in sorted(by_batch.items()) if len(points) > 1]


def _load(engine: Any, project_id: uuid.UUID, index: int, sweep_id: uuid.UUID) -> _Sweep:
    from sqlalchemy import text

    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT kind, status, request, result FROM job WHERE id = :id AND project_id = :p"
            ),
            {"id": sweep_id, "p": project_id},
        ).one_or_none()
    if row is None or row.kind != "sweep":
        raise JobError("invalid-request", "Not a sweep", f"sweeps.{index}: no sweep job {sweep_id}")
    if row.status != "succeeded":
        raise JobError(
            "invalid-request",
            "The sweep has not succeeded",
            f"sweeps.{index}: sweep job {sweep_id} is {row.status}",
        )
    try:
        result = _StoredSweepResult.model_validate(row.result or {})
    except ValidationError as exc:
        raise JobError(
            "invalid-request",
            "The sweep's result cannot be read",
            f"sweeps.{index}: sweep job {sweep_id}: {exc}"[:300],
        ) from None
    request: StoredRequest = row.request or {}
    return _Sweep(
        index=index,
        job_id=str(sweep_id),
        type=str(result.sweep.type or _object(request.get("sweep")).get("type")),
        request=request,
        measured=result.measurements,
        sweep=result.sweep,
    )


def _object(value: JsonValue) -> dict[str, JsonValue]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _normalised(request: StoredRequest) -> StoredRequest | None:
    """The request as the sweep ran it, defaults filled in (None: it no longer validates)."""
    try:
        return SweepJobCreate.model_validate(request).model_dump(mode="json")
    except ValueError:
        return None


def sweep_setup(request: StoredRequest, *, normalise: bool = True) -> dict[str, JsonValue]:
    """What a sweep measured, by request field name: the runner, model, start checkpoint,
    training and evaluation data (an agent sweep has none: the service cannot see its
    command, so two agent sweeps compare on the rest), every optimizer setting (lr, lr rule,
    lr grid, …) and the type's own settings (:data:`DATA_SETUP`, :data:`BATCH_SETUP`),
    defaults filled in as the sweep ran."""
    body = (_normalised(request) if normalise else None) or request
    settings = _object(body.get("sweep"))
    # setting name → its value as stored (JSON): compared for equality, never interpreted
    setup: dict[str, JsonValue] = {"runner": body.get("runner", "builtin")}
    for name in ("model", "checkpoint", "train_data", "eval_data"):  # none for an agent sweep
        setup[name] = body.get(name)
    for name, value in sorted(_object(body.get("optimizer")).items()):
        setup[f"optimizer.{name}"] = value
    own = DATA_SETUP if settings.get("type") == "data" else BATCH_SETUP
    for name in own:
        setup[f"sweep.{name}"] = settings.get(name)
    return setup


def _same_setup(group: list[_Sweep]) -> None:
    """Refuse sweeps of one type whose setups differ, naming the first differing setting."""
    # a request an older version stored may not validate today: then all are compared as
    # stored, never one with defaults filled in against one without
    normalise = all(_normalised(s.request) is not None for s in group)
    setups = [sweep_setup(s.request, normalise=normalise) for s in group]
    first = group[0]
    for other, setup in zip(group[1:], setups[1:], strict=True):
        for name in sorted(set(setups[0]) | set(setup)):
            mine, theirs = setup.get(name), setups[0].get(name)
            if mine == theirs:
                continue
            shown = "" if name == "model" else f" ({_short(mine)} here, {_short(theirs)} there)"
            compared = DATA_SETUP if first.type == "data" else BATCH_SETUP
            raise JobError(
                "invalid-request",
                "The sweeps measured different setups",
                f"sweeps.{other.index}: its {name} differs from sweeps.{first.index}'s{shown}; "
                f"{first.type} sweeps are combined only when they measured the same setup "
                f"(runner, model, checkpoint, train_data, eval_data, optimizer and sweep."
                + ", sweep.".join(compared)
                + ")"
                + (
                    "; batch sweeps at different data sizes fit B_crit(D) as a plan's "
                    "measurements.batch_sweeps"
                    if first.type == "batch"
                    else ""
                ),
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
