"""The critical batch size by branched training (Merrill et al. 2025), and the warm-up schedule.

Merrill, Arora, Groeneveld & Hajishirzi 2025, "Critical Batch Size Revisited: A Simple
Empirical Approach to Large-Batch Language Model Training" (arXiv 2505.23971): from a
checkpoint of a training run, branches train at batch sizes B for the same token window;
the critical batch size (CBS) there is the largest B whose loss keeps up with the small
batch's. Over the checkpoints the CBS grows, which is what a batch-size warm-up follows.

The ladder CBS can only be a swept batch (a power of two), so beside it two continuous
numbers come from the same curves: the token-efficiency fit (:func:`efficiency_fit`,
McCandlish et al. 2018, eq. 2.11) and the ε-crossing in log B (:func:`eps_crossing`).
``BRANCH_LEAD`` says which of them is the branch sweep's critical batch in budget.batch (which
the branch sweep leads only when no batch sweep or noise-scale trend is given:
``budget_section.BATCH_SOURCE_ORDER``).

Pure functions of loss curves (no numpy, no torch): the sweep's fan-in calls
:func:`critical_batch_from_branches` on its branches' evaluation losses, the budget calls
:func:`warmup_schedule` on the per-checkpoint CBS (docs/budget.md#branch-sweep).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from curvplan.types.planner import (
    BatchWarmupStage,
    BCrit,
    BranchedBatchEstimate,
    BranchedBatchPoint,
    BranchedCriticalBatch,
    BranchEstimateMethod,
    BranchPointStatus,
    BranchStatus,
    BudgetBatch,
    ReferenceReach,
)
from curvplan_core.planner import formulas

Compare = Literal["end", "window"]

#: Relative slack of the ≤ ε comparison: an excess equal to ε up to float rounding is within.
TIE_SLACK = 1e-9

CBS_FORMULA = formulas.BUDGET_BRANCHED_CBS
EFFICIENCY_FORMULA = formulas.BUDGET_BRANCHED_EFFICIENCY
CROSSING_FORMULA = formulas.BUDGET_BRANCHED_CROSSING

#: Which branch-sweep number is budget.batch's `critical`, decided by the predictive benchmark
#: against a brute-force B_crit (docs/budget.md#what-leads-budgetbatch,
#: benchmarks/results/predictive-branch-20261203-0640.md; one seed): at the latest checkpoint
#: the ε-crossing read 28.9 against 26.3, the ladder 16, the efficiency fit 65.
BRANCH_LEAD: BranchEstimateMethod = "eps_crossing"

#: The efficiency fit searches B_c over [B₀/SEARCH_SPAN, B_max·SEARCH_SPAN] (log-spaced grid,
#: then golden section); a minimum at either end is a bound (at_most / at_least), not a value.
SEARCH_SPAN = 100.0
_GRID = 400


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
    """The CBS at one checkpoint and how each batch compared with the reference
    (``critical_batch`` None and ``within`` empty when the status is not_measured)."""

    critical_batch: int | None
    status: BranchPointStatus
    next_batch: int | None
    reference_batch: int
    excess: dict[int, float | None]
    within: dict[int, bool]
    notes: list[str] = field(default_factory=list)


def no_progress_reason(reference: BranchLosses, tolerance: float) -> str | None:
    """Why the CBS cannot be measured from ``reference``'s window, or None when it can.

    The rule of Merrill et al. (2025) asks whether a batch keeps up with the smallest one
    within ε. When the smallest batch's own loss falls by ε or less over the window (from its
    first evaluation, the checkpoint's loss, to its last), a batch that made no progress at
    all is within ε of it: every batch "keeps up" and the ladder says nothing. Such a
    checkpoint is not_measured, with its measured losses in the reason."""
    start, end = float(reference.losses[0]), float(reference.losses[-1])
    progress = start - end
    if progress > tolerance * (1 + TIE_SLACK):
        return None
    moved = f"fell by {progress:.4g}" if progress > 0 else f"rose by {-progress:.4g}"
    return (
        f"not measured: the reference batch {reference.batch_size} made no progress over the "
        f"window (its loss went {start:.4f} → {end:.4f}, it {moved}, not more than ε = "
        f"{tolerance:g}), so every batch is trivially within ε of it; a longer window "
        "(more tokens) or an earlier checkpoint measures the CBS"
    )


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
    swept batch is within, ``at_most`` when no batch above B₀ is, ``not_measured`` (no
    CBS, the reason in ``notes``) when B₀ itself made no progress over the window
    (:func:`no_progress_reason`), else ``measured`` (the CBS lies in [critical_batch,
    next_batch)).
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
    unmeasured = no_progress_reason(reference, tolerance)
    if unmeasured is not None:
        return BranchVerdict(
            critical_batch=None,
            status="not_measured",
            next_batch=None,
            reference_batch=reference_batch,
            excess=excess,
            within={},
            notes=[unmeasured],
        )
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


@dataclass(frozen=True, slots=True)
class EquivalentExamples:
    """e_B: the examples the reference (smallest) batch needed to reach batch B's loss at the
    end of the window, clipped to [0, window], and how it was reached."""

    batch_size: int
    loss: float
    examples: float
    reach: ReferenceReach


@dataclass(slots=True)
class EfficiencyFit:
    """B_c of E/e_B = (B_c + B)/(B_c + B₀) at one checkpoint (see :func:`efficiency_fit`)."""

    estimate: BranchedBatchEstimate
    points: list[EquivalentExamples]
    per_batch: dict[int, float | None]


def pchip_slopes(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """Derivatives of the monotone piecewise-cubic Hermite interpolant (Fritsch & Carlson 1980,
    "Monotone Piecewise Cubic Interpolation", SIAM J. Numer. Anal. 17(2); the weighted harmonic
    mean of Fritsch & Butland 1984 inside, the three-point end formula limited as in Moler's
    pchip): 0 at a local extremum, so each piece is monotone between its two points and
    never overshoots them."""
    n = len(xs)
    h = [xs[i + 1] - xs[i] for i in range(n - 1)]
    d = [(ys[i + 1] - ys[i]) / h[i] for i in range(n - 1)]
    if n == 2:
        return [d[0], d[0]]
    m = [0.0] * n
    for k in range(1, n - 1):
        if d[k - 1] * d[k] > 0:
            w1, w2 = 2 * h[k] + h[k - 1], h[k] + 2 * h[k - 1]
            m[k] = (w1 + w2) / (w1 / d[k - 1] + w2 / d[k])

    def end(h0: float, h1: float, d0: float, d1: float) -> float:
        v = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
        if v * d0 <= 0:
            return 0.0
        if d0 * d1 <= 0 and abs(v) > 3 * abs(d0):
            return 3 * d0
        return v

    m[0], m[-1] = end(h[0], h[1], d[0], d[1]), end(h[-1], h[-2], d[-1], d[-2])
    return m


def _hermite(x0: float, x1: float, y0: float, y1: float, m0: float, m1: float, x: float) -> float:
    h = x1 - x0
    t = (x - x0) / h
    return (
        (2 * t**3 - 3 * t**2 + 1) * y0
        + (t**3 - 2 * t**2 + t) * h * m0
        + (-2 * t**3 + 3 * t**2) * y1
        + (t**3 - t**2) * h * m1
    )


def reference_examples(reference: BranchLosses, loss: float) -> tuple[float, ReferenceReach]:
    """First passage of the reference's loss-vs-examples curve to ``loss``, clipped to the
    window: the curve through its evaluations (its loss at 0 examples the checkpoint's) is the
    monotone cubic interpolant (:func:`pchip_slopes`), which follows a bending loss curve
    where straight chords read the passage late (on L = a + b/(1 + e/c) with four evaluations
    the chords put B_c up to 42 % high, the cubic within a few per cent).

    ``not_reached`` (0 examples) when ``loss`` is at or above the checkpoint's loss;
    ``kept_up`` (the window) when the reference is not below it before the window's end."""
    xs = [float(x) for x in reference.examples]
    ls = [float(v) for v in reference.losses]
    if len(xs) < 2 or xs[0] != 0:
        raise ValueError("the reference branch needs its loss at the checkpoint (0 examples)")
    window = xs[-1]
    if loss >= ls[0]:
        return 0.0, "not_reached"
    slopes = pchip_slopes(xs, ls)
    for k in range(len(xs) - 1):
        if ls[k + 1] <= loss < ls[k]:  # each piece is monotone: bisect it
            a, b = xs[k], xs[k + 1]
            for _ in range(100):
                mid = (a + b) / 2
                value = _hermite(xs[k], xs[k + 1], ls[k], ls[k + 1], slopes[k], slopes[k + 1], mid)
                a, b = (mid, b) if value > loss else (a, mid)
            e = (a + b) / 2
            if e >= window * (1 - TIE_SLACK):
                break
            return e, "inside"
    return window, "kept_up"


def _model(b_c: float, b0: int, b: int) -> float:
    """e_B/E = (B_c + B₀)/(B_c + B); B_c = inf gives 1 (every batch keeps up)."""
    return 1.0 if math.isinf(b_c) else (b_c + b0) / (b_c + b)


def _least_squares(ratios: Sequence[tuple[int, float]], b0: int, b_max: int) -> float:
    """argmin over B_c ∈ {0} ∪ [B₀/SPAN, B_max·SPAN] ∪ {inf} of Σ (e_B/E − model)²."""

    def sse(b_c: float) -> float:
        return sum((r - _model(b_c, b0, b)) ** 2 for b, r in ratios)

    lo, hi = math.log(b0 / SEARCH_SPAN), math.log(b_max * SEARCH_SPAN)
    grid = [lo + (hi - lo) * i / _GRID for i in range(_GRID + 1)]
    values = [sse(math.exp(t)) for t in grid]
    i = min(range(len(grid)), key=values.__getitem__)
    if i == 0 and sse(0.0) <= values[0]:
        return 0.0
    if i == len(grid) - 1 and sse(math.inf) <= values[-1]:
        return math.inf
    a, c = grid[max(i - 1, 0)], grid[min(i + 1, _GRID)]
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(80):  # golden section on log B_c inside the grid's bracket
        x1, x2 = c - golden * (c - a), a + golden * (c - a)
        if sse(math.exp(x1)) <= sse(math.exp(x2)):
            c = x2
        else:
            a = x1
    return math.exp((a + c) / 2)


def efficiency_fit(branches: Sequence[BranchLosses], tolerance: float) -> EfficiencyFit:
    """B_c from the token efficiency of the branches (McCandlish et al. 2018, eq. 2.11:
    E = E_min(1 + B/B_crit), the examples a batch B needs for a given progress).

    For every larger batch B, e_B = the examples the smallest batch B₀ needed to reach the
    loss B reached after the whole window E (:func:`reference_examples`, the monotone cubic
    through the reference's evaluations); at equal progress
    eq. 2.11 gives E/e_B = (B_c + B)/(B_c + B₀). B_c is the least-squares fit of
    e_B/E = (B_c + B₀)/(B_c + B) over the swept B (residuals in e_B/E: the measured quantity,
    bounded in [0, 1]). A branch the reference did not catch within the window (``kept_up``,
    e_B ≥ E) enters at e_B = E and one that ended at or above the checkpoint's loss
    (``not_reached``, e_B ≤ 0) at 0: each at the bound nearest the model. The bracket is the
    same fit with every larger batch's final loss moved by +ε (low) and −ε (high), ε
    ``tolerance``: how far the loss resolution moves it, not a confidence interval. status:
    ``measured`` for a finite B_c > 0; ``at_least`` when the fit runs to B_c → inf (every batch
    kept up: value = the bracket's low end, or the largest swept batch); ``at_most`` when it
    runs to B_c → 0 (value = the high end, or the smallest swept batch).
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    ordered = sorted(branches, key=lambda br: br.batch_size)
    if len(ordered) < 2 or len({br.batch_size for br in ordered}) != len(ordered):
        raise ValueError("an efficiency fit needs branches at two batch sizes at least, one each")
    reference, larger = ordered[0], ordered[1:]
    b0, b_max = reference.batch_size, larger[-1].batch_size
    window = float(reference.examples[-1])
    if not window > 0:
        raise ValueError("the reference branch has no evaluation after the checkpoint")
    finals = {br.batch_size: _loss_at(br, window) for br in larger}

    def fit(shift: float) -> tuple[float, list[EquivalentExamples]]:
        points = []
        for b, final in finals.items():
            e, reach = reference_examples(reference, final + shift)
            points.append(EquivalentExamples(b, final + shift, e, reach))
        return _least_squares(
            [(p.batch_size, p.examples / window) for p in points], b0, b_max
        ), points

    b_c, points = fit(0.0)
    low, _ = fit(tolerance)
    high, _ = fit(-tolerance)
    low, high = min(low, b_c), max(high, b_c)
    residuals = [p.examples / window - _model(b_c, b0, p.batch_size) for p in points]
    status: BranchStatus
    lo_end = low if 0 < low < math.inf else None
    hi_end = high if 0 < high < math.inf else None
    if math.isinf(b_c):
        status, lo_end, hi_end = "at_least", lo_end or float(b_max), None
        value = lo_end
    elif b_c == 0:
        status, lo_end, hi_end = "at_most", None, hi_end or float(b0)
        value = hi_end
    else:
        status, value = "measured", b_c
    per_batch: dict[int, float | None] = {}
    for p in points:  # the one-point solution B_c = (B − r·B₀)/(r − 1), r = E/e_B
        if p.reach == "kept_up":
            per_batch[p.batch_size] = None
        elif p.reach == "not_reached":
            per_batch[p.batch_size] = 0.0
        else:
            r = window / p.examples
            per_batch[p.batch_size] = max(0.0, (p.batch_size - r * b0) / (r - 1))
    return EfficiencyFit(
        estimate=BranchedBatchEstimate(
            method="efficiency_fit",
            value=value,
            status=status,
            low=None if lo_end is None else float(lo_end),
            high=None if hi_end is None else float(hi_end),
            formula=EFFICIENCY_FORMULA,
            rms_residual=math.sqrt(sum(r * r for r in residuals) / len(residuals)),
        ),
        points=points,
        per_batch=per_batch,
    )


def eps_crossing(verdict: BranchVerdict, tolerance: float) -> BranchedBatchEstimate:
    """The batch where the excess over the smallest batch crosses ε, linear in log B between
    the ladder CBS B_k (excess x_k ≤ ε) and the next swept batch B_k+1 (x_k+1 > ε):
    log B_ε = log B_k + (ε − x_k)/(x_k+1 − x_k)·log(B_k+1/B_k), x the excess the rule compared
    (at the end of the window; the largest over it for ``compare="window"``). Status and
    bracket are the ladder's (Merrill et al. 2025's rule); a bound (at_least, at_most) or a
    failed next branch keeps the ladder value. A not_measured verdict has none (ValueError)."""
    b_k, nxt = verdict.critical_batch, verdict.next_batch
    if b_k is None or verdict.status == "not_measured":
        raise ValueError("the CBS is not measured at this checkpoint: no ε-crossing")
    low = None if verdict.status == "at_most" else float(b_k)
    high = None if nxt is None else float(nxt)
    value = float(b_k)
    x_k = verdict.excess.get(b_k)
    x_n = None if nxt is None else verdict.excess.get(nxt)
    if verdict.status == "measured" and x_k is not None and x_n is not None and x_n > x_k:
        assert nxt is not None
        frac = min(1.0, max(0.0, (tolerance - x_k) / (x_n - x_k)))
        value = math.exp(math.log(b_k) + frac * math.log(nxt / b_k))
    status: BranchStatus = verdict.status
    return BranchedBatchEstimate(
        method="eps_crossing",
        value=value,
        status=status,
        low=low,
        high=high,
        formula=CROSSING_FORMULA,
    )


def ladder_estimate(point: BranchedBatchPoint) -> BranchedBatchEstimate:
    """The ladder CBS (Merrill et al. 2025) as an estimate beside the others (a measured
    checkpoint's: ValueError for a not_measured one)."""
    if point.critical_batch is None or point.status == "not_measured":
        raise ValueError("the CBS is not measured at this checkpoint")
    status: BranchStatus = point.status
    return BranchedBatchEstimate(
        method="ladder",
        value=float(point.critical_batch),
        status=status,
        low=None if point.status == "at_most" else float(point.critical_batch),
        high=None if point.next_batch is None else float(point.next_batch),
        formula=CBS_FORMULA,
    )


def _in_step_order(points: Sequence[BranchedBatchPoint]) -> list[BranchedBatchPoint]:
    """Checkpoints by step; those without one after the others, in their given order."""
    ordered = sorted(
        enumerate(points),
        key=lambda ip: (ip[1].step is None, ip[1].step if ip[1].step is not None else 0, ip[0]),
    )
    return [p for _, p in ordered]


def nearest_power_of_two(value: float) -> int:
    """2^round(log₂ value), ties down (a batch size from a continuous estimate)."""
    if not value > 0:
        raise ValueError(f"a batch size must be > 0, got {value}")
    exponent = math.log2(value)
    low = math.floor(exponent)
    return int(2 ** (low if exponent - low <= 0.5 else low + 1))


def leading_estimate(
    point: BranchedBatchPoint, lead: BranchEstimateMethod = BRANCH_LEAD
) -> BranchedBatchEstimate:
    """The estimate ``lead`` at a checkpoint; the ladder CBS when that one is missing (a
    checkpoint measured before the continuous estimates existed, or without a fit)."""
    found = {"efficiency_fit": point.efficiency, "eps_crossing": point.crossing}.get(lead)
    return found if found is not None else ladder_estimate(point)


def lead_batch(point: BranchedBatchPoint, lead: BranchEstimateMethod = BRANCH_LEAD) -> int:
    """The batch to train at from a checkpoint: the ladder CBS itself when it leads, else the
    power of two nearest the leading continuous estimate."""
    estimate = leading_estimate(point, lead)
    if estimate.method == "ladder":
        return int(estimate.value)
    return nearest_power_of_two(estimate.value)


def measured_points(points: Sequence[BranchedBatchPoint]) -> list[BranchedBatchPoint]:
    """The checkpoints with a CBS (not not_measured), in step order."""
    return [p for p in _in_step_order(points) if p.status != "not_measured"]


def warmup_schedule(
    points: Sequence[BranchedBatchPoint],
    tokens_per_example: float | None = None,
    lead: BranchEstimateMethod = BRANCH_LEAD,
) -> tuple[list[BatchWarmupStage], str]:
    """The batch-size warm-up over training: from each checkpoint's step on, its CBS (the
    batch of ``lead``'s estimate, :func:`lead_batch`).

    Stages in step order (checkpoints without a step keep their given order, after the
    others), consecutive equal batches merged into the earlier stage. The CBS is near 0 at
    initialisation and grows, then plateaus (Merrill et al. 2025, §4), so a warm-up starts
    small and doubles as the CBS grows (their §5). Returns the stages and a note: what
    holds before the first measured step, and where the measured CBS decreases. A
    not_measured checkpoint gives no stage; none measured: no stages.
    """
    stages: list[BatchWarmupStage] = []
    unmeasured = [p for p in points if p.status == "not_measured"]
    skipped = (
        "no CBS at "
        + ", ".join(_where(p) for p in _in_step_order(unmeasured))
        + " (the smallest batch made no progress over the window): no stage there"
        if unmeasured
        else None
    )
    for p in measured_points(points):
        batch = lead_batch(p, lead)
        if stages and stages[-1].batch_size == batch:
            continue
        stages.append(
            BatchWarmupStage(
                from_step=p.step,
                batch_size=batch,
                batch_size_tokens=None
                if tokens_per_example is None
                else batch * tokens_per_example,
                status=leading_estimate(p, lead).status,
                loss=p.loss,
            )
        )
    if not stages:
        return [], skipped or "no checkpoint"
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
    if skipped is not None:
        notes.append(skipped)
    return stages, "; ".join(notes)


def _where(point: BranchedBatchPoint) -> str:
    return f"step {point.step}" if point.step is not None else "a checkpoint without a step"


def branch_budget_batch(
    measurements: BranchedCriticalBatch,
    *,
    target_loss: float | None,
    tokens_per_example: float | None,
    batch_sweep: BCrit | None = None,
    expected_steps_formula: str | None = None,
    lead: BranchEstimateMethod = BRANCH_LEAD,
) -> tuple[BudgetBatch | None, list[str]]:
    """budget.batch from a branch sweep: the estimate ``lead`` (``BRANCH_LEAD``, decided by
    the predictive benchmark) at the latest measured checkpoint is `critical` (the batch for
    the rest of training), the warm-up schedule beside it (docs/budget.md#branch-sweep).
    `recommended` is the ladder CBS when the ladder leads, else the power of two nearest the
    leading estimate; every estimate of that checkpoint is listed in `branch_estimates`.

    A batch sweep given as well keeps its B_crit out of the lead but gives the expected steps
    at the recommended batch, S = S_min·(1 + B_crit/B) (McCandlish et al. 2018, eq. 2.11).

    Checkpoints where the CBS is not measured (the smallest batch made no progress over the
    window) give nothing: later ones are named in a warning; none measured: no batch (None)."""
    stages, note = warmup_schedule(measurements.checkpoints, tokens_per_example, lead)
    ordered = _in_step_order(measurements.checkpoints)
    measured = measured_points(ordered)
    warnings: list[str] = []
    if not measured:
        reasons = "; ".join(f"{_where(p)}: {p.reason}" for p in ordered if p.reason)
        warnings.append(f"batch: the branch sweep measured no CBS at any checkpoint ({reasons})")
        return None, warnings
    latest = measured[-1]
    later = ordered[ordered.index(latest) + 1 :]
    if later:
        warnings.append(
            "batch: the branch sweep's CBS is not measured at "
            + ", ".join(_where(p) for p in later)
            + f" (the smallest batch made no progress over the window); {_where(latest)}, "
            "the latest measured checkpoint, gives the branch sweep's critical batch"
        )
    estimate = leading_estimate(latest, lead)
    estimates = [ladder_estimate(latest)] + [
        e for e in (latest.efficiency, latest.crossing) if e is not None
    ]
    rec = lead_batch(latest, lead)
    bracket: tuple[int | None, int | None] | None
    if estimate.method == "efficiency_fit":
        bracket = None  # its bracket is not between swept batches: see branch_estimates
    elif latest.status == "at_most":
        bracket = (None, latest.next_batch)
    else:
        bracket = (latest.critical_batch, latest.next_batch)
    where = f"step {latest.step}" if latest.step is not None else "the latest checkpoint"
    if estimate.method != lead:
        warnings.append(
            f"batch: the checkpoint at {where} carries no {lead} estimate: the ladder CBS leads"
        )
    if latest.status == "at_least":
        warnings.append(
            f"batch: at {where} even the largest swept batch {latest.critical_batch} stayed "
            "within ε: the CBS is at least that; a branch sweep with larger batches brackets it"
        )
    elif latest.status == "at_most":
        warnings.append(
            f"batch: at {where} no batch above the smallest ({latest.critical_batch}) stayed "
            f"within ε: the CBS is below {latest.next_batch}; a branch sweep with smaller "
            "batches brackets it"
        )
    if estimate.method == "efficiency_fit" and estimate.status != "measured":
        warnings.append(
            f"batch: at {where} the efficiency fit gives only a bound ({estimate.status} "
            f"{estimate.value:.4g})"
        )
    steps = None
    if batch_sweep is not None and batch_sweep.unit == "examples":
        steps = batch_sweep.s_min * (1 + batch_sweep.value / rec)
        ratio = estimate.value / batch_sweep.value
        if not 0.5 <= ratio <= 2:
            warnings.append(
                f"batch: the branched critical batch {estimate.value:.4g} and the batch sweep's "
                f"B_crit {batch_sweep.value:.4g} differ by {max(ratio, 1 / ratio):.2g}× (they "
                "measure different things: keeping up over a window from a checkpoint, and the "
                "steps to the target from the sweep's start)"
            )
    rec_tok = None if tokens_per_example is None else rec * tokens_per_example
    crit_tok = None if tokens_per_example is None else estimate.value * tokens_per_example
    window = (
        f"{measurements.window_tokens:,.0f} tokens"
        if measurements.window_tokens is not None
        else "a fixed token window"
    )
    how = {
        "ladder": "the ladder CBS leads and is the recommended batch",
        "eps_crossing": "the ε-crossing interpolated in log B between the ladder CBS and the "
        "next swept batch leads (budget.branched_crossing); recommended is the power of two "
        "nearest it",
        "efficiency_fit": "the token-efficiency fit E/e_B = (B_c + B)/(B_c + B₀) leads "
        "(budget.branched_efficiency); recommended is the power of two nearest it",
    }[estimate.method]
    basis = (
        f"branched training from {len(measurements.checkpoints)} checkpoint(s) at batches "
        f"{', '.join(map(str, measurements.batch_sizes))}, each for {window}: "
        f"{cbs_rule(measurements.tolerance, measurements.compare)}; at {where} {how}; the "
        f"warm-up schedule gives the earlier steps ({note})"
    )
    return (
        BudgetBatch(
            recommended=rec,
            recommended_tokens=rec_tok,
            critical=estimate.value,
            critical_ci=None,
            critical_tokens=crit_tok,
            tokens_per_example=tokens_per_example,
            source="branch_sweep",
            basis=basis,
            critical_formula=estimate.formula,
            critical_bracket=bracket,
            warmup_schedule=stages,
            critical_method=estimate.method,
            branch_estimates=estimates,
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
