"""Assemble a Recommendation from validated measurements and targets (docs/formulas.md)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from curvplan.types.planner import (
    CurvatureSection,
    Measurements,
    Missing,
    NotComputed,
    PlanInputError,
    Recommendation,
    Targets,
    check_workload,
)
from curvplan_core.planner import formulas
from curvplan_core.planner.batch_section import build_batch_section, lr_scaling_at
from curvplan_core.planner.budget_section import CommandFlags, build_budget, default_targets
from curvplan_core.planner.curvature import summarize_blocks
from curvplan_core.planner.sample_size_section import build_sample_size_section
from curvplan_core.planner.scaling_section import build_scaling_section
from curvplan_core.planner.warning_log import WarningLog

# Assumption 1 (shared minimiser) is flagged when the neglected first-order Taylor term |∇L|·R
# exceeds this fraction of the kept second-order bound M·R²/2.
ASSUMPTION1_RATIO_LIMIT = 0.1


def make_plan(
    measurements: Measurements,
    targets: Targets,
    *,
    seed: int = 0,
    flags: CommandFlags | None = None,
) -> Recommendation:
    """Turn curvature measurements into a data budget (docs/formulas.md).

    Every section holds values or a `not_computed` reason; `targets.seed`, when given, overrides
    `seed`. Deterministic for a given seed. ``flags`` say how an analysis was submitted, so
    that its next-step commands repeat those flags (default: a reference spec's). Raises
    `PlanInputError` (naming the field) when the
    input exceeds the size cap of `check_workload`, or when numbers at the edges of the
    contract's range (``MIN_MAGNITUDE`` … ``MAX_MAGNITUDE``) take a formula or a fit beyond
    float64 (:func:`_beyond_float64`): the job then ends ``invalid-request`` naming the input,
    never ``internal-error``. An optional output beyond float64 is null (its JSON form).
    """
    check_workload(measurements, targets)
    try:
        assembled = _assemble(measurements, targets, seed=seed, flags=flags)
        # The plan is what its JSON carries: an optional number beyond float64 (2/λ_max of a
        # λ_max near the smallest double) is null there, as every reader sees it; a required
        # one fails validation here. The worker stores this, so it is storable as jsonb.
        recommendation = Recommendation.model_validate_json(assembled.model_dump_json())
    except (ArithmeticError, ValueError) as exc:
        raise _beyond_float64(measurements, targets, exc) from exc
    return recommendation


#: Inputs whose magnitudes all lie in this band never take the planner beyond float64; a
#: numeric failure with none outside it is a bug, and stays an internal error.
_SAFE_MAGNITUDES = (1e-30, 1e30)


def _beyond_float64(
    measurements: Measurements, targets: Targets, exc: Exception
) -> PlanInputError | Exception:
    """The answer to a numeric failure: a `PlanInputError` naming the most extreme input when
    some input lies outside :data:`_SAFE_MAGNITUDES`, else the failure itself (a bug)."""
    low, high = _SAFE_MAGNITUDES
    worst: tuple[float, str] | None = None
    for name, model in (("measurements", measurements), ("targets", targets)):
        for path, value in _numbers(model.model_dump(), (name,)):
            if value == 0 or low <= abs(value) <= high:
                continue
            distance = abs(math.log10(abs(value)))
            if worst is None or distance > worst[0]:
                worst = (distance, ".".join(map(str, path)))
    if worst is None:
        return exc
    return PlanInputError(
        worst[1],
        "the planner's formulas and fits leave float64 with numbers of these magnitudes "
        f"({type(exc).__name__}: {str(exc)[:120]}); rescale the units so that the inputs "
        f"lie between {low:g} and {high:g}",
    )


def _numbers(
    value: object, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], float]]:
    if isinstance(value, float):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, (*path, key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _numbers(item, (*path, index))


def _assemble(
    measurements: Measurements, targets: Targets, *, seed: int, flags: CommandFlags | None
) -> Recommendation:
    effective_seed = targets.seed if targets.seed is not None else seed
    targets, defaults = default_targets(measurements, targets)
    log = WarningLog()
    _theory_warning(measurements, log)
    sample_size = build_sample_size_section(measurements, targets, effective_seed, log)
    batch_size = build_batch_section(measurements, targets, effective_seed, log)
    scaling, solved = build_scaling_section(measurements, targets, effective_seed, log)
    curvature = _curvature_section(measurements, targets, log)
    budget = build_budget(
        measurements,
        targets,
        defaults,
        sample_size=sample_size,
        batch_size=batch_size,
        scaling=scaling,
        solved=solved,
        curvature=curvature,
        seed=effective_seed,
        flags=flags,
    )
    batch_size = lr_scaling_at(batch_size, budget.batch.recommended)
    return Recommendation(
        budget=budget,
        sample_size=sample_size,
        batch_size=batch_size,
        scaling=scaling,
        curvature=curvature,
        warnings=log.items,
        seed=effective_seed,
    )


def _theory_warning(measurements: Measurements, log: WarningLog) -> None:
    theory = measurements.theory
    if theory is None or theory.applicable:
        return
    reasons = "; ".join(theory.reasons) if theory.reasons else "no reason given"
    log.add(
        "theory_assumptions_not_met",
        "sample_size",
        f"the model is outside the assumptions of Petrov et al. 2025 ({reasons}): the Theorem 7 "
        "k* and the theoretical bounds are indicative only; the empirical k* (from the measured "
        "losses) does not rely on them",
    )


def _hessian_bound(measurements: Measurements) -> float | None:
    if measurements.hessian_norm_bound is not None:
        return measurements.hessian_norm_bound
    if measurements.per_sample_hessian_norms is not None:
        return max(measurements.per_sample_hessian_norms)
    return None


def _curvature_section(
    measurements: Measurements, targets: Targets, log: WarningLog
) -> CurvatureSection | NotComputed:
    blocks = measurements.blocks
    grad_norm = measurements.gradient_norm_at_w_star
    rms = measurements.per_sample_gradient_rms
    if blocks is None and grad_norm is None and rms is None:
        return NotComputed(
            reason="none of measurements.blocks, gradient_norm_at_w_star, "
            "per_sample_gradient_rms given"
        )
    if blocks is not None:
        section, negative = summarize_blocks(blocks)
        if negative:
            log.add(
                "negative_curvature",
                "curvature",
                f"λ_min < 0 in block(s) {', '.join(negative)}: w* is not a minimum there, so the "
                "Theorem 7 bound (which assumes a minimum) does not apply as stated",
            )
    else:
        section = CurvatureSection(
            missing=[Missing(item="blocks", reason="measurements.blocks not given")]
        )
    if grad_norm is None and rms is None:
        return section
    updates: dict[str, object] = {
        "gradient_norm_at_w_star": grad_norm,
        "per_sample_gradient_rms": rms,
    }
    m_bound = _hessian_bound(measurements)
    radius = targets.radius
    missing = list(section.missing)
    if m_bound is not None and m_bound > 0 and radius is not None and radius > 0:
        if grad_norm is not None:
            updates["assumption1_mean_gradient_ratio"] = 2.0 * grad_norm / (m_bound * radius)
        if rms is not None:
            ratio = 2.0 * rms / (m_bound * radius)
            updates["assumption1_ratio"] = ratio
            updates["assumption1_formula"] = formulas.ASSUMPTION1
            if ratio > ASSUMPTION1_RATIO_LIMIT:
                log.add(
                    "assumption1_gradient_norm",
                    "curvature",
                    f"per-example gradients at w* have RMS deviation {rms:.4g}: the first-order "
                    f"term Theorem 7 drops is {ratio:.3g}× the second-order bound at "
                    f"R = {radius:g}, so Assumption 1 (every per-example gradient zero at w*) "
                    "is violated and Theorem 7's k* is optimistic",
                )
        else:
            assert grad_norm is not None
            ratio = 2.0 * grad_norm / (m_bound * radius)
            missing.append(
                Missing(
                    item="assumption1_ratio",
                    reason="needs measurements.per_sample_gradient_rms: a small mean gradient "
                    f"(2|ḡ|/(M·R) = {ratio:.3g}) does not show Assumption 1 holds, every "
                    "per-example gradient must vanish",
                )
            )
    else:
        missing.append(
            Missing(
                item="assumption1_ratio",
                reason="needs a positive hessian_norm_bound (or per_sample_hessian_norms) and "
                "targets.radius > 0 to compare the gradient term with the curvature term",
            )
        )
    updates["missing"] = missing
    return section.model_copy(update=updates)
