"""The plan's measurement tables from training runs: steps to a target loss per batch size
(``measurements.steps_to_target``) and the final loss per training-set size
(``measurements.loss_vs_data``), with which run gave which row and why the others were left out.

Torch-free and dependency-free (the client package has no numpy).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Required, TypedDict

from curvplan.runs.records import ParamNames, ResolvedRun, RunRecord, resolve_run
from curvplan.runs.sweeps import (
    SWEEPS_TABLE,
    BatchSweepJson,
    GroupJson,
    GroupOutcome,
    SizeGroup,
    build_batch_sweeps,
)

STEPS_TABLE: Final = "steps_to_target"
DATA_TABLE: Final = "loss_vs_data"
#: The fewest rows the planner fits (S(B) has 2 parameters, L(D) 3): a smaller table is not sent.
MIN_BATCH_SIZES = 2
MIN_DATA_SIZES = 3


@dataclass(frozen=True)
class Crossing:
    """The first logged step at or below the target and the steps since the evaluation
    before it (the crossing lies in (steps − uncertainty, steps])."""

    steps: float
    uncertainty: float


def clean_history(history: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``(step, loss)`` pairs sorted by step, non-finite losses and negative steps dropped;
    a step logged twice keeps its last value."""
    by_step: dict[float, float] = {}
    for step, loss in history:
        if math.isfinite(step) and step >= 0 and math.isfinite(loss):
            by_step[float(step)] = float(loss)
    return sorted(by_step.items())


def first_crossing(history: Sequence[tuple[float, float]], target: float) -> Crossing | str:
    """Steps to the target loss (McCandlish et al. 2018, "An Empirical Model of Large-Batch
    Training", §2.3: S is the number of optimizer steps a run takes to reach a given loss; its
    eq. 2.11 S = S_min(1 + B_crit/B) is fitted to these by the planner): the first logged step
    whose loss is at or below ``target``, with the logging interval before it as its
    uncertainty. ``history`` sorted by step (``clean_history``). A string says why there is
    none."""
    if not history:
        return "no evaluation loss logged"
    previous = 0.0
    for step, loss in history:
        if loss <= target:
            if step <= 0:
                return (
                    f"its first evaluation (step {step:g}) is already at or below the target "
                    f"loss {target:g}: the target is too high to time"
                )
            return Crossing(step, step - previous)
        previous = step
    best_step, best = min(history, key=lambda p: p[1])
    return (
        f"its eval loss never reaches the target {target:g} (lowest {best:.6g} at step "
        f"{best_step:g}, last logged step {history[-1][0]:g})"
    )


class RunJson(TypedDict, total=False):
    """A run in the import report (``status``, ``used_in``, ``reasons`` when known)."""

    run: str
    name: str | None
    status: str
    batch_size: int | None
    data_examples: float | None
    data_tokens: float | None
    lr: float | None
    evaluations: int
    used_in: dict[str, dict[str, float]]
    reasons: dict[str, str]


class TableJson(TypedDict, total=False):
    """A table in the import report: sent or not, its rows, and why not."""

    sent: Required[bool]
    rows: Required[int]
    note: str
    data_examples: float | None
    data_tokens: float | None
    groups: list[GroupJson]


class RunsReport(TypedDict):
    """Which runs were used, which skipped and why (the CLI's ``--json`` ``runs``)."""

    target_loss: float | None
    target_tokens: float | None
    tables: dict[str, TableJson]
    used: list[RunJson]
    skipped: list[RunJson]
    notes: list[str]


class ImportedMeasurements(TypedDict, total=False):
    """The plan measurements the runs give (``curvplan.types.planner.Measurements`` fields)."""

    steps_to_target: list[dict[str, float]]
    steps_to_target_loss: float | None
    batch_sweeps: list[BatchSweepJson]
    loss_vs_data: list[dict[str, float]]
    tokens_per_example: float


@dataclass
class RunOutcome:
    """One run's part in the tables: ``used`` (table → its row's numbers) and ``reasons``
    (table → why it is not in it)."""

    resolved: ResolvedRun
    history: list[tuple[float, float]]
    used: dict[str, dict[str, float]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> RunJson:
        r = self.resolved
        out: RunJson = {"run": r.record.run, "name": r.record.name}
        if r.record.status is not None:
            out["status"] = r.record.status
        out |= {
            "batch_size": r.batch_size,
            "data_examples": r.data_examples,
            "data_tokens": r.data_tokens,
            "lr": r.lr,
            "evaluations": len(self.history),
        }
        if self.used:
            out["used_in"] = self.used
        if self.reasons:
            out["reasons"] = self.reasons
        return out


@dataclass
class ImportResult:
    """The tables built from runs (None: not sent, ``table_notes`` says why) and each run's
    outcome."""

    target_loss: float | None
    runs: list[RunOutcome]
    steps_to_target: list[dict[str, float]] | None = None
    steps_data_examples: float | None = None  # the training-set size of the steps table's runs
    steps_data_tokens: float | None = None
    loss_vs_data: list[dict[str, float]] | None = None
    table_notes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tokens_per_example: float | None = None  # given by the caller: sent with the tables
    target_tokens: float | None = None  # the target run's tokens, for the batch scaling law
    batch_sweeps: list[BatchSweepJson] | None = None
    sweep_groups: list[GroupOutcome] | None = None  # None: the law was not in question

    @property
    def used(self) -> list[RunOutcome]:
        return [o for o in self.runs if o.used]

    @property
    def skipped(self) -> list[RunOutcome]:
        return [o for o in self.runs if not o.used]

    @property
    def usable(self) -> bool:
        return self.steps_to_target is not None or self.loss_vs_data is not None

    def measurements(self) -> ImportedMeasurements:
        """The plan's ``measurements`` from these runs (only the tables that were built)."""
        out: ImportedMeasurements = {}
        if self.steps_to_target is not None:
            out[STEPS_TABLE] = self.steps_to_target
            out["steps_to_target_loss"] = self.target_loss
        if self.batch_sweeps is not None:
            out[SWEEPS_TABLE] = self.batch_sweeps
        if self.loss_vs_data is not None:
            out[DATA_TABLE] = self.loss_vs_data
        if out and self.tokens_per_example is not None:
            out["tokens_per_example"] = self.tokens_per_example
        return out

    def report(self) -> RunsReport:
        """Which runs were used, which skipped and why (the CLI's ``--json`` ``runs``)."""
        tables: dict[str, TableJson] = {}
        built: list[tuple[str, Sequence[object] | None]] = [
            (STEPS_TABLE, self.steps_to_target),
            (DATA_TABLE, self.loss_vs_data),
        ]
        if self.sweep_groups is not None or SWEEPS_TABLE in self.table_notes:
            built.append((SWEEPS_TABLE, self.batch_sweeps))
        for table, rows in built:
            entry: TableJson = {"sent": rows is not None, "rows": len(rows or [])}
            if table in self.table_notes:
                entry["note"] = self.table_notes[table]
            tables[table] = entry
        if self.steps_to_target is not None:
            tables[STEPS_TABLE]["data_examples"] = self.steps_data_examples
            tables[STEPS_TABLE]["data_tokens"] = self.steps_data_tokens
        if SWEEPS_TABLE in tables:
            tables[SWEEPS_TABLE]["groups"] = [g.as_json() for g in self.sweep_groups or []]
        return {
            "target_loss": self.target_loss,
            "target_tokens": self.target_tokens,
            "tables": tables,
            "used": [o.as_json() for o in self.used],
            "skipped": [o.as_json() for o in self.skipped],
            "notes": self.notes,
        }


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"


SizeKey = tuple[str, float] | None


def _size_key(run: ResolvedRun) -> SizeKey:
    """The training-set size a run's steps belong with: its tokens when known (the batch
    scaling law's D), else its examples, else None."""
    if run.data_tokens is not None:
        return ("tokens", run.data_tokens)
    if run.data_examples is not None:
        return ("examples", run.data_examples)
    return None


def _size_text(key: SizeKey) -> str:
    return "an unknown training-set size" if key is None else f"{key[1]:g} {key[0]}"


def _group_rows(
    group: list[RunOutcome], crossings: dict[int, Crossing], table: str
) -> list[tuple[int, float, float, list[RunOutcome]]]:
    """(batch size, steps, uncertainty, runs) per batch size of one training-set size, sorted:
    repeats at one learning rate averaged, and the learning rate that reached the target in the
    fewest steps kept (McCandlish et al. 2018 tune it per batch size); the runs at the other
    rates get the reason under ``table``."""
    cells: dict[int, dict[float | None, list[RunOutcome]]] = defaultdict(lambda: defaultdict(list))
    for o in group:
        assert o.resolved.batch_size is not None
        cells[o.resolved.batch_size][o.resolved.lr].append(o)
    rows: list[tuple[int, float, float, list[RunOutcome]]] = []
    for batch, by_lr in cells.items():
        means = {
            lr: (
                sum(crossings[id(o)].steps for o in runs) / len(runs),
                sum(crossings[id(o)].uncertainty for o in runs) / len(runs),
            )
            for lr, runs in by_lr.items()
        }
        best_lr = min(means, key=lambda lr: means[lr][0])
        steps, uncertainty = means[best_lr]
        for lr, runs in by_lr.items():
            if lr != best_lr:
                for o in runs:
                    o.reasons[table] = (
                        f"at batch size {batch} learning rate {_fmt(best_lr)} reached the target "
                        f"in fewer steps ({steps:g} vs {means[lr][0]:g} at lr {_fmt(lr)})"
                    )
        rows.append((batch, steps, uncertainty, by_lr[best_lr]))
    rows.sort(key=lambda row: row[0])
    return rows


def _table(rows: list[tuple[int, float, float, list[RunOutcome]]]) -> list[dict[str, float]]:
    return [
        {"batch_size": batch, "steps": steps, "steps_uncertainty": uncertainty}
        for batch, steps, uncertainty, _ in rows
    ]


def _steps_table(
    outcomes: list[RunOutcome],
    target: float | None,
    result: ImportResult,
    target_tokens: float | None,
) -> None:
    if target is None:
        for o in outcomes:
            o.reasons[STEPS_TABLE] = "no target loss given (--target-loss or targets.target_loss)"
        result.table_notes[STEPS_TABLE] = "no target loss given"
        if target_tokens is not None:
            result.table_notes[SWEEPS_TABLE] = "no target loss given"
        return
    crossings: dict[int, Crossing] = {}
    for o in outcomes:
        if o.resolved.batch_size is None:
            o.reasons[STEPS_TABLE] = o.resolved.batch_note or "no batch size"
            continue
        crossing = first_crossing(o.history, target)
        if not o.history and o.resolved.record.history_note:
            o.reasons[STEPS_TABLE] = o.resolved.record.history_note
        elif isinstance(crossing, str):
            o.reasons[STEPS_TABLE] = crossing
        else:
            crossings[id(o)] = crossing
    # a table per training-set size; steps_to_target holds the size with the most batch sizes
    # (ties: the largest), batch_sweeps one per token count when the law can use them
    groups: dict[SizeKey, list[RunOutcome]] = defaultdict(list)
    for o in outcomes:
        if id(o) in crossings:
            groups[_size_key(o.resolved)].append(o)
    if not groups:
        note = f"no run with a batch size reached the target {target:g}"
        result.table_notes[STEPS_TABLE] = note
        if target_tokens is not None:
            result.table_notes[SWEEPS_TABLE] = note
        return

    def breadth(key: SizeKey) -> tuple[int, float]:
        return len({o.resolved.batch_size for o in groups[key]}), -1.0 if key is None else key[1]

    chosen = max(groups, key=breadth)
    _sweeps(groups, crossings, result, target_tokens)
    wide = [k for k in groups if breadth(k)[0] >= MIN_BATCH_SIZES]
    if len(wide) > 1:
        where = (
            f"batch_sweeps holds a table per token count ({len(result.batch_sweeps)})"
            if result.batch_sweeps is not None
            else f"batch_sweeps: {result.table_notes.get(SWEEPS_TABLE, 'not sent')}"
        )
        result.notes.append(
            f"runs at {len(wide)} training-set sizes reached the target at {MIN_BATCH_SIZES} or "
            f"more batch sizes each: steps_to_target holds those at {_size_text(chosen)} (the "
            f"size with the most batch sizes, for the pilots' own B_crit); {where}"
        )
    for key, group in groups.items():
        if key != chosen:
            for o in group:
                o.reasons[STEPS_TABLE] = (
                    f"trained on {_size_text(key)}; steps_to_target holds the runs on "
                    f"{_size_text(chosen)} (the size with the most batch sizes)"
                )
    rows = _group_rows(groups[chosen], crossings, STEPS_TABLE)
    if len(rows) < MIN_BATCH_SIZES:
        note = (
            f"only {len(rows)} batch size reached the target {target:g}; the S(B) fit needs "
            f"{MIN_BATCH_SIZES}: not sent"
        )
        result.table_notes[STEPS_TABLE] = note
        for *_, runs in rows:
            for o in runs:
                o.reasons[STEPS_TABLE] = note
        return
    result.steps_to_target = _table(rows)
    for *_, runs in rows:
        for o in runs:
            c = crossings[id(o)]
            o.used[STEPS_TABLE] = {"steps": c.steps, "steps_uncertainty": c.uncertainty}
    first = groups[chosen][0].resolved
    result.steps_data_examples = first.data_examples
    result.steps_data_tokens = first.data_tokens


def _sweeps(
    groups: dict[SizeKey, list[RunOutcome]],
    crossings: dict[int, Crossing],
    result: ImportResult,
    target_tokens: float | None,
) -> None:
    """measurements.batch_sweeps from the size groups (``build_batch_sweeps``), and each run's
    part in it; nothing when the law is not in question."""
    tables: list[tuple[SizeGroup, list[tuple[int, float, float, list[RunOutcome]]]]] = []
    for key, group in groups.items():
        rows = _group_rows(group, crossings, SWEEPS_TABLE)
        first = group[0].resolved
        tokens = key[1] if key is not None and key[0] == "tokens" else None
        tables.append((SizeGroup(tokens, first.data_examples, _table(rows)), rows))
    built = build_batch_sweeps([g for g, _ in tables], target_tokens=target_tokens)
    if built is None:  # not in question: no run is said to be left out of it
        for group in groups.values():
            for o in group:
                o.reasons.pop(SWEEPS_TABLE, None)
        return
    result.batch_sweeps = built.sweeps
    result.sweep_groups = built.groups
    if built.note is not None:
        result.table_notes[SWEEPS_TABLE] = built.note
    for outcome, (size, rows) in zip(built.groups, tables, strict=True):
        for *_, runs in rows:
            for o in runs:
                if outcome.sent:
                    assert size.tokens is not None
                    c = crossings[id(o)]
                    o.used[SWEEPS_TABLE] = {
                        "tokens": size.tokens,
                        "steps": c.steps,
                        "steps_uncertainty": c.uncertainty,
                    }
                else:
                    o.reasons.setdefault(SWEEPS_TABLE, outcome.reason or "not sent")


def _stopped_at_target(history: list[tuple[float, float]], target: float | None) -> bool:
    """Whether the run's only evaluation at or below ``target`` is its last: it was trained to
    the target and stopped there."""
    if target is None or not history or history[-1][1] > target:
        return False
    return len(history) == 1 or history[-2][1] > target


def _data_table(outcomes: list[RunOutcome], result: ImportResult) -> None:
    best: dict[float, RunOutcome] = {}
    for o in outcomes:
        r = o.resolved
        if r.data_examples is None:
            o.reasons[DATA_TABLE] = r.data_note or "no training-set size"
        elif not o.history:
            o.reasons[DATA_TABLE] = r.record.history_note or "no evaluation loss logged"
        elif not r.record.finished:
            o.reasons[DATA_TABLE] = (
                f"status {r.record.status}: its last loss is not the end of a finished run"
            )
        elif _stopped_at_target(o.history, result.target_loss):
            o.reasons[DATA_TABLE] = (
                f"it stopped at its first evaluation at or below the target loss "
                f"{result.target_loss:g} (a batch sweep's run): its last loss is not the end "
                "of its schedule"
            )
        else:
            incumbent = best.get(r.data_examples)
            if incumbent is None or o.history[-1][1] < incumbent.history[-1][1]:
                best[r.data_examples] = o
    for o in outcomes:
        d = o.resolved.data_examples
        if d is not None and DATA_TABLE not in o.reasons and best[d] is not o:
            winner = best[d]
            o.reasons[DATA_TABLE] = (
                f"run {winner.resolved.label} on the same {d:g} examples ended lower "
                f"({winner.history[-1][1]:.6g} vs {o.history[-1][1]:.6g})"
            )
    if len(best) < MIN_DATA_SIZES:
        note = (
            f"{len(best)} training-set size(s) with a finished run; L(D) = E + A·D^(−β) needs "
            f"{MIN_DATA_SIZES}: not sent"
        )
        result.table_notes[DATA_TABLE] = note
        for o in best.values():
            o.reasons[DATA_TABLE] = note
        return
    result.loss_vs_data = []
    for d in sorted(best):
        o = best[d]
        step, loss = o.history[-1]
        result.loss_vs_data.append({"n_samples": d, "loss": loss})
        o.used[DATA_TABLE] = {"final_loss": loss, "final_step": step}


def build_tables(
    records: Sequence[RunRecord],
    target_loss: float | None,
    names: ParamNames | None = None,
    *,
    target_tokens: float | None = None,
) -> ImportResult:
    """The steps-to-target table and the L(D) table from ``records``.

    steps_to_target: per batch size, the first logged step at or below ``target_loss``
    (``first_crossing``) with the logging interval as ``steps_uncertainty``; runs repeated at
    one learning rate are averaged, and of several learning rates the one with the fewest
    steps is kept. When the runs span several training-set sizes, the table holds the size
    with the most batch sizes (ties: the largest), and batch_sweeps one such table per token
    count when 2 or more qualify (``sweeps.build_batch_sweeps``; asked for by
    ``target_tokens``, the target run's tokens, it says why not otherwise). loss_vs_data:
    per training-set size (in examples), the last logged loss (the loss at the end of the
    decayed schedule) of finished runs that did not stop at the target, the lowest when
    several runs share a size. Each table is sent only when the planner can fit it (2 batch
    sizes, 3 dataset sizes; a batch sweep: 3 batch sizes)."""
    names = names or ParamNames()
    outcomes = [RunOutcome(resolve_run(r, names), clean_history(r.history)) for r in records]
    result = ImportResult(target_loss=target_loss, runs=outcomes, target_tokens=target_tokens)
    result.tokens_per_example = names.tokens_per_example
    _steps_table(outcomes, target_loss, result, target_tokens)
    _data_table(outcomes, result)
    return result
