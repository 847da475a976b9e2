"""The critical batch size by branched training (Merrill et al. 2025), and the warm-up schedule.

Merrill, Arora, Groeneveld & Hajishirzi 2025, "Critical Batch Size Revisited: A Simple
Empirical Approach to Large-Batch Language Model Training" (arXiv 2505.23971): from a
checkpoint of a training run, branches train at batch sizes B for the same token window;
the critical batch size (CBS) there is the largest B whose loss keeps up with the small
batch's. Over the checkpoints the CBS grows, which is what a batch-size warm-up follows.

Pure functions of loss curves (no numpy, no torch): the sweep's fan-in calls
:func:`critical_batch_from_branches` on its branches' evaluation losses, the budget calls
:func:`warmup_schedule` on the per-checkpoint CBS (docs/budget.md#branch-sweep).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from curvplan.types.planner import (
    BatchWarmupStage,
    BCrit,
    BranchedBatchPoint,
    BranchedCriticalBatch,
    BranchStatus,
    BudgetBatch,
)
from curvplan_core.planner import formulas

Compare = Literal["end", "window"]

#: Relative slack of the ≤ ε comparison: an excess equal to ε up to float rounding is within.
TIE_SLACK = 1e-9

CBS_FORMULA = formulas.BUDGET_BRANCHED_CBS


def cbs_rule(tolerance: float, compare: Compare) -> str:
    """The CBS rule in words, with its tolerance and what is compared (result and docs)."""
    where = (
        "at the end of the window"
        if compare == "end"
        else "at every evaluation of the window (it must stay within throughout)"
    )
    return (
        f"CBS = the largest swept batch B whose evaluation loss is at most the smallest swept "
        f"batch's + ε = {tolerance:g} nats per token {where}, every branch having trained on "
        "the same number of tokens from the checkpoint (Merrill et al. 2025)"
    )


@dataclass(frozen=True, slots=True)
class BranchLosses:
    """One branch's evaluation losses at ``examples`` processed since the checkpoint."""

    batch_size: int
    examples: Sequence[float]
    losses: Sequence[float]


@dataclass(slots=True)
class BranchVerdict:
    """The CBS at one checkpoint and how each batch compared with the reference."""

    critical_batch: int
    status: BranchStatus
    next_batch: int | None
    reference_batch: int
    excess: dict[int, float | None]
    within: dict[int, bool]
    notes: list[str] = field(default_factory=list)


def _loss_at(branch: BranchLosses, position: float) -> float:
    for x, loss in zip(branch.examples, branch.losses, strict=True):
        if abs(x - position) <= TIE_SLACK * max(1.0, abs(position)):
            return float(loss)
    raise ValueError(
        f"the branch at batch {branch.batch_size} has no evaluation at {position:g} examples: "
        "every branch must be evaluated at the reference's points"
    )


def critical_batch_from_branches(
    branches: Sequence[BranchLosses],
    tolerance: float,
    compare: Compare = "end",
    *,
    failed_batches: Sequence[int] = (),
) -> BranchVerdict:
    """CBS = max{B : excess(B) ≤ ε}, the branched-training rule of Merrill et al. 2025 (§3).

    The reference is the smallest batch B₀ (of ``branches`` and ``failed_batches``); it must
    have finished. excess(B) = max over the compared points m of L_B(m) − L_B₀(m), where the
    points are the reference's last evaluation (``compare="end"``) or every evaluation after
    the start (``"window"``), in examples processed since the checkpoint (equal examples =
    equal tokens). An excess of exactly ε is within (ties count as keeping up); a failed
    branch (diverged, or its job failed) is not within. status: ``at_least`` when the largest
    swept batch is within, ``at_most`` when no batch above B₀ is, else ``measured`` (the CBS
    lies in [critical_batch, next_batch)).
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    by_batch = {b.batch_size: b for b in branches}
    if len(by_batch) != len(branches):
        raise ValueError("one branch per batch size")
    failed = set(failed_batches) - set(by_batch)
    swept = sorted(set(by_batch) | failed)
    if len(swept) < 2:
        raise ValueError("a CBS needs branches at two batch sizes at least")
    reference_batch = swept[0]
    if reference_batch not in by_batch:
        raise ValueError(f"the reference branch (batch {reference_batch}) did not finish")
    reference = by_batch[reference_batch]
    points = [float(x) for x in reference.examples if x > 0]
    if not points:
        raise ValueError("the reference branch has no evaluation after the checkpoint")
    compared = points[-1:] if compare == "end" else points
    bound = tolerance * (1 + TIE_SLACK)
    excess: dict[int, float | None] = {}
    within: dict[int, bool] = {}
    for b in swept:
        if b in failed:
            excess[b], within[b] = None, False
            continue
        gap = max(_loss_at(by_batch[b], m) - _loss_at(reference, m) for m in compared)
        excess[b] = 0.0 if b == reference_batch else gap
        within[b] = b == reference_batch or gap <= bound
    critical = max(b for b in swept if within[b])
    larger = [b for b in swept if b > critical]
    next_batch = larger[0] if larger else None
    status: BranchStatus
    if critical == swept[-1]:
        status = "at_least"
    elif critical == reference_batch:
        status = "at_most"
    else:
        status = "measured"
    notes = []
    behind = [b for b in swept if b < critical and not within[b]]
    if behind:
        notes.append(
            f"not monotone: batch {', '.join(map(str, behind))} exceeded the tolerance but the "
            f"larger {critical} stayed within; the window's losses differ by about ε "
            "(a longer window, a larger evaluation set or a larger ε settles it)"
        )
    if status == "at_least":
        notes.append(
            f"even the largest swept batch {critical} stayed within ε: the CBS is at least "
            f"{critical}; sweep larger batches to bracket it"
        )
    elif status == "at_most":
        notes.append(
            f"no batch above the smallest ({reference_batch}) stayed within ε: the CBS is below "
            f"{next_batch}; sweep smaller batches to bracket it"
        )
    return BranchVerdict(
        critical_batch=critical,
        status=status,
        next_batch=next_batch,
        reference_batch=reference_batch,
        excess=excess,
        within=within,
        notes=notes,
    )


def _in_step_order(points: Sequence[BranchedBatchPoint]) -> list[BranchedBatchPoint]:
    """Checkpoints by step; those without one after the others, in their given order."""
    ordered = sorted(
        enumerate(points),
        key=lambda ip: (ip[1].step is None, ip[1].step if ip[1].step is not None else 0, ip[0]),
    )
    return [p for _, p in ordered]


def warmup_schedule(
    points: Sequence[BranchedBatchPoint], tokens_per_example: float | None = None
) -> tuple[list[BatchWarmupStage], str]:
    """The batch-size warm-up over training: from each checkpoint's step on, its CBS.

    Stages in step order (checkpoints without a step keep their given order, after the
    others), consecutive equal batches merged into the earlier stage. The CBS is near 0 at
    initialisation and grows, then plateaus (Merrill et al. 2025, §4), so a warm-up starts
    small and doubles as the CBS grows (their §5). Returns the stages and a note: what
    holds before the first measured step, and where the measured CBS decreases.
    """
    stages: list[BatchWarmupStage] = []
    for p in _in_step_order(points):
        if stages and stages[-1].batch_size == p.critical_batch:
            continue
        stages.append(
            BatchWarmupStage(
                from_step=p.step,
                batch_size=p.critical_batch,
                batch_size_tokens=None
                if tokens_per_example is None
                else p.critical_batch * tokens_per_example,
                status=p.status,
                loss=p.loss,
            )
        )
    first = stages[0]
    start = "step 0" if first.from_step in (None, 0) else f"step {first.from_step}"
    notes = [
        f"from {start} on use batch {first.batch_size}"
        + (
            ""
            if first.from_step in (None, 0)
            else "; before it no CBS was measured (it is near 0 at initialisation: a smaller "
            "batch, or this one, is safe)"
        )
    ]
    drops = [
        f"step {b.from_step}: {a.batch_size} → {b.batch_size}"
        for a, b in itertools.pairwise(stages)
        if b.batch_size < a.batch_size
    ]
    if drops:
        notes.append(
            "the measured CBS decreases at " + ", ".join(drops) + " (within the sweep's "
            "resolution of one power of two; a warm-up usually keeps the larger batch)"
        )
    if any(p.step is None for p in points):
        notes.append("some checkpoints declare no step: their stages keep the given order")
    return stages, "; ".join(notes)


def branch_budget_batch(
    measurements: BranchedCriticalBatch,
    *,
    target_loss: float | None,
    tokens_per_example: float | None,
    batch_sweep: BCrit | None = None,
    expected_steps_formula: str | None = None,
) -> tuple[BudgetBatch, list[str]]:
    """budget.batch from a branch sweep: the CBS at the latest checkpoint leads (the batch for
    the rest of training), the warm-up schedule beside it (docs/budget.md#branch-sweep).

    A batch sweep given as well keeps its B_crit out of the lead but gives the expected steps
    at the recommended batch, S = S_min·(1 + B_crit/B) (McCandlish et al. 2018, eq. 2.11)."""
    stages, note = warmup_schedule(measurements.checkpoints, tokens_per_example)
    latest = _in_step_order(measurements.checkpoints)[-1]
    rec = latest.critical_batch
    bracket: tuple[int | None, int | None]
    bracket = (None, latest.next_batch) if latest.status == "at_most" else (rec, latest.next_batch)
    warnings: list[str] = []
    where = f"step {latest.step}" if latest.step is not None else "the latest checkpoint"
    if latest.status == "at_least":
        warnings.append(
            f"batch: at {where} even the largest swept batch {rec} stayed within ε: the CBS is "
            "at least that; a branch sweep with larger batches brackets it"
        )
    elif latest.status == "at_most":
        warnings.append(
            f"batch: at {where} no batch above the smallest ({rec}) stayed within ε: the CBS is "
            f"below {latest.next_batch}; a branch sweep with smaller batches brackets it"
        )
    steps = None
    if batch_sweep is not None and batch_sweep.unit == "examples":
        steps = batch_sweep.s_min * (1 + batch_sweep.value / rec)
        ratio = rec / batch_sweep.value
        if not 0.5 <= ratio <= 2:
            warnings.append(
                f"batch: the branched CBS {rec} and the batch sweep's B_crit "
                f"{batch_sweep.value:.4g} differ by {max(ratio, 1 / ratio):.2g}× (they measure "
                "different things: keeping up over a window from a checkpoint, and the steps "
                "to the target from the sweep's start)"
            )
    tok = None if tokens_per_example is None else rec * tokens_per_example
    window = (
        f"{measurements.window_tokens:,.0f} tokens"
        if measurements.window_tokens is not None
        else "a fixed token window"
    )
    basis = (
        f"branched training from {len(measurements.checkpoints)} checkpoint(s) at batches "
        f"{', '.join(map(str, measurements.batch_sizes))}, each for {window}: "
        f"{cbs_rule(measurements.tolerance, measurements.compare)}; the CBS at {where} leads, "
        f"the warm-up schedule gives the earlier steps ({note})"
    )
    return (
        BudgetBatch(
            recommended=rec,
            recommended_tokens=tok,
            critical=float(rec),
            critical_ci=None,
            critical_tokens=tok,
            tokens_per_example=tokens_per_example,
            source="branch_sweep",
            basis=basis,
            critical_formula=CBS_FORMULA,
            critical_bracket=bracket,
            warmup_schedule=stages,
            target_loss=target_loss,
            expected_steps=steps,
            expected_steps_formula=expected_steps_formula if steps is not None else None,
            expected_examples=None if steps is None else steps * rec,
            reason=None
            if steps is not None
            else "expected steps need S_min, which only a batch sweep measures",
        ),
        warnings,
    )
