"""Terminal output of the CLI: the live progress display and the tables.

On a terminal, `rich <https://rich.readthedocs.io>`_ (installed with typer) draws the
progress bar and the tables. Anywhere else (a pipe, a file, a CI log, a test runner) the
output stays plain: one line per progress change, tables as aligned columns, byte for byte
what scripts parse; ``--json`` never goes through here. Every cell and progress message is
rich ``Text``, never markup, so brackets such as ``[mlflow]`` or ``[365, 691]`` print as
they are.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from curvplan.budget_summary import BudgetRow, budget_summary, estimate_text, fmt
from curvplan.client import models as m
from curvplan.types.jobs import attempt_text
from curvplan.types.model_source import describe_model
from curvplan.types.planner import (
    BatchSizeSection,
    BCrit,
    Budget,
    CurvatureSection,
    Estimate,
    NotComputed,
    PowerLawFit,
    SampleSizeSection,
    SampleSizeValue,
    ScalingSection,
)
from curvplan.types.sweep import DataSweepFit

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

BAR_WIDTH = 28


def is_terminal(stream: TextIO) -> bool:
    """Draw with rich on ``stream``: a terminal that is not ``TERM=dumb``."""
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def _console(file: TextIO) -> Any:
    from rich.console import Console

    width = shutil.get_terminal_size((100, 20)).columns
    return Console(file=file, force_terminal=True, width=width, highlight=False, emoji=False)


class ProgressDisplay:
    """``on_progress`` callback for :meth:`Client.wait`.

    On a terminal a rich progress bar redraws in place: bar, percent, status and the stage's
    message; elsewhere it prints one plain line per change (readable in CI logs).
    """

    def __init__(self, stream: TextIO, *, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = is_terminal(stream) if tty is None else tty
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, job: m.JobOut) -> None:
        p = job.progress
        fraction = p.fraction if p is not None and p.fraction is not None else None
        if job.status == "succeeded":
            fraction = 1.0
        stage = (p.stage if p is not None else None) or ""
        message = (p.message if p is not None else None) or ""
        percent = "   -" if fraction is None else f"{round(100 * fraction):3d}%"
        detail = f"{stage}: {message}" if stage and message else stage or message
        left = time_left(p.eta_seconds if p is not None else None)
        running = "" if m.is_terminal(job) else running_children(job)
        if running and not left:
            left = children_time_left(job)
        if left and not m.is_terminal(job):
            detail = f"{detail}  ({left})" if detail else left
        if running:  # last: a narrow terminal cuts the children, not the ETA
            detail = f"{detail} · {running}" if detail else running
        if self.tty:
            self._draw(fraction, percent, job.status, detail)
            if m.is_terminal(job):
                self.close()
                self._write_stage_timeline(job)
        else:
            self.stream.write(
                f"job {job.id} {job.status} {percent.strip()} {detail}".rstrip() + "\n"
            )
        self.stream.flush()

    def _draw(self, fraction: float | None, percent: str, status: str, detail: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn
        from rich.table import Column

        first = self._progress is None
        if self._progress is None:
            self._progress = Progress(
                BarColumn(bar_width=BAR_WIDTH),
                TextColumn("{task.fields[percent]}", markup=False),
                TextColumn("{task.fields[status]}", markup=False),
                TextColumn(
                    "{task.description}",
                    markup=False,
                    table_column=Column(no_wrap=True, overflow="ellipsis"),
                ),
                console=_console(self.stream),
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._task = self._progress.add_task("", total=1.0, percent="", status="")
        assert self._task is not None
        self._progress.update(
            self._task,
            total=None if fraction is None else 1.0,  # None: an indeterminate (pulsing) bar
            completed=fraction or 0.0,
            description=detail,
            percent=percent,
            status=f"{status:<10}",
        )
        if first:
            self._progress.start()  # draws the first frame
        else:
            self._progress.refresh()

    def _write_stage_timeline(self, job: m.JobOut) -> None:
        timeline = stage_timeline(job)
        if timeline:
            self.stream.write(f"stages: {timeline}\n")

    def close(self) -> None:
        """Stop a live bar (on a terminal state, or on Ctrl-C): it stays printed, the cursor
        comes back."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
            self.stream.flush()


def running_children(job: m.JobOut, most: int = 2) -> str:
    """``running: layers.0-1 (block spectra), layers.2-3 (loading)``: the running children of
    a fan-out and their stages (the first ``most``, then how many more); empty without."""
    running = [c for c in job.children or () if c.status in ("running", "cancelling")]
    if not running:
        return ""
    names = [(c.name or c.kind).split(" (")[0] for c in running]  # without the parent's notes
    parts = [f"{n} ({c.stage})" if c.stage else n for n, c in zip(names, running, strict=True)]
    text = ", ".join(parts[:most])
    if len(parts) > most:
        text += f" +{len(parts) - most} more"
    return f"running: {text}"


def children_time_left(job: m.JobOut) -> str:
    """A fan-out's time left by its running children's own estimates: the longest of them
    (they run side by side), saying how many children are still queued (not in it); empty
    when no running child has an estimate."""
    children = job.children or ()
    etas = [
        c.eta_seconds
        for c in children
        if c.status in ("running", "cancelling") and c.eta_seconds is not None
    ]
    if not etas:
        return ""
    queued = sum(1 for c in children if c.status == "queued")
    return time_left(max(etas)) + (f" in the running children, {queued} queued" if queued else "")


def time_left(seconds: float | None) -> str:
    """``≈ 3 min left``, ``≈ 40 s left``, ``≈ 2.5 h left``; empty without an estimate."""
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    if seconds < 90:
        return f"≈ {seconds:.0f} s left"
    if seconds < 5400:
        return f"≈ {seconds / 60:.0f} min left"
    return f"≈ {seconds / 3600:.1f} h left"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, styled: bool | None = None
) -> str:
    """The rows under their headers: drawn by rich when ``styled`` (default: standard output
    is a terminal), else left-aligned columns, two spaces apart, with a rule under the
    header."""
    cells = [[_cell(v) for v in row] for row in rows]
    if is_terminal(sys.stdout) if styled is None else styled:
        return _rich_table(headers, cells)
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
    return "\n".join(lines)


def _rich_table(headers: Sequence[str], cells: list[list[str]]) -> str:
    """A rich table as terminal text (ANSI styles): every header and cell is plain ``Text``,
    so no bracket is read as markup."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for h in headers:
        grid.add_column(Text(h), overflow="fold")
    for row in cells:
        grid.add_row(*(Text(c) for c in row))
    out = io.StringIO()
    _console(out).print(grid)
    return out.getvalue().rstrip("\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return fmt(value)
    return str(value)


def interval(ci: Sequence[float | int | None] | None) -> str:
    if not ci:
        return ""
    lo, hi = ci
    return f"[{fmt(lo)}, {fmt(hi)}]"


def _why(section: object) -> str:
    """Why a section or estimate is missing: its reason, or that the answer lacks it."""
    return section.reason if isinstance(section, NotComputed) else "not in the answer"


def jobs_table(jobs: Sequence[m.JobOut]) -> str:
    rows = []
    for job in jobs:
        p = job.progress
        progress = "" if p is None or p.fraction is None else f"{round(100 * p.fraction)}%"
        if p is not None and p.stage and not m.is_terminal(job):
            progress = f"{progress} {p.stage}".strip()
        tags = ",".join(f"{k}={v}" for k, v in sorted(job.tags.items()))
        rows.append(
            [
                str(job.id),
                job.kind,
                job.status,
                progress,
                job.name or "",
                tags,
                job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            ]
        )
    return table(["ID", "KIND", "STATUS", "PROGRESS", "NAME", "TAGS", "CREATED (UTC)"], rows)


def job_summary(job: m.JobOut) -> str:
    lines = [
        f"job        {job.id}",
        f"kind       {job.kind} (queue {job.queue})",
        f"status     {job.status}" + ("  (cancel requested)" if job.cancel_requested else ""),
        f"name       {job.name or '-'}",
        f"tags       {', '.join(f'{k}={v}' for k, v in sorted(job.tags.items())) or '-'}",
    ]
    result = m.dump_json(job.result) if job.result is not None else {}
    model = describe_model(job.request, result.get("measurements"))
    if model is not None:
        lines.append(f"model      {model}")
    lines += [
        "attempt    "
        + attempt_text(
            job.attempt,
            job.max_attempts,
            job.status,
            None if job.children is None else [c.status for c in job.children],
        ),
        f"created    {job.created_at.isoformat()}",
    ]
    if job.started_at:
        lines.append(f"started    {job.started_at.isoformat()}")
    if job.finished_at:
        lines.append(f"finished   {job.finished_at.isoformat()}")
    if job.progress is not None and not m.is_terminal(job):
        p = job.progress
        frac = "" if p.fraction is None else f"{round(100 * p.fraction)}% "
        lines.append(f"progress   {frac}{p.stage or ''} {p.message or ''}".rstrip())
    if job.error is not None:
        lines.append(
            f"error      {job.error.type}: {job.error.title or ''} {job.error.detail or ''}"
        )
    if job.parent_id is not None:
        lines.append(f"parent     {job.parent_id}")
    for i, child in enumerate(job.children or []):
        label = "children  " if i == 0 else "          "
        failed = f" ({child.error_type})" if child.error_type else ""
        lines.append(f"{label} {child.name or '-'}: {child.status}{failed}  {child.id}")
    return "\n".join(lines)


def recommendation_text(rec: m.Recommendation) -> str:
    """The recommendation as tables: the budget first (docs/budget.md), then one per section."""
    parts = [budget_text(rec.budget)] if rec.budget is not None else []
    parts += [_sample_size(rec.sample_size), _batch_size(rec.batch_size), _scaling(rec.scaling)]
    parts.append(_curvature(rec.curvature))
    if rec.warnings:
        width = max(60, shutil.get_terminal_size((100, 20)).columns - 6)
        lines = ["Warnings"]
        for w in rec.warnings:
            wrapped = textwrap.wrap(f"{w.code} ({w.section}): {w.detail}", width)
            lines.append("  - " + "\n    ".join(wrapped))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def budget_text(budget: Budget) -> str:
    """The budget as one table (the shared :func:`~curvplan.budget_summary.budget_summary`):
    data, batch, learning rate, each with its unit and source, then the notes."""
    summary = budget_summary(budget)
    width = max(60, shutil.get_terminal_size((100, 20)).columns - 6)
    rows = [
        [
            ("  " if r.sub else "") + r.label,
            r.value if isinstance(r.value, str) else fmt(r.value),
            _row_interval(r),
            r.note,
        ]
        for r in summary.rows
    ]
    lines = ["BUDGET", table(["", "value", "interval", "source / unit"], rows)]
    for note in summary.notes:
        text = note.text if note.label is None else f"{note.label}: {note.text}"
        prefix = "! " if note.label is None else ""
        lines.append("  " + "\n    ".join(textwrap.wrap(prefix + text, width)))
    return "\n".join(lines)


def _row_interval(row: BudgetRow) -> str:
    if not row.interval:
        return ""
    low, high = row.interval
    return f"[{fmt(low)}, {fmt(high)}" + ("]" if row.closed else ")")


def _sample_size(section: SampleSizeSection | NotComputed | None) -> str:
    title = "Sample size (loss-difference curve Δ_k, Petrov et al. 2025 Thm 7)"
    if not isinstance(section, SampleSizeSection):
        return f"{title}\n  not computed: {_why(section)}"
    lines = [title]
    fit = section.fit
    if not isinstance(fit, PowerLawFit):
        lines.append(f"  fit: not computed: {fit.reason}")
    else:
        lines.append(
            f"  fit Δ_k ≈ C·k^(−α): C = {fmt(fit.C)} {interval(fit.C_ci)}  "
            f"α = {fmt(fit.alpha)} {interval(fit.alpha_ci)}  r² = {fmt(fit.r2)}  "
            f"(k in {fit.window[0]}..{fit.window[1]}, theory α = {fmt(fit.theory_alpha)})"
        )
    rows = []
    for t in section.per_tolerance:
        rows.append(
            [
                fmt(t.tolerance),
                _k(t.evaluation_set_size),
                _k(t.empirical),
                _k(t.squared_rms),
                _k(t.theoretical),
            ]
        )
    if rows:
        headers = [
            "TOLERANCE ε",
            "EVAL SET ±ε",
            "k* STABLE",
            "k* RMS Δ",
            "k* THEOREM 7",
        ]
        lines.append(_indent(table(headers, rows)))
        lines.append(
            "  EVAL SET ±ε: examples an evaluation set needs for its average loss to be within "
            "±ε (an evaluation number, not a training-set size: budget.data is that). k* "
            "STABLE / k* RMS Δ: adding one more example changes the loss by ≤ ε (mean / RMS), "
            "not loss accuracy. See docs/numbers.md."
        )
        corr = section.loss_correlation
        if corr is not None:
            lines.append("  " + corr.note)
    lines.extend(f"  missing {x.item}: {x.reason}" for x in section.missing)
    return "\n".join(lines)


def _k(value: SampleSizeValue | NotComputed | None) -> str:
    if not isinstance(value, SampleSizeValue):
        return "n/a"
    text = "-" if value.k is None else f"{value.k:,}"
    if value.ci:
        text += f" [{_int(value.ci[0])}, {_int(value.ci[1])}]"
    return text


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _batch_size(section: BatchSizeSection | NotComputed | None) -> str:
    title = "Batch size (McCandlish et al. 2018)"
    if not isinstance(section, BatchSizeSection):
        return f"{title}\n  not computed: {_why(section)}"
    rows = []
    for label, est in (("B_simple = tr Σ/|G|²", section.b_simple), ("B_noise", section.b_noise)):
        if isinstance(est, Estimate):
            rows.append([label, fmt(est.value), interval(est.ci)])
        else:
            rows.append([label, "n/a", _why(est)])
    crit = section.b_crit
    if not isinstance(crit, BCrit):
        rows.append(["B_crit", "n/a", _why(crit)])
    else:
        rows.append(["B_crit (S = S_min(1 + B_crit/B))", fmt(crit.value), interval(crit.ci)])
        rows.append(["S_min (steps)", fmt(crit.s_min), interval(crit.s_min_ci)])
        rows.append(["E_min (examples)", fmt(crit.e_min), interval(crit.e_min_ci)])
    for label, rel in (
        ("B_simple P(defined)", section.b_simple_reliability),
        ("B_noise P(defined)", section.b_noise_reliability),
    ):
        if rel is not None:
            median = "-" if rel.median_ratio is None else fmt(rel.median_ratio)
            rows.append([label, fmt(rel.p_defined), f"median estimate/truth {median}"])
    for point in section.trend:
        name = point.checkpoint or (f"step {point.step}" if point.step is not None else "?")
        est = point.b_simple
        if isinstance(est, Estimate):
            rows.append([f"B_simple at {name}", fmt(est.value), interval(est.ci)])
        else:
            rows.append([f"B_simple at {name}", "n/a", _why(est)])
    return f"{title}\n" + _indent(table(["QUANTITY", "VALUE", "INTERVAL / NOTE"], rows))


def _scaling(section: ScalingSection | NotComputed | None) -> str:
    title = "Data scaling L(D) = E + A·D^(−β)"
    if not isinstance(section, ScalingSection):
        return f"{title}\n  not computed: {_why(section)}"
    rows = [
        ["E (irreducible loss)", fmt(section.E), interval(section.E_ci)],
        ["A", fmt(section.A), interval(section.A_ci)],
        ["β", fmt(section.beta), interval(section.beta_ci)],
    ]
    return f"{title}\n" + _indent(table(["PARAMETER", "VALUE", "INTERVAL"], rows))


def _curvature(section: CurvatureSection | NotComputed | None) -> str:
    title = "Curvature per block"
    if not isinstance(section, CurvatureSection):
        return f"{title}\n  not computed: {_why(section)}"
    rows = [
        [
            b.name,
            fmt(b.spectral_norm),
            fmt(b.lambda_max),
            fmt(b.lambda_min),
            f"{100 * b.share_of_total_norm:.1f}%",
            fmt(b.block_threshold),
        ]
        for b in section.blocks
    ]
    text = f"{title}\n" + _indent(
        table(["BLOCK", "‖H‖₂", "λ_max", "λ_min", "SHARE", "2/λ_max (BLOCK)"], rows)
    )
    if section.heterogeneity_ratio is not None:
        text += f"\n  heterogeneity ratio max/min ‖H_b‖: {fmt(section.heterogeneity_ratio)}"
    return text


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def stage_timeline(job: m.JobOut) -> str:
    """``loading 0.4s → block spectra 1/9 2.1s → …``: each stage the attempt went through
    and how long it lasted (the last one until the job finished)."""
    marks = (job.progress.stages if job.progress is not None else None) or []
    parts = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].started_at if i + 1 < len(marks) else job.finished_at
        seconds = f" {(end - mark.started_at).total_seconds():.1f}s" if end is not None else ""
        parts.append(f"{mark.stage}{seconds}")
    return " → ".join(parts)


def sweep_text(job: m.JobOut) -> str | None:
    """A branch sweep's table: the CBS at each checkpoint, its bracket, and the warm-up
    schedule; a data sweep's: each size's round, steps and L(D) (None for other jobs)."""
    result = job.result
    sweep = getattr(result, "sweep", None)
    data = getattr(sweep, "data", None)
    if data is not None:
        return _data_sweep_text(data)
    branch = getattr(sweep, "branch", None)
    if branch is None:
        return None
    width = max(60, shutil.get_terminal_size((100, 20)).columns - 6)
    sizes = branch.batch_sizes
    rows = []
    for c in branch.checkpoints:
        excess = {k.batch_size: k.excess for k in c.curves}
        bracket = (
            ("not measured" if c.status == "not_measured" else "")
            if c.critical_batch is None
            else _bracket(c.status, c.critical_batch, c.next_batch)
        )
        rows.append(
            [
                "-" if c.step is None else str(c.step),
                fmt(c.loss),
                _int(c.critical_batch),
                bracket,
                estimate_text(c.efficiency),
                estimate_text(c.crossing),
                *[fmt(excess.get(b)) if b in excess else "failed" for b in sizes],
            ]
        )
    headers = [
        "step",
        "loss",
        "CBS",
        "bracket",
        "efficiency B_c",
        "ε-crossing",
        *[f"excess B={b}" for b in sizes],
    ]
    stages = ", ".join(
        f"from step {'?' if s.from_step is None else s.from_step}: {s.batch_size}"
        for s in branch.warmup_schedule
    )
    lines = [
        "BRANCH SWEEP (critical batch size by branched training, Merrill et al. 2025)",
        table(headers, rows),
        f"  warm-up schedule: {stages}",
    ]
    texts = [
        ("rule", branch.rule),
        (
            "window",
            f"{fmt(branch.window_tokens)} tokens ({branch.window_examples} examples) per branch",
        ),
        ("learning rate", branch.lr_rule),
        (
            "cost",
            f"{branch.examples_processed:,} examples processed"
            + (f" ({fmt(branch.tokens_processed)} tokens)" if branch.tokens_processed else ""),
        ),
        ("schedule", branch.schedule_note or ""),
    ]
    texts += [("note", f"step {c.step}: {n}") for c in branch.checkpoints for n in c.notes]
    for label, text in texts:
        lines.append("  " + "\n    ".join(textwrap.wrap(f"{label}: {text}", width)))
    return "\n".join(lines)


def _data_sweep_text(data: DataSweepFit) -> str:
    """A data sweep's rounds: size, round, steps (the epoch rule), lr multiplier and L(D)."""
    width = max(60, shutil.get_terminal_size((100, 20)).columns - 6)
    round_of = {d: r.round for r in data.rounds for d in r.data_sizes}
    rows = [
        [
            _int(int(p.n_samples)),
            str(round_of.get(int(p.n_samples), "-")),
            _int(data.steps_per_size.get(str(int(p.n_samples)))),
            fmt(data.lr_multipliers.get(str(int(p.n_samples)))),
            fmt(p.loss),
        ]
        for p in data.loss_vs_data
    ]
    lines = [
        "DATA SWEEP (L(D) = E + A·D^(−β) over nested subsets)",
        table(["size D", "round", "steps", "lr ×", "L(D)"], rows),
    ]
    texts = [("steps", data.steps_rule or ""), ("schedule", data.schedule or "")]
    texts += [(f"round {r.round}", f"{r.data_sizes}: {r.reason}") for r in data.rounds]
    if data.bracketed is False or data.next_round_sizes:
        texts.append(("NOT BRACKETED", f"next round's sizes: {data.next_round_sizes or 'none'}"))
    for label, text in texts:
        lines.append("  " + "\n    ".join(textwrap.wrap(f"{label}: {text}", width)))
    return "\n".join(lines)


def _bracket(status: str | None, cbs: int, next_batch: int | None) -> str:
    if status == "at_least":
        return f"≥ {cbs}"
    if status == "at_most":
        return f"< {next_batch}"
    return f"[{cbs}, {next_batch})"
