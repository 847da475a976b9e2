"""The `scaling` section: L(D) = E + A·D^(−β) and the data needed for a target loss."""

from __future__ import annotations

from typing import Literal

import numpy as np

from curvplan.types.planner import Measurements, Missing, NotComputed, ScalingSection, Targets
from curvplan_core.planner import formulas
from curvplan_core.planner.scaling import (
    data_for_target,
    data_for_target_interval,
    fit_loss_vs_data,
)
from curvplan_core.planner.warning_log import WarningLog

EXTRAPOLATION_FACTOR = 10.0


def build_scaling_section(
    measurements: Measurements, targets: Targets, seed: int, log: WarningLog
) -> ScalingSection | NotComputed:
    """Fit the pilot `loss_vs_data` runs and solve for `target_loss`."""
    points = measurements.loss_vs_data
    if points is None:
        return NotComputed(reason="measurements.loss_vs_data not given")
    d = np.array([p.n_samples for p in points], dtype=np.float64)
    y = np.array([p.loss for p in points], dtype=np.float64)
    if np.unique(d).size < 3:
        return NotComputed(
            reason=f"loss_vs_data has {np.unique(d).size} distinct n_samples; the three-parameter "
            "law needs at least 3 (4 for intervals)"
        )
    fit = fit_loss_vs_data(d, y, targets.confidence)
    missing = []
    if fit.cov is None:
        missing.append(
            Missing(
                item="intervals", reason="needs at least 4 points (one residual degree of freedom)"
            )
        )
    target = targets.target_loss
    n_for_target: float | Literal["unreachable"] | None = None
    n_ci = None
    if target is None:
        missing.append(Missing(item="n_for_target_loss", reason="targets.target_loss not given"))
    else:
        needed = data_for_target(fit.E, fit.A, fit.beta, target)
        if needed is None:
            n_for_target = "unreachable"  # at the point estimate; the budget uses E's interval
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
    return ScalingSection(
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
        n_for_target_loss=n_for_target,
        n_for_target_loss_ci=n_ci,
        n_for_target_loss_formula=None if target is None else formulas.N_FOR_TARGET,
        missing=missing,
    )
