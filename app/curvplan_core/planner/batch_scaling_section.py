"""budget.batch from the batch scaling law B_crit(D) = c·D^γ for a target run larger than the
pilots (docs/budget.md#batch; the law is fitted in ``batch_scaling``)."""

from __future__ import annotations

import math

from curvplan.types.planner import (
    BatchScalingLawOut,
    BatchSweepFitOut,
    BudgetBatch,
    Measurements,
    Targets,
)
from curvplan_core.planner import formulas
from curvplan_core.planner.batch_scaling import (
    BatchLaw,
    SweepTable,
    extrapolation_warning,
    fit_batch_law,
    law_at,
    sweep_critical_batches,
)
from curvplan_core.planner.batch_section import finite_or_none
from curvplan_core.planner.critical_batch import nearest_power_of_two
from curvplan_core.planner.steps_interval import PROFILE_BOOTSTRAP

LAW_METHOD = (
    "each sweep's B_crit and profile interval from S = S_min(1 + B_crit/B); log B_crit = "
    "log c + γ·log D by weighted least squares (weights 1/(v_i + τ²), v_i from the sweep's "
    "interval, τ² the between-sweep scatter by moments); intervals: parametric bootstrap "
    "over the per-sweep intervals"
)


def _tables(measurements: Measurements) -> tuple[list[SweepTable], str | None]:
    """The sweeps with their batch sizes in examples (tokens ÷ tokens_per_example when the
    tables are in tokens), or the reason they are not in examples."""
    sweeps = measurements.batch_sweeps or []
    per_example = 1.0
    if measurements.steps_to_target_unit == "tokens":
        if measurements.tokens_per_example is None:
            return [], (
                "the batch sweeps' batch sizes are in tokens and measurements."
                "tokens_per_example is unknown: budget.batch is in examples"
            )
        per_example = measurements.tokens_per_example
    tables = [
        SweepTable(
            tokens=sweep.tokens,
            batch_sizes=[p.batch_size / per_example for p in sweep.steps_to_target],
            steps=[p.steps for p in sweep.steps_to_target],
        )
        for sweep in sweeps
    ]
    return tables, None


def batch_from_scaling_law(
    measurements: Measurements, targets: Targets, seed: int
) -> tuple[BudgetBatch | None, list[str]]:
    """budget.batch at targets.target_tokens from B_crit(D) = c·D^γ fitted to
    measurements.batch_sweeps (Zhang et al. 2024; Bergsma et al. 2025; docs/budget.md#batch);
    (None, why) when there is no target, no sweeps, or no law."""
    target = targets.target_tokens
    if target is None or measurements.batch_sweeps is None:
        if target is not None:
            return None, [
                "batch: targets.target_tokens is given but measurements.batch_sweeps is not: "
                "the batch scaling law needs batch sweeps at 2 or more token counts"
            ]
        return None, []
    tables, unit_reason = _tables(measurements)
    if unit_reason is not None:
        return None, [f"batch: no batch scaling law: {unit_reason}"]
    bootstrap = min(targets.bootstrap, PROFILE_BOOTSTRAP)
    sweeps = sweep_critical_batches(tables, targets.confidence, bootstrap=bootstrap, seed=seed)
    law = fit_batch_law(sweeps, targets.confidence, seed=seed)
    if isinstance(law, str):
        return None, [f"batch: no batch scaling law: {law}"]
    return _law_answer(law, target, measurements.tokens_per_example, seed)


def _law_answer(
    law: BatchLaw, target: float, tokens: float | None, seed: int
) -> tuple[BudgetBatch | None, list[str]]:
    """The law's answer at ``target`` tokens: B_crit and its prediction interval, its power
    of two, and the target run's steps D/(B·tokens per example) at that batch."""
    value, ci = law_at(law, target, seed=seed)
    if not math.isfinite(value) or value <= 0:
        return None, [f"batch: the batch scaling law gives no finite B_crit at {target:.4g} tokens"]
    warning = extrapolation_warning(law, target)
    rec = nearest_power_of_two(value)
    steps = None
    if rec is not None and tokens is not None:
        steps = target / (rec * tokens)  # the target run's steps: its tokens ÷ tokens per step
    lo, hi = law.tokens_range
    out = BatchScalingLawOut(
        formula=formulas.BUDGET_BATCH_SCALING_LAW,
        c=finite_or_none(law.c),
        c_ci=(finite_or_none(law.c_ci[0]), finite_or_none(law.c_ci[1])),
        gamma=law.gamma,
        gamma_ci=law.gamma_ci,
        excess_scatter=law.tau,
        measured_tokens_range=law.tokens_range,
        target_tokens=target,
        extrapolation_factor=target / hi,
        sweeps=[
            BatchSweepFitOut(
                tokens=s.tokens,
                b_crit=s.b_crit,
                b_crit_ci=None
                if s.ci is None
                else (finite_or_none(s.ci[0]), finite_or_none(s.ci[1])),
                batch_sizes=s.batch_sizes,
                used=s.used,
                reason=s.reason,
            )
            for s in law.sweeps
        ],
        method=LAW_METHOD,
    )
    critical_ci = (finite_or_none(ci[0]), finite_or_none(ci[1]))
    batch = BudgetBatch(
        recommended=rec,
        recommended_tokens=None if rec is None or tokens is None else rec * tokens,
        critical=value,
        critical_ci=critical_ci,
        critical_tokens=None if tokens is None else value * tokens,
        critical_tokens_ci=None
        if tokens is None
        else (_times(critical_ci[0], tokens), _times(critical_ci[1], tokens)),
        tokens_per_example=tokens,
        source="batch_scaling_law",
        basis=f"B_crit(D) = c·D^γ fitted to batch sweeps at {len(law.sweeps)} token counts "
        f"({lo:.4g}–{hi:.4g} tokens), evaluated at the target run's {target:.4g} tokens "
        "(critical batch as a power law in the data, Zhang et al. 2024; Bergsma et al. 2025)",
        target_loss=None,  # each sweep timed its own target loss; the law is over tokens
        expected_steps=steps,
        expected_steps_formula=None if steps is None else formulas.BUDGET_TARGET_RUN_STEPS,
        expected_examples=None if steps is None or rec is None else steps * rec,
        reason=None if steps is not None else "expected steps need tokens_per_example",
        scaling_law=out,
    )
    return batch, [] if warning is None else [warning]


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor
