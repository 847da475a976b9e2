"""``curvplan plan --from-mlflow EXPERIMENT`` / ``--from-runs FILE``: a plan's measurement
tables from the team's own training runs (curvplan.runs), and what the command says about
which runs it used (docs/integrations.md#pilot-runs-from-a-tracker)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Required, TypedDict

import typer

from curvplan.runs import ImportResult, ParamNames, RunsInputError, build_tables
from curvplan.runs.tables import RunJson


@dataclass(frozen=True)
class RunSource:
    """Where the runs come from: an MLflow experiment or an export file, and the mapping."""

    mlflow_experiment: str | None
    runs_file: Path | None
    run_ids: list[str]
    tracking_uri: str | None
    loss_metric: str | None
    names: ParamNames

    @property
    def given(self) -> bool:
        return self.mlflow_experiment is not None or self.runs_file is not None

    def describe(self) -> str:
        if self.mlflow_experiment is not None:
            where = f" on {self.tracking_uri}" if self.tracking_uri else ""
            return f"MLflow experiment {self.mlflow_experiment!r}{where}"
        return f"{self.runs_file}"


def check_source(source: RunSource) -> str | None:
    """A usage error of the import options, or None."""
    if source.mlflow_experiment is not None and source.runs_file is not None:
        return "give --from-mlflow or --from-runs, not both"
    if source.mlflow_experiment is None:
        pairs = (("--run-id", source.run_ids), ("--tracking-uri", source.tracking_uri))
        used = [opt for opt, value in pairs if value]
        if used:
            return f"{' and '.join(used)} need --from-mlflow EXPERIMENT"
    return None


def import_runs(
    source: RunSource, target_loss: float | None, target_tokens: float | None = None
) -> ImportResult:
    """Read the runs and build the tables (raises RunsInputError, MlflowNotInstalledError)."""
    if source.runs_file is not None:
        from curvplan.runs import read_runs_file

        records = read_runs_file(source.runs_file, source.loss_metric)
    else:
        from curvplan.integrations.mlflow_runs import read_experiment_runs

        assert source.mlflow_experiment is not None
        records = read_experiment_runs(
            source.mlflow_experiment,
            run_ids=source.run_ids,
            tracking_uri=source.tracking_uri,
            loss_metric=source.loss_metric,
        )
    if not records:
        raise RunsInputError(f"{source.describe()} has no runs: nothing submitted")
    return build_tables(records, target_loss, source.names, target_tokens=target_tokens)


class PlanDocument(TypedDict, total=False):
    """A ``curvplan plan`` MEASUREMENTS file as read: its ``measurements`` and ``targets``
    are the service's to validate (``Measurements``, ``Targets``), so their values are only
    passed on here."""

    measurements: Required[dict[str, object]]
    targets: dict[str, object]
    name: str
    tags: dict[str, str]


def merge_into(
    doc: PlanDocument,
    result: ImportResult,
    target_loss: float | None,
    target_tokens: float | None = None,
) -> None:
    """Put the imported tables into a plan document (its own tables are not overwritten) and
    the target loss and the target run's tokens into its targets."""
    measurements = doc.setdefault("measurements", {})
    imported = result.measurements()
    clash = sorted(set(imported) & set(measurements))
    if clash:
        raise RunsInputError(
            f"the measurements file already gives {', '.join(clash)}, which the runs would "
            "replace: remove them from the file, or import without it"
        )
    measurements.update(imported)
    if target_loss is not None:
        doc["targets"] = {**(doc.get("targets") or {}), "target_loss": target_loss}
    if target_tokens is not None:
        doc["targets"] = {**(doc.get("targets") or {}), "target_tokens": target_tokens}


def law_refusal(result: ImportResult, doc: PlanDocument) -> str | None:
    """Why the target run's batch cannot come from the law although ``--target-tokens`` asked
    for it (no batch sweeps from the runs, none in the measurements file), or None."""
    if result.batch_sweeps is not None or "batch_sweeps" in doc.get("measurements", {}):
        return None
    note = result.table_notes.get("batch_sweeps", "no steps-to-target table per token count")
    return f"--target-tokens: no batch scaling law from the runs: {note}"


def _run_line(entry: RunJson) -> str:
    name = f" ({entry['name']})" if entry.get("name") and entry["name"] != entry["run"] else ""
    return f"{entry['run']}{name}"


def report_text(result: ImportResult, source: RunSource) -> str:
    """What the import used and skipped, for a person (the ``--json`` ``runs`` in words)."""
    report = result.report()
    lines = [
        f"runs from {source.describe()}: {len(report['used'])} used, "
        f"{len(report['skipped'])} skipped"
    ]
    if result.steps_to_target is not None:
        tokens, examples = result.steps_data_tokens, result.steps_data_examples
        size = (
            f", runs on {tokens:g} tokens"
            if tokens is not None
            else f", runs on {examples:g} examples"
            if examples is not None
            else ""
        )
        lines.append(f"steps_to_target (target loss {result.target_loss:g}{size}):")
        lines += [
            f"  batch {row['batch_size']}: {row['steps']:g} steps (± {row['steps_uncertainty']:g})"
            for row in result.steps_to_target
        ]
    if result.loss_vs_data is not None:
        lines.append("loss_vs_data (final loss per training-set size):")
        lines += [
            f"  {row['n_samples']:g} examples: {row['loss']:.6g}" for row in result.loss_vs_data
        ]
    lines += _sweeps_lines(result)
    for table, entry in report["tables"].items():
        if not entry["sent"]:
            lines.append(f"{table}: not sent: {entry.get('note', 'no usable run')}")
    lines += [f"note: {note}" for note in result.notes]
    for run in report["used"]:
        for table, reason in (run.get("reasons") or {}).items():
            in_sweeps = "batch_sweeps" in (run.get("used_in") or {})
            if table != "batch_sweeps" and not (in_sweeps and table == "steps_to_target"):
                # (batch_sweeps: said per size group above; in it, a run is at its own size)
                lines.append(f"used {_run_line(run)}, but not in {table}: {reason}")
    for run in report["skipped"]:
        reasons = "; ".join(f"{t}: {r}" for t, r in (run.get("reasons") or {}).items())
        lines.append(f"skipped {_run_line(run)}: {reasons}")
    return "\n".join(lines)


def _sweeps_lines(result: ImportResult) -> list[str]:
    """The size groups that fed the batch scaling law and those skipped, with why."""
    if result.sweep_groups is None:
        return []
    lines = []
    if result.batch_sweeps is not None:
        target = result.target_tokens
        at = (
            f"answers the target run's {target:g} tokens"
            if target is not None
            else "give --target-tokens N for the target run's batch"
        )
        lines.append(
            f"batch_sweeps (B_crit(D) = c·D^γ over {len(result.batch_sweeps)} token counts; "
            f"the law {at}):"
        )
    for outcome in result.sweep_groups:
        sizes = ", ".join(str(b) for b in outcome.group.batch_sizes)
        if outcome.sent:
            lines.append(f"  {outcome.group.label}: batch {sizes}")
        else:
            lines.append(f"batch_sweeps: skipped {outcome.group.label}: {outcome.reason}")
    return lines


def echo_report(result: ImportResult, source: RunSource, err: bool) -> None:
    typer.echo(report_text(result, source), err=err)
