"""The branch sweep's plan and fit (torch-free; the ``sweep`` kind calls them).

Branched training (Merrill et al. 2025, "Critical Batch Size Revisited", arXiv 2505.23971):
from each checkpoint, one ``sweep_point`` per batch size B (× learning-rate multiplier for
the grid rule) trains the same token window at a constant learning rate; the planner picks
the CBS per checkpoint from the branches' loss-vs-tokens curves
(:func:`curvplan_core.planner.branched_batch.critical_batch_from_branches`) and the
batch-size warm-up schedule over the checkpoints' steps (docs/budget.md#branch-sweep).

Every branch of a checkpoint draws the same sequence of training examples (one seeded
order, independent of B), so at equal tokens all branches have seen the same data; each
starts from the checkpoint's optimizer state when one is given beside it (AdamW moments,
safetensors), else from moments warmed at learning rate 0 on batches of its own size
(``sweep.moment_warmup_steps``; :mod:`curvplan_worker.sweep.moments`), and a linear
learning-rate warm-up over the same number of examples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from curvplan.types.jobs import SweepJobCreate, SweepPointJobCreate
from curvplan.types.planner import BranchedBatchPoint, BranchedCriticalBatch
from curvplan.types.results import SweepPointJobResult
from curvplan.types.sweep import (
    BranchCheckpoint,
    BranchCurve,
    BranchResult,
    PointResult,
    PointSettings,
    SweepPointOut,
    branch_window_examples,
)
from curvplan.types.sweep import tokens_per_example as contract_tokens_per_example
from curvplan_core.planner.branched_batch import (
    CBS_FORMULA,
    BranchLosses,
    EfficiencyFit,
    cbs_rule,
    critical_batch_from_branches,
    efficiency_fit,
    eps_crossing,
    warmup_schedule,
)
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import ChildOutcome
from curvplan_worker.sweep.ladder import batch_ladder, checked_batch_ladder
from curvplan_worker.sweep.lr import lr_for_batch

SweepChild = ChildOutcome[SweepPointJobCreate, SweepPointJobResult]
"""A sweep point's outcome as the sweep's fan-in reads it (``JobContext.children_as``)."""


def tokens_per_example(body: SweepJobCreate) -> float:
    """Loss terms ("tokens") one example counts for the window (the contract's
    :func:`curvplan.types.sweep.tokens_per_example`; the API refuses a branch sweep of a Hugging
    Face model, a request stored before it did is refused here)."""
    tpe = contract_tokens_per_example(body.model)
    if tpe is None:
        raise JobError("invalid-request", "Invalid sweep request", _window_refusal(body))
    return tpe


def _window_refusal(body: SweepJobCreate) -> str:
    problem = body.sweep.window_problem(body.model) or (
        "model",
        "a branch sweep on the service's workers needs a reference model spec",
    )
    field, message = problem
    return f"{field if field == 'model' else 'sweep.' + field}: {message}"


@dataclass(frozen=True, slots=True)
class BranchWindow:
    """The window every branch trains: examples in all, and per evaluation."""

    examples: int
    examples_per_eval: int
    tokens: float

    def steps(self, batch_size: int) -> int:
        return self.examples // batch_size

    def eval_every(self, batch_size: int) -> int:
        return self.examples_per_eval // batch_size


def branch_window(body: SweepJobCreate, sizes: Sequence[int]) -> BranchWindow:
    """``window_tokens`` rounded up so that each of the ``window_evals`` evaluations falls on a
    whole step of the largest batch (batch sizes are powers of two: of every batch then)."""
    sweep = body.sweep
    tpe = tokens_per_example(body)
    examples, per_eval = branch_window_examples(
        sweep.window_tokens or 1, tpe, sweep.window_evals, max(sizes)
    )
    return BranchWindow(examples=examples, examples_per_eval=per_eval, tokens=examples * tpe)


def lr_rule_text(body: SweepJobCreate, sizes: Sequence[int]) -> str:
    """How each branch's learning rate is set, in words (result and docs)."""
    opt = body.optimizer
    rule = {
        "sqrt": f"lr·√(B/{opt.base_batch_size})",
        "linear": f"lr·B/{opt.base_batch_size}",
        "constant": "lr",
        "grid": f"lr·√(B/{opt.base_batch_size}) × the best of {opt.lr_grid} (lowest loss at "
        "the end of the window)",
    }[opt.lr_rule]
    states = [s for s in body.optimizer_states if s is not None]
    warm = body.sweep.moment_warmup_steps
    if states and len(states) == len(body.checkpoints):
        start = "each checkpoint's own optimizer state (AdamW moments)"
    else:
        start = (
            f"moments warmed over {warm} steps at learning rate 0 on each branch's own batches"
            if warm
            else "a fresh optimizer state"
        )
        if states:
            start = f"the checkpoint's optimizer state where given, else {start}"
    return (
        f"{opt.name} at {rule} with lr = {opt.lr:g}, constant after a linear warm-up over "
        f"{opt.warmup_steps} steps of batch {min(sizes)} (the same examples at every B); "
        f"from {start}"
    )


def _warmup_steps(body: SweepJobCreate, batch_size: int, smallest: int) -> int:
    steps = body.optimizer.warmup_steps
    return 0 if steps == 0 else max(1, math.ceil(steps * smallest / batch_size))


Child = TypeVar("Child")


def plan_branches(
    body: SweepJobCreate,
    n_train: int,
    steps: Sequence[int | None],
    child: Callable[[str, SweepPointJobCreate], Child],
) -> list[Child]:
    """One child per (checkpoint, batch size[, lr multiplier]); ``child(name, request)``
    builds the child job from its request (the parent's fields with this branch's), validated
    from the JSON a client would send for it."""
    sweep, opt = body.sweep, body.optimizer
    sizes = checked_batch_ladder(sweep, n_train)
    window = branch_window(body, sizes)
    if window.steps(sizes[0]) > sweep.max_steps:  # the API refuses it (window_problem)
        raise JobError("invalid-request", "Invalid sweep request", _window_refusal(body))
    common = body.model_dump(mode="json", include={"model", "train_data", "eval_data"})
    multipliers = opt.lr_grid if opt.lr_rule == "grid" else [1.0]
    children: list[Child] = []
    states = body.optimizer_states or [None] * len(body.checkpoints)
    for i, (checkpoint, step) in enumerate(zip(body.checkpoints, steps, strict=True)):
        where = f"step {step}" if step is not None else f"checkpoint {i}"
        state = states[i]
        for b in sizes:
            optimizer = opt.model_copy(update={"warmup_steps": _warmup_steps(body, b, sizes[0])})
            for m in multipliers:
                point = PointSettings(
                    type="branch",
                    batch_size=b,
                    lr=lr_for_batch(opt, b, m),
                    lr_multiplier=m,
                    max_steps=window.steps(b),
                    eval_every=window.eval_every(b),
                    seed=sweep.init_seed,
                    schedule="constant",
                    moment_warmup_steps=0 if state is not None else sweep.moment_warmup_steps,
                    checkpoint_step=step,
                )
                request = {
                    **common,
                    "checkpoint": str(checkpoint),
                    "optimizer": optimizer.model_dump(mode="json"),
                    "point": point.model_dump(mode="json", exclude_none=True),
                }
                if state is not None:
                    request["optimizer_state"] = str(state)
                suffix = f", lr×{m:g}" if opt.lr_rule == "grid" else ""
                validated = SweepPointJobCreate.model_validate({"kind": "sweep_point", **request})
                children.append(child(f"{where}, B={b}{suffix}", validated))
    return children


def _compared_loss(result: PointResult) -> float:
    return result.eval_losses[-1]


def _checkpoint_steps(body: SweepJobCreate, children: Sequence[SweepChild]) -> list[int | None]:
    """Each checkpoint's step, as the fan-out wrote it into its branches' points."""
    found: dict[str, int] = {}
    for child in children:
        step = child.request.point.checkpoint_step
        if step is not None:
            found[str(child.request.checkpoint)] = step
    return [found.get(str(c)) for c in body.checkpoints]


def fit_branches(
    body: SweepJobCreate,
    children: Sequence[SweepChild],
    outs: dict[str, SweepPointOut],
    tokens: float | None,
) -> tuple[BranchResult, BranchedCriticalBatch]:
    """The CBS at every checkpoint from its branches, and the warm-up schedule.

    ``outs`` maps child ids to their listed points (marked used or excluded here). Per
    checkpoint and batch size the grid rule keeps the multiplier with the lowest loss at the
    end of the window; a failed branch counts as not within the tolerance."""
    sweep = body.sweep
    steps = _checkpoint_steps(body, children)
    sizes = batch_ladder(sweep)
    window = branch_window(body, sizes)
    tpe = tokens if tokens is not None else tokens_per_example(body)
    finished: dict[tuple[str, int], tuple[SweepPointOut, PointResult]] = {}
    failed: dict[str, set[int]] = {}
    for child in children:
        out = outs[child.id]
        checkpoint = str(child.request.checkpoint)
        b = child.request.point.batch_size
        result = out.result
        if result is None:
            failed.setdefault(checkpoint, set()).add(b)
            continue
        best = finished.get((checkpoint, b))
        if best is None or _compared_loss(result) < _compared_loss(best[1]):
            if best is not None:
                best[0].excluded_reason = "another learning rate ended the window lower"
            finished[(checkpoint, b)] = (out, result)
        else:
            out.excluded_reason = "another learning rate ended the window lower"
    checkpoints_out: list[BranchCheckpoint] = []
    points: list[BranchedBatchPoint] = []
    for checkpoint_id, step in zip(body.checkpoints, steps, strict=True):
        checkpoint = str(checkpoint_id)
        branches = {b: finished[(checkpoint, b)] for b in sizes if (checkpoint, b) in finished}
        lost = {b for b in failed.get(checkpoint, set()) if b not in branches}
        start_loss = next((r.eval_losses[0] for _, r in branches.values()), None)
        entry = BranchCheckpoint(
            checkpoint=checkpoint,
            step=step,
            loss=start_loss,
            reference_batch=sizes[0],
            critical_batch=None,
        )
        checkpoints_out.append(entry)
        if sizes[0] not in branches:
            entry.notes.append(
                f"the reference branch (batch {sizes[0]}) failed: no CBS at this checkpoint"
            )
            continue
        curves = [
            BranchLosses(b, [s * b for s in r.eval_steps], r.eval_losses)
            for b, (_, r) in sorted(branches.items())
        ]
        verdict = critical_batch_from_branches(
            curves, sweep.tolerance, sweep.compare, failed_batches=sorted(lost)
        )
        for out, _ in branches.values():
            out.used_in_fit = True
            out.excluded_reason = None
        has_cbs = verdict.critical_batch is not None
        crossing = eps_crossing(verdict, sweep.tolerance) if has_cbs else None
        fit: EfficiencyFit | None = None
        try:  # failed branches are left out of the fit (they have no loss to place)
            fit = efficiency_fit(curves, sweep.tolerance) if has_cbs else None
        except ValueError as exc:
            entry.notes.append(f"no efficiency fit at this checkpoint: {exc}")
        reach = {p.batch_size: p for p in fit.points} if fit is not None else {}
        entry.efficiency = fit.estimate if fit is not None else None
        entry.crossing = crossing
        entry.critical_batch = verdict.critical_batch
        entry.critical_batch_tokens = (
            None if verdict.critical_batch is None else verdict.critical_batch * tpe
        )
        entry.status = verdict.status
        entry.next_batch = verdict.next_batch
        entry.notes.extend(verdict.notes)
        if lost:
            entry.notes.append(
                f"branch(es) at batch {', '.join(map(str, sorted(lost)))} failed: counted as "
                "not within the tolerance"
            )
        entry.curves = [
            BranchCurve(
                name=out.name,
                batch_size=b,
                lr=r.lr,
                lr_multiplier=r.lr_multiplier,
                tokens=[s * b * tpe for s in r.eval_steps],
                losses=r.eval_losses,
                excess=verdict.excess[b],
                within_tolerance=verdict.within.get(b),
                reference_examples=reach[b].examples if b in reach else None,
                reference_reach=reach[b].reach if b in reach else None,
            )
            for b, (out, r) in sorted(branches.items())
        ]
        points.append(
            BranchedBatchPoint(
                checkpoint=checkpoint,
                step=step,
                loss=start_loss,
                critical_batch=verdict.critical_batch,
                status=verdict.status,
                next_batch=verdict.next_batch,
                efficiency=fit.estimate if fit is not None else None,
                crossing=crossing,
                reason=None if has_cbs else "; ".join(verdict.notes),
            )
        )
    if not points:
        raise JobError(
            "too-few-points",
            "No checkpoint's branches finished",
            "the reference branch (the smallest batch) failed at every checkpoint: "
            + "; ".join(n for c in checkpoints_out for n in c.notes),
        )
    schedule, note = warmup_schedule(points, tpe)
    measured = BranchedCriticalBatch(
        checkpoints=points,
        tolerance=sweep.tolerance,
        compare=sweep.compare,
        window_tokens=window.examples * tpe,
        batch_sizes=sizes,
        lr_rule=lr_rule_text(body, sizes),
    )
    examples = sum(
        int(o.result.steps * o.result.batch_size) for o in outs.values() if o.result is not None
    )
    answer = BranchResult(
        rule=cbs_rule(sweep.tolerance, sweep.compare),
        formula=CBS_FORMULA,
        tolerance=sweep.tolerance,
        compare=sweep.compare,
        window_tokens=window.examples * tpe,
        window_examples=window.examples,
        batch_sizes=sizes,
        lr_rule=measured.lr_rule or "",
        checkpoints=checkpoints_out,
        warmup_schedule=schedule,
        schedule_note=note,
        examples_processed=examples,
        tokens_processed=examples * tpe,
    )
    return answer, measured
