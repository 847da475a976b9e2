"""The budget summary: one reading of a recommendation's :class:`~curvplan.types.planner.Budget`
as rows and notes, rendered by the CLI (``curvplan.client.display``) as a text table and by
the report page (``curvplan_server.reports.page``) as HTML, so the two cannot disagree.

No number is computed here: every value is the budget's own; only the labels, the order and
which rows appear are decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from curvplan.types.planner import BranchedBatchEstimate, Budget, BudgetData, BudgetLearningRate

Number = float | int


def fmt(value: float | int | None) -> str:
    """A number in 4 significant digits (plain or scientific), ``-`` for None."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


@dataclass(frozen=True)
class BudgetRow:
    """One line of the budget: ``label`` (indented under its question when ``sub``), the
    value (a number, a bound such as ``≥ 64`` as text, or None), its interval (``closed``
    False: the upper end is excluded, a swept bracket), and the source or unit."""

    label: str
    value: Number | str | None
    interval: tuple[Number | None, Number | None] | None = None
    note: str = ""
    sub: bool = False
    closed: bool = True


@dataclass(frozen=True)
class BudgetNote:
    """A sentence under the table: what a number guarantees, why it is missing, the next
    step, what the learning-rate line means, or a warning (``label`` None)."""

    label: str | None
    text: str


@dataclass(frozen=True)
class BudgetSummary:
    rows: list[BudgetRow]
    notes: list[BudgetNote]


def answers(source: str, target_loss: float | None) -> str:
    """``data_sweep · loss 1.4``: a budget number's source and the target loss it answers
    (sweeps may have trained to different targets)."""
    if source == "not_available" or target_loss is None:
        return source
    return f"{source} · loss {fmt(target_loss)}"


def estimate_text(e: BranchedBatchEstimate | None) -> str:
    """A continuous branch estimate: its value, or its bound (≥ / ≤) when only that is known."""
    if e is None:
        return "-"
    mark = {"at_least": "≥ ", "at_most": "≤ "}.get(e.status, "")
    return f"{mark}{fmt(e.value)}"


def budget_summary(budget: Budget) -> BudgetSummary:
    """The budget's rows (data, batch, learning rate, each with its unit and source) and the
    notes under them."""
    rows = _data_rows(budget.data) + _batch_rows(budget) + _lr_rows(budget.learning_rate)
    d, b, lr = budget.data, budget.batch, budget.learning_rate
    notes = [
        BudgetNote("data", (d.guarantee if d.source != "not_available" else d.reason) or ""),
        BudgetNote("batch", (b.basis if b.source != "not_available" else b.reason) or ""),
    ]
    if d.next_step is not None:
        step = d.next_step
        notes.append(BudgetNote("next step", f"{step.command} — {step.estimated_cost}"))
    if lr.meaning:
        notes.append(BudgetNote("learning rate", lr.meaning))
    notes += [BudgetNote(None, w) for w in budget.warnings]
    return BudgetSummary(rows=rows, notes=[n for n in notes if n.text])


def _data_rows(d: BudgetData) -> list[BudgetRow]:
    answered = d.source in ("data_sweep", "extrapolated")
    rows = [
        BudgetRow(
            "data (examples)",
            d.recommended_examples,
            d.recommended_examples_ci,
            answers(d.source, d.target_loss if answered else None),
        )
    ]
    if d.next_step is not None:
        rows.append(
            BudgetRow(
                "to get one", d.next_step.training_runs, None, "training runs (see below)", True
            )
        )
    ev = d.evaluation_set_size
    if ev is not None:
        rows.append(
            BudgetRow(
                "evaluation set (loss ±ε)",
                ev.examples,
                ev.ci,
                f"ε = {fmt(ev.tolerance)}, {ev.variance_method}"
                + (", CORRELATED sample" if ev.correlated else ""),
                True,
            )
        )
    ls = d.landscape_stabilisation
    if ls is not None:
        rows.append(
            BudgetRow("landscape k*(ε)", ls.examples, ls.ci, f"ε = {fmt(ls.tolerance)}", True)
        )
    if d.available_samples is not None:
        enough = {True: "ENOUGH", False: "NOT ENOUGH", None: "-"}[d.available_is_enough]
        rows.append(BudgetRow("you have", d.available_samples, None, enough, True))
    return rows


def _batch_rows(budget: Budget) -> list[BudgetRow]:
    b = budget.batch
    rows = [BudgetRow("batch (examples)", b.recommended, None, answers(b.source, b.target_loss))]
    if b.source == "branch_sweep":
        rows.append(
            BudgetRow(
                f"critical batch ({b.critical_method or 'ladder'})",
                b.critical,
                b.critical_bracket,
                "examples; swept bracket" if b.critical_bracket else "examples",
                True,
                closed=False,
            )
        )
        for e in b.branch_estimates:
            if e.method != b.critical_method:
                rows.append(
                    BudgetRow(
                        f"  {e.method}", estimate_text(e), None, f"examples ({e.status})", True
                    )
                )
        schedule = ", ".join(
            f"{'?' if s.from_step is None else s.from_step}: {s.batch_size}"
            for s in b.warmup_schedule
        )
        rows.append(BudgetRow("warm-up (step: batch)", "", None, schedule, True))
    else:
        rows.append(BudgetRow("critical B_crit", b.critical, b.critical_ci, "examples", True))
    law = b.scaling_law
    if law is not None:
        low, high = law.measured_tokens_range
        pilots = f"pilots {fmt(low)}–{fmt(high)} tokens; target {fmt(law.target_tokens)}"
        rows.append(BudgetRow("law B_crit = c·D^γ: γ", law.gamma, law.gamma_ci, pilots, True))
        rows.append(BudgetRow("law B_crit = c·D^γ: c", law.c, law.c_ci, "", True))
    if b.recommended_tokens is not None:
        rows.append(
            BudgetRow(
                "batch (tokens)",
                b.recommended_tokens,
                b.critical_tokens_ci,
                "tokens; B_crit interval" if b.critical_tokens_ci else "tokens",
                True,
            )
        )
    if b.expected_steps is not None:
        rows.append(
            BudgetRow(
                "expected steps", b.expected_steps, b.expected_steps_ci, "steps at the batch", True
            )
        )
    return rows


def _lr_rows(lr: BudgetLearningRate) -> list[BudgetRow]:
    rows = [
        BudgetRow(
            "GD sharpness 2/λ_max",
            lr.gd_sharpness_threshold,
            None,
            "full model; full-batch GD only",
        )
    ]
    if lr.block_threshold is not None:
        rows.append(
            BudgetRow("2/λ_max largest block", lr.block_threshold, None, "upper bound", True)
        )
    return rows
