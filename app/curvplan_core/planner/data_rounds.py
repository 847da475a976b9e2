"""Data-sweep rounds: is the target bracketed by the measured sizes, and if not, which sizes
the next round trains (docs/budget.md#data-sweep).

The size for the target, D* from L(D) = E + A·D^(−β) (Kaplan et al. 2020, eq. 1.4 form),
counts as measured when it lies within :data:`EXTRAPOLATION_LIMIT` of the measured sizes:
D_min/1.5 ≤ D* ≤ 1.5·D_max. Beyond that budget.data shows it as ``extrapolated`` and the next
round halves below the smallest size (D* below) or doubles above the largest (D* above),
as many steps as reach D*, at most ``per_round``. Without a finite D* (the fit does not reach
the target, or no fit), the measured losses decide: all above the target → double above;
all at or below → halve below; on both sides → nothing more to measure.

Torch-free: the planner (budget.data's next step) and the sweep kind's fan-in (its next
round) share it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

EXTRAPOLATION_LIMIT = 1.5
"""D* more than this factor outside the measured sizes is ``extrapolated``."""

SIZE_FACTOR = 2
"""A next round's sizes halve (below) or double (above) from the nearest measured size."""

Side = Literal["below", "above"]


@dataclass(frozen=True)
class NextRound:
    """What a next round trains: the side, its new sizes (empty: none can be trained, the
    reason says why) and why it is needed."""

    side: Side
    sizes: list[int]
    reason: str


def extrapolation_side(d_star: float, sizes: Sequence[float]) -> Side | None:
    """``below`` when D* < D_min / 1.5, ``above`` when D* > 1.5 · D_max, else None."""
    lo, hi = min(sizes), max(sizes)
    if d_star < lo / EXTRAPOLATION_LIMIT:
        return "below"
    if d_star > hi * EXTRAPOLATION_LIMIT:
        return "above"
    return None


def next_round(
    sizes: Sequence[float],
    losses: Sequence[float],
    target: float | None,
    d_star: float | None,
    *,
    min_size: int = 2,
    max_size: int | None = None,
    per_round: int = 3,
) -> NextRound | None:
    """The next round of a data sweep, or None when the target is bracketed (or there is no
    target). ``sizes``/``losses``: every measured size and its L(D); ``d_star``: the fitted
    size for ``target`` (None or non-finite: the fit gives none); ``min_size``: the smallest
    trainable subset (the batch size); ``max_size``: the training data's size (None: any)."""
    if target is None or not sizes:
        return None
    lo, hi = int(min(sizes)), int(max(sizes))
    goal: float | None = None
    if d_star is not None and math.isfinite(d_star) and d_star > 0:
        side = extrapolation_side(d_star, sizes)
        if side is None:
            return None
        goal = d_star
        why = (
            f"the fitted size for the target, {d_star:,.0f} examples, is more than "
            f"{EXTRAPOLATION_LIMIT:g}× "
            + (f"below the smallest measured size {lo:,}" if side == "below" else "")
            + (f"above the largest measured size {hi:,}" if side == "above" else "")
        )
    elif all(loss > target for loss in losses):
        side = "above"
        why = (
            f"every measured loss is above the target {target:.4g} and the fit gives no size for it"
        )
    elif all(loss <= target for loss in losses):
        side = "below"
        why = f"every measured loss is at or below the target {target:.4g}"
    else:
        return None
    new: list[int] = []
    if side == "above":
        size = hi
        while len(new) < per_round and (goal is None or size < goal):
            size *= SIZE_FACTOR
            if max_size is not None and size > max_size:
                if max_size > hi and (not new or new[-1] < max_size):
                    new.append(max_size)  # the whole training set, the largest there is
                break
            new.append(size)
        if not new:
            why += f"; the training data has no more than {hi:,} examples: more data is needed"
    else:
        size = lo
        while len(new) < per_round and (goal is None or size > goal):
            size //= SIZE_FACTOR
            if size < min_size:
                break
            new.append(size)
        if not new:
            why += f"; no subset below {lo:,} examples is trainable (batch size {min_size})"
    measured = {int(s) for s in sizes}
    return NextRound(side=side, sizes=sorted({s for s in new if s not in measured}), reason=why)
