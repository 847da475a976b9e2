"""A sweep point's result from the evaluation losses a training command reported.

An agent sweep's points (``runner: agent``) are trained by the team's own command, which reports
``{step, loss[, examples, tokens]}`` records; this turns them into the same
:class:`~curvplan.types.sweep.PointResult` the built-in loop returns
(``curvplan_worker.sweep.train.train_point``), so the sweep's fit and the budget read both
alike: a batch-sweep point's steps to the target loss, interpolated linearly in loss between
the two evaluations around the first one at or below it (censored when none is); a data-sweep
point's best evaluation and its step. Torch-free (the API runs it).
"""

from __future__ import annotations

from collections.abc import Sequence

from curvplan.types.agents import LossRecord
from curvplan.types.sweep import PointResult, PointSettings


def steps_to_target(steps: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """Steps at which the evaluation loss first reaches ``target``: the first evaluation i with
    loss ≤ target, interpolated linearly in loss from evaluation i−1,
    s = s₍ᵢ₋₁₎ + (L₍ᵢ₋₁₎ − target)/(L₍ᵢ₋₁₎ − Lᵢ)·(sᵢ − s₍ᵢ₋₁₎) (clipped to [s₍ᵢ₋₁₎, sᵢ]); the
    first evaluation's step when it is already there; None when no evaluation reaches it."""
    for i, (step, loss) in enumerate(zip(steps, losses, strict=True)):
        if loss > target:
            continue
        if i == 0:
            return float(step)
        prev_step, prev_loss = steps[i - 1], losses[i - 1]
        drop = prev_loss - loss
        frac = (prev_loss - target) / drop if drop > 0 else 1.0
        return float(prev_step + min(max(frac, 0.0), 1.0) * (step - prev_step))
    return None


def _interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """``ys`` at ``x``, linear between the neighbouring ``xs`` (held at the ends)."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return ys[-1]


def point_result(
    point: PointSettings, records: Sequence[LossRecord], seconds: float
) -> PointResult:
    """The :class:`PointResult` of a point from its command's evaluation records (at least one).

    Records are ordered by step; a step reported twice keeps its last record. ``examples`` of
    the result is the records' own count at the result's step when every record carries one,
    else steps × batch size as the built-in loop counts; ``batch_size_tokens`` is the batch
    size × tokens per example when a record carries both. The command measures no two-batch
    gradient norms, so ``two_batch`` is null (no B_simple from an agent sweep).
    """
    if not records:
        raise ValueError("records: the command reported no evaluation")
    by_step = {r.step: r for r in records}
    ordered = [by_step[s] for s in sorted(by_step)]
    steps = [r.step for r in ordered]
    losses = [r.loss for r in ordered]
    best_index = min(range(len(losses)), key=lambda i: (losses[i], steps[i]))
    reached_at = None
    if point.type == "batch" and point.target_loss is not None:
        reached_at = steps_to_target(steps, losses, point.target_loss)
    if point.type == "batch":
        steps_value = reached_at if reached_at is not None else float(steps[-1])
    elif point.type == "branch":
        steps_value = float(steps[-1])
    else:
        steps_value = float(steps[best_index])
    counted = [r.examples for r in ordered]
    if all(e is not None for e in counted):
        examples = _interpolate(steps_value, steps, [float(e or 0.0) for e in counted])
    else:
        examples = steps_value * point.batch_size
    per_example = next(
        (r.tokens / r.examples for r in reversed(ordered) if r.tokens and r.examples), None
    )
    return PointResult(
        batch_size=point.batch_size,
        batch_size_tokens=None if per_example is None else point.batch_size * per_example,
        lr=point.lr,
        lr_multiplier=point.lr_multiplier,
        data_size=point.data_size,
        reached_target=reached_at is not None,
        censored=point.type == "batch" and reached_at is None,
        steps=steps_value,
        examples=examples,
        best_eval_loss=losses[best_index],
        best_step=steps[best_index],
        eval_steps=steps,
        eval_losses=losses,
        two_batch=None,
        seconds=seconds,
    )
