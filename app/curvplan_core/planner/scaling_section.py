"""The `scaling` section: the evidence of the fit L(D) = E + A·D^(−β). The data it solves
for at the target loss is the answer of ``budget.data`` alone (one number per question), so
it travels beside the section, not in it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from curvplan.types.planner import (
    Interval,
    Measurements,
    Missing,
    NotComputed,
    ScalingSection,
    Targets,
)
from curvplan_core.planner import formulas
from curvplan_core.planner.scaling import (
    data_for_target,
    data_for_target_interval,
    fit_loss_vs_data,
)
from curvplan_core.planner.warning_log import WarningLog

EXTRAPOLATION_FACTOR = 10.0


@dataclass(frozen=True)
class DataForTarget:
    """The fit's D = (A/(target − E))^(1/β) at the target loss and its interval: what
    ``budget.data`` leads with when the target is reachable. ``examples`` is None when there
    is no target, the target is at or below the fitted E, or the size is not finite."""

    examples: float | None = None
    ci: Interval | None = None


def build_scaling_section(
    measurements: Measurements, targets: Targets, seed: int, log: WarningLog
) -> tuple[ScalingSection | NotComputed, DataForTarget]:
    """Fit the pilot `loss_vs_data` runs and solve for `target_loss`: the section (the fit's
    evidence) and the solved size, which only budget.data reports."""
    points = measurements.loss_vs_data
    if points is None:
        return NotComputed(reason="measurements.loss_vs_data not given"), DataForTarget()
    d = np.array([p.n_samples for p in points], dtype=np.float64)
    y = np.array([p.loss for p in points], dtype=np.float64)
    if np.unique(d).size < 3:
        return NotComputed(
            reason=f"loss_vs_data has {np.unique(d).size} distinct n_samples; the three-parameter "
            "law needs at least 3 (4 for intervals)"
        ), DataForTarget()
    fit = fit_loss_vs_data(d, y, targets.confidence)
    missing = []
    if fit.cov is None:
        missing.append(
            Missing(
                item="intervals", reason="needs at least 4 points (one residual degree of freedom)"
            )
        )
    target = targets.target_loss
    n_for_target: float | None = None
    n_ci = None
    if target is None:
        missing.append(
            Missing(
                item="target_loss",
                reason="targets.target_loss not given: budget.data has no size to solve for",
            )
        )
    else:
        needed = data_for_target(fit.E, fit.A, fit.beta, target)
        if needed is None:
            # unreachable at the point estimate; budget.data.target_status uses E's interval
            lower = fit.E_ci[0] if fit.E_ci is not None else None
            if lower is not None and target < lower:
                detail = (
                    f"target_loss {target:g} is below the lower confidence end {lower:.4g} of "
                    f"the fitted irreducible loss E = {fit.E:.4g}: more data alone does not "
                    "reach it"
                )
            else:
                detail = (
                    f"target_loss {target:g} ≤ the fitted irreducible loss E = {fit.E:.4g}, but "
                    + (
                        f"inside E's interval (lower end {lower:.4g})"
                        if lower is not None
                        else "E has no interval (fewer than 4 points)"
                    )
                    + ": the sweep cannot tell whether more data reaches it "
                    "(budget.data.target_status = uncertain)"
                )
            log.add("target_below_irreducible_loss", "scaling", detail)
        else:
            n_for_target = needed if np.isfinite(needed) else None
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(30,)))
            n_ci = data_for_target_interval(fit, target, targets.confidence, rng)
            if n_for_target is None or needed > EXTRAPOLATION_FACTOR * d.max():
                log.add(
                    "extrapolation",
                    "scaling",
                    f"the data for target_loss {target:g} is more than "
                    f"{EXTRAPOLATION_FACTOR:g}× the largest pilot run ({d.max():.4g})",
                )
    section = ScalingSection(
        E=fit.E,
        A=fit.A,
        beta=fit.beta,
        E_ci=fit.E_ci,
        A_ci=fit.A_ci,
        beta_ci=fit.beta_ci,
        r2=fit.r2,
        n_points=fit.n_points,
        formula=formulas.SCALING_FIT,
        target_loss=target,
        missing=missing,
    )
    return section, DataForTarget(examples=n_for_target, ci=n_ci)
