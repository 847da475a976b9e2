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
from typing import Any

from curvplan.types.jobs import SweepJobCreate
from curvplan_worker.errors import JobError

DATA_SETUP = ("batch_size", "epochs", "min_steps", "max_steps", "schedule", "cooldown_fraction")
"""The data sweep's settings (besides model, artifacts and optimizer) that change L(D): the
batch size and the steps rule (epochs, floor, cap) and decayed schedule of every run.
``init_seed`` is left out: two seeds of one setup are two draws of the same curve."""

BATCH_SETUP = ("target_loss",)
"""The batch sweep's setting that changes its steps-to-target table: the target loss."""

_TABLE = {"data": "loss_vs_data", "batch": "steps_to_target"}


@dataclass
class SweepInputs:
    """The planner fields the sweeps give, the target loss they imply, which sweep ids each
    table came from and notes for the analysis's result."""

    fields: dict[str, Any] = field(default_factory=dict)
    target_loss: float | None = None
    used: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Sweep:
    index: int
    job_id: str
    type: str
    request: dict[str, Any]
    measured: dict[str, Any]
    sweep: dict[str, Any]


def read_sweeps(engine: Any, project_id: uuid.UUID, sweeps: list[uuid.UUID]) -> SweepInputs:
    """The planner's fields from the finished sweep jobs ``sweeps`` of the project: the batch
    sweeps' steps to target (their target as ``steps_to_target_loss``, the loss budget.batch
    answers), the data sweeps' L(D) and the branch sweep's critical batch per checkpoint;
    the target loss used when targets.target_loss is not given is the last data sweep's (the
    loss budget.data answers), else the last batch sweep's. Errors name ``sweeps.i``."""
    loaded = [_load(engine, project_id, i, sweep_id) for i, sweep_id in enumerate(sweeps)]
    out = SweepInputs()
    for kind in ("batch", "data"):
        group = [s for s in loaded if s.type == kind and _TABLE[kind] in s.measured]
        if not group:
            continue
        _same_setup(group)
        key = _TABLE[kind]
        combine = combine_loss_vs_data if kind == "data" else combine_steps_to_target
        table, repeated = combine(s.measured[key] for s in group)
        out.fields[key] = table
        out.used[key] = [s.job_id for s in group]
        if len(group) > 1:
            out.notes.append(
                f"{key}: {len(table)} points combined from {len(group)} {kind} sweeps of one "
                f"setup ({', '.join(f'sweeps.{s.index}' for s in group)})"
                + (f"; measured twice or more, averaged: {repeated}" if repeated else "")
            )
    branch = [s for s in loaded if s.type == "branch" and "branched_critical_batch" in s.measured]
    if branch:
        out.fields["branched_critical_batch"] = branch[-1].measured["branched_critical_batch"]
        out.used["branched_critical_batch"] = [branch[-1].job_id]
    for s in loaded:
        if s.sweep.get("tokens_per_example"):
            out.fields["tokens_per_example"] = s.sweep["tokens_per_example"]
        swept = s.sweep.get("target_loss")
        if swept is not None and s.type == "batch":
            out.fields["steps_to_target_loss"] = float(swept)  # budget.batch answers this loss
        # budget.data answers the data sweep's target; the batch sweep's only without one
        if swept is not None and (out.target_loss is None or s.type == "data"):
            out.target_loss = float(swept)
    return out


def combine_loss_vs_data(tables: Iterable[list[dict[str, Any]]]) -> tuple[list[dict], list[int]]:
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
            by_size[float(point["n_samples"])].append(float(point["loss"]))
    combined = [{"n_samples": d, "loss": sum(v) / len(v)} for d, v in sorted(by_size.items())]
    return combined, [int(d) for d, v in sorted(by_size.items()) if len(v) > 1]


def combine_steps_to_target(
    tables: Iterable[list[dict[str, Any]]],
) -> tuple[list[dict], list[int]]:
    """One steps-to-target table from batch sweeps of one setup and target loss, by batch
    size; a batch size measured more than once gets the mean of the steps (the same reason as
    :func:`combine_loss_vs_data`) and the largest ``steps_uncertainty`` given (returned:
    those batch sizes)."""
    by_batch: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for table in tables:
        for point in table:
            by_batch[int(point["batch_size"])].append(point)
    combined = []
    for batch, points in sorted(by_batch.items()):
        row: dict[str, Any] = {
            "batch_size": batch,
            "steps": sum(float(p["steps"]) for p in points) / len(points),
        }
        spreads = [p["steps_uncertainty"] for p in points if p.get("steps_uncertainty")]
        if spreads:
            row["steps_uncertainty"] = max(float(s) for s in spreads)
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
    result = row.result or {}
    sweep = result.get("sweep") or {}
    return _Sweep(
        index=index,
        job_id=str(sweep_id),
        type=str(sweep.get("type") or (row.request or {}).get("sweep", {}).get("type")),
        request=row.request or {},
        measured=result.get("measurements") or {},
        sweep=sweep,
    )


def _normalised(request: dict[str, Any]) -> dict[str, Any] | None:
    """The request as the sweep ran it, defaults filled in (None: it no longer validates)."""
    try:
        return SweepJobCreate.model_validate(request).model_dump(mode="json")
    except ValueError:
        return None


def sweep_setup(request: dict[str, Any], *, normalise: bool = True) -> dict[str, Any]:
    """What a sweep measured, by request field name: the runner, model, start checkpoint,
    training and evaluation data (an agent sweep has none: the service cannot see its
    command, so two agent sweeps compare on the rest), every optimizer setting (lr, lr rule,
    lr grid, …) and the type's own settings (:data:`DATA_SETUP`, :data:`BATCH_SETUP`),
    defaults filled in as the sweep ran."""
    body = (_normalised(request) if normalise else None) or request
    settings = body.get("sweep") or {}
    setup: dict[str, Any] = {"runner": body.get("runner", "builtin")}
    for name in ("model", "checkpoint", "train_data", "eval_data"):  # none for an agent sweep
        setup[name] = body.get(name)
    for name, value in sorted((body.get("optimizer") or {}).items()):
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
