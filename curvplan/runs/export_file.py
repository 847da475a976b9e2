"""Runs from a tracker's plain export: CSV or JSON lines, one row per logged evaluation.

    run,batch_size,examples,lr,step,loss
    a,32,4096,0.003,10,2.91
    a,32,4096,0.003,20,2.40
    …

Columns: the run (``run``, ``run_id`` or ``run_name``), the step (``step`` or ``global_step``),
the evaluation loss (``loss``, ``eval_loss``, ``val_loss``, … or the name given), and any
others as the run's parameters (constant within a run; an empty cell is no value). JSON lines
carry the same keys, one object a line. Dependency-free (``csv``, ``json``).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from curvplan.runs.records import RunRecord, RunsInputError

RUN_COLUMNS = ("run", "run_id", "run_name")
STEP_COLUMNS = ("step", "global_step")
#: Evaluation-loss column names tried when none is given (the first present is used).
LOSS_COLUMNS = (
    "loss",
    "eval_loss",
    "eval/loss",
    "val_loss",
    "val/loss",
    "validation_loss",
    "valid_loss",
)


def _rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line number, row) of a CSV or JSON-lines file, told apart by the first character."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise RunsInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RunsInputError(f"{path} is not UTF-8 text (a CSV or JSON-lines export)") from None
    if text.lstrip().startswith("{"):
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise RunsInputError(f"{path}:{number}: not a JSON object: {exc}") from None
            if not isinstance(row, dict):
                raise RunsInputError(f"{path}:{number}: each line must be a JSON object")
            yield number, row
        return
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames:
        raise RunsInputError(f"{path} is empty: expected a CSV header or JSON lines")
    for row in reader:
        if None in row:
            raise RunsInputError(
                f"{path}:{reader.line_num}: more cells than the header has columns"
            )
        yield reader.line_num, row


def _pick(columns: set[str], candidates: tuple[str, ...], what: str, path: Path) -> str:
    for name in candidates:
        if name in columns:
            return name
    raise RunsInputError(
        f"{path}: no {what} column (tried {', '.join(candidates)}); columns: {sorted(columns)}"
    )


def _text(value: Any) -> str | None:
    """A cell as the tracker's parameter text; None for an empty cell."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).strip()
    return text or None


def _number(value: Any, column: str, where: str) -> float:
    text = _text(value)
    try:
        number = float(text) if text is not None else math.nan
    except ValueError:
        number = math.nan
    if text is None or (math.isnan(number) and text.lower() != "nan"):
        raise RunsInputError(f"{where}: {column} {value!r} is not a number")
    return number


def read_runs_file(path: Path, loss_column: str | None = None) -> list[RunRecord]:
    """The runs of a CSV or JSON-lines export (see the module docstring), in the order they
    first appear. ``loss_column`` names the evaluation-loss column (default: the first of
    ``LOSS_COLUMNS`` present)."""
    rows = list(_rows(path))
    if not rows:
        raise RunsInputError(f"{path} has no rows")
    columns: set[str] = set()
    for _, row in rows:
        columns |= set(row)
    run_col = _pick(columns, RUN_COLUMNS, "run", path)
    step_col = _pick(columns, STEP_COLUMNS, "step", path)
    loss_col = _pick(columns, (loss_column,) if loss_column else LOSS_COLUMNS, "loss", path)
    reserved = {run_col, step_col, loss_col}
    params: dict[str, dict[str, str]] = {}
    histories: dict[str, list[tuple[float, float]]] = {}
    for number, row in rows:
        where = f"{path}:{number}"
        run = _text(row.get(run_col))
        if run is None:
            raise RunsInputError(f"{where}: empty {run_col}")
        run_params = params.setdefault(run, {})
        history = histories.setdefault(run, [])
        for key, value in row.items():
            text = _text(value)
            if key in reserved or text is None:
                continue
            if run_params.setdefault(key, text) != text:
                raise RunsInputError(
                    f"{where}: run {run!r} has {key}={text!r} here and {run_params[key]!r} on "
                    "an earlier row; a parameter is constant within a run"
                )
        if _text(row.get(loss_col)) is None:
            continue  # a row of parameters only
        history.append((_number(row.get(step_col), step_col, where),
                        _number(row.get(loss_col), loss_col, where)))  # fmt: skip
    return [RunRecord(run=run, params=params[run], history=histories[run]) for run in params]
