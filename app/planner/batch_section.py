"""The `batch_size` section: B_simple, B_noise, B_crit and the recommended batch size."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from curvplan.types.planner import (
    BatchSizeSection,
    BCrit,
    DirectNoiseStats,
    Estimate,
    LrScaling,
    Measurements,
    Missing,
    NotComputed,
    Targets,
    TwoBatchNoiseSeries,
)
from curvplan_server.planner import formulas
from curvplan_server.planner.critical_batch import (
    batch_at_step_overhead,
    fit_steps_to_target,
    linear_cross_check,
    nearest_power_of_two,
)
from curvplan_server.planner.gradient_noise import (
    Ratio,
    Stat,
    ratio_direct,
    ratio_of_means_bootstrap,
    two_batch_estimates,
)
from curvplan_server.planner.warning_log import WarningLog

CROSS_CHECK_TOLERANCE = 0.2


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _ci(interval: tuple[float, float] | None) -> tuple[float | None, float | None] | None:
    if interval is None:
        return None
    return _finite(interval[0]), _finite(interval[1])


def _stat_out(stat: Stat, formula: str) -> Estimate:
    return Estimate(value=stat.value, ci=_ci(stat.ci), se=stat.se, formula=formula)


def _ratio_out(ratio: Ratio) -> Estimate | NotComputed:
    if ratio.value is None:
        return NotComputed(reason=ratio.undefined_reason or "undefined")
    return Estimate(value=ratio.value, ci=_ci(ratio.ci), formula=ratio.formula)


def _direct_stat(value: float | None, se: float | None, z: float, formula: str) -> Stat | None:
    if value is None:
        return None
    ci = None if se is None else (value - z * se, value + z * se)
    return Stat(value, se, ci, formula)


class _Noise:
    def __init__(self) -> None:
        self.grad_sq: Stat | None = None
        self.trace_sigma: Stat | None = None
        self.ghg: Stat | None = None
        self.trace_h_sigma: Stat | None = None
        self.b_simple: Ratio | None = None
        self.b_noise: Ratio | None = None


def _direct_noise(stats: DirectNoiseStats, confidence: float) -> _Noise:
    dof = None if stats.n_samples is None else stats.n_samples - 1
    z = float(sps.t.ppf((1 + confidence) / 2, dof) if dof else sps.norm.ppf((1 + confidence) / 2))
    out = _Noise()
    out.grad_sq = _direct_stat(
        stats.grad_sq_norm, stats.grad_sq_norm_se, z, formulas.GRAD_SQ_DIRECT
    )
    out.trace_sigma = _direct_stat(
        stats.trace_sigma, stats.trace_sigma_se, z, formulas.TRACE_SIGMA_DIRECT
    )
    out.ghg = _direct_stat(stats.gHg, stats.gHg_se, z, formulas.GHG_DIRECT)
    out.trace_h_sigma = _direct_stat(
        stats.trace_h_sigma, stats.trace_h_sigma_se, z, formulas.TRACE_H_SIGMA_DIRECT
    )
    has_se_simple = stats.grad_sq_norm_se is not None and stats.trace_sigma_se is not None
    has_se_noise = stats.gHg_se is not None and stats.trace_h_sigma_se is not None
    if stats.grad_sq_norm is not None and stats.trace_sigma is not None:
        out.b_simple = ratio_direct(
            stats.trace_sigma,
            stats.grad_sq_norm,
            stats.trace_sigma_se,
            stats.grad_sq_norm_se,
            confidence,
            formulas.B_SIMPLE + (formulas.DELTA_METHOD if has_se_simple else ""),
            ("tr Σ", "|G|²"),
            dof,
        )
    if stats.gHg is not None and stats.trace_h_sigma is not None:
        out.b_noise = ratio_direct(
            stats.trace_h_sigma,
            stats.gHg,
            stats.trace_h_sigma_se,
            stats.gHg_se,
            confidence,
            formulas.B_NOISE + (formulas.DELTA_METHOD if has_se_noise else ""),
            ("tr(HΣ)", "GᵀHG"),
            dof,
        )
    return out


def _two_batch_noise(series: TwoBatchNoiseSeries, targets: Targets, seed: int) -> _Noise:
    out = _Noise()
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(20,)))
    g2, tr = two_batch_estimates(
        series.b_small,
        series.b_big,
        np.asarray(series.grad_sq_norm_small),
        np.asarray(series.grad_sq_norm_big),
    )
    tr_stat, g2_stat, out.b_simple = ratio_of_means_bootstrap(
        tr,
        g2,
        confidence=targets.confidence,
        bootstrap=targets.bootstrap,
        rng=rng,
        formula=formulas.B_SIMPLE_TWO_BATCH,
        names=("tr Σ", "|G|²"),
    )
    out.grad_sq = Stat(g2_stat.value, g2_stat.se, g2_stat.ci, formulas.GRAD_SQ_TWO_BATCH)
    out.trace_sigma = Stat(tr_stat.value, tr_stat.se, tr_stat.ci, formulas.TRACE_SIGMA_TWO_BATCH)
    if series.gHg_small is not None and series.gHg_big is not None:
        ghg, trh = two_batch_estimates(
            series.b_small, series.b_big, np.asarray(series.gHg_small), np.asarray(series.gHg_big)
        )
        trh_stat, ghg_stat, out.b_noise = ratio_of_means_bootstrap(
            trh,
            ghg,
            confidence=targets.confidence,
            bootstrap=targets.bootstrap,
            rng=rng,
            formula=formulas.B_NOISE_TWO_BATCH,
            names=("tr(HΣ)", "GᵀHG"),
        )
        out.ghg = Stat(ghg_stat.value, ghg_stat.se, ghg_stat.ci, formulas.GHG_TWO_BATCH)
        out.trace_h_sigma = Stat(
            trh_stat.value, trh_stat.se, trh_stat.ci, formulas.TRACE_H_SIGMA_TWO_BATCH
        )
    return out


def _b_crit(measurements: Measurements, targets: Targets, log: WarningLog) -> BCrit | NotComputed:
    table = measurements.steps_to_target
    if table is None:
        return NotComputed(reason="measurements.steps_to_target not given")
    if len(table) < 2:
        return NotComputed(reason="steps_to_target needs at least 2 batch sizes (3 for intervals)")
    b = np.array([p.batch_size for p in table], dtype=np.float64)
    s = np.array([p.steps for p in table], dtype=np.float64)
    try:
        fit = fit_steps_to_target(b, s, targets.confidence)
    except ValueError as exc:
        return NotComputed(reason=str(exc))
    cross = linear_cross_check(b, s)
    cross_out: dict[str, float | str] | None = None
    if cross is not None:
        cross_out = {
            "b_crit": cross.b_crit,
            "s_min": cross.s_min,
            "e_min": cross.e_min,
            "formula": formulas.B_CRIT_LINEAR,
        }
        if abs(cross.b_crit - fit.b_crit) > CROSS_CHECK_TOLERANCE * fit.b_crit:
            log.add(
                "b_crit_cross_check_disagrees",
                "batch_size",
                f"nonlinear fit B_crit = {fit.b_crit:.4g}, linear 1/S = a + b/E form gives "
                f"{cross.b_crit:.4g}: the table does not follow S = S_min(1 + B_crit/B) well",
            )
    else:
        cross_out = {"formula": formulas.B_CRIT_LINEAR, "status": "no positive solution"}
    b0 = float(b.min())
    if not (b.min() <= fit.b_crit <= b.max()):
        log.add(
            "b_crit_outside_measured_range",
            "batch_size",
            f"B_crit = {fit.b_crit:.4g} lies outside the measured batch sizes "
            f"[{int(b.min())}, {int(b.max())}]: it is extrapolated",
        )
    b20_ci = None
    if fit.b_crit_ci is not None:
        b20_ci = (
            batch_at_step_overhead(b0, fit.b_crit_ci[0]),
            batch_at_step_overhead(b0, fit.b_crit_ci[1]),
        )
    return BCrit(
        value=fit.b_crit,
        ci=_ci(fit.b_crit_ci),
        s_min=fit.s_min,
        s_min_ci=_ci(fit.s_min_ci),
        e_min=fit.e_min,
        e_min_ci=_ci(fit.e_min_ci),
        r2=fit.r2,
        formula=formulas.B_CRIT_FIT,
        cross_check=cross_out,
        b_20pct_overhead=batch_at_step_overhead(b0, fit.b_crit),
        b_20pct_overhead_ci=_ci(b20_ci),
        b_20pct_overhead_formula=formulas.B_20PCT,
        measured_range=(int(b.min()), int(b.max())),
    )


def build_batch_section(
    measurements: Measurements, targets: Targets, seed: int, log: WarningLog
) -> BatchSizeSection | NotComputed:
    """B_simple/B_noise from gradient-noise statistics, B_crit from steps-to-target, the
    recommended power-of-two batch size and the learning-rate scaling rule."""
    noise_input = measurements.gradient_noise
    if noise_input is None and measurements.steps_to_target is None:
        return NotComputed(
            reason="needs measurements.gradient_noise and/or measurements.steps_to_target"
        )
    missing: list[Missing] = []
    noise = _Noise()
    source = None
    if isinstance(noise_input, TwoBatchNoiseSeries):
        noise = _two_batch_noise(noise_input, targets, seed)
        source = "two_batch"
    elif isinstance(noise_input, DirectNoiseStats):
        noise = _direct_noise(noise_input, targets.confidence)
        source = "direct"

    def ratio_or_reason(ratio: Ratio | None, what: str, needs: str) -> Estimate | NotComputed:
        if ratio is None:
            return NotComputed(reason=f"{what} needs {needs}")
        return _ratio_out(ratio)

    b_simple = ratio_or_reason(
        noise.b_simple, "B_simple", "gradient_noise with grad_sq_norm and trace_sigma (or series)"
    )
    b_noise = ratio_or_reason(
        noise.b_noise, "B_noise", "gradient_noise with gHg and trace_h_sigma (or gHg series)"
    )
    if noise.b_simple is not None and noise.b_simple.value is None:
        log.add(
            "b_simple_undefined",
            "batch_size",
            f"B_simple undefined: {noise.b_simple.undefined_reason} (at a converged w* the "
            "gradient vanishes; measure on an intermediate checkpoint)",
        )
    if noise.b_noise is not None and noise.b_noise.value is None:
        log.add(
            "b_noise_undefined",
            "batch_size",
            f"B_noise undefined: {noise.b_noise.undefined_reason}",
        )
    for stat, name in ((noise.trace_sigma, "tr Σ"), (noise.trace_h_sigma, "tr(HΣ)")):
        if stat is not None and stat.value < 0:
            log.add(
                "noise_estimate_negative",
                "batch_size",
                f"the estimate of {name} is negative ({stat.value:.4g}): "
                "too few or too noisy steps",
            )

    b_crit = _b_crit(measurements, targets, log)

    recommended = None
    basis = None
    if isinstance(b_crit, BCrit):
        recommended, basis = nearest_power_of_two(b_crit.value), "B_crit"
    elif isinstance(b_noise, Estimate):
        recommended, basis = nearest_power_of_two(b_noise.value), "B_noise"
    elif isinstance(b_simple, Estimate):
        recommended, basis = nearest_power_of_two(b_simple.value), "B_simple"
    else:
        missing.append(
            Missing(item="recommended", reason="none of B_crit, B_noise, B_simple is available")
        )
    if basis is not None and recommended is None:
        missing.append(
            Missing(item="recommended", reason=f"{basis} exceeds 2^62: no sensible batch size")
        )
        basis = None

    lr: LrScaling | NotComputed
    if isinstance(b_noise, Estimate):
        eps_max = None
        eps_note = None
        if noise.grad_sq is None or noise.ghg is None:
            eps_note = "ε_max = |G|²/GᵀHG needs |G|² and GᵀHG"
        elif noise.grad_sq.value > 0 and noise.ghg.value > 0:
            eps_max = noise.grad_sq.value / noise.ghg.value
        else:
            # an unbiased |G|² ≤ 0 (near w*) gives no step size: never report a negative ε_max
            eps_note = (
                f"ε_max undefined: |G|² = {noise.grad_sq.value:.4g}, GᵀHG = "
                f"{noise.ghg.value:.4g} (both must be positive); the factor 1/(1 + B_noise/B) "
                "still scales whatever learning rate is tuned at large batch"
            )
        factor = None if recommended is None else 1.0 / (1.0 + b_noise.value / recommended)
        lr = LrScaling(
            formula=formulas.LR_SCALING,
            b_noise=b_noise.value,
            epsilon_max=eps_max,
            factor_at_recommended=factor,
            epsilon_opt_at_recommended=None
            if eps_max is None or factor is None
            else eps_max * factor,
            note=eps_note,
        )
    else:
        lr = NotComputed(
            reason="the learning-rate scaling ε_opt(B) = ε_max/(1 + B_noise/B) needs B_noise"
        )

    def stat_or_none(stat: Stat | None) -> Estimate | None:
        return None if stat is None else _stat_out(stat, stat.formula)

    return BatchSizeSection(
        grad_sq_norm=stat_or_none(noise.grad_sq),
        trace_sigma=stat_or_none(noise.trace_sigma),
        gHg=stat_or_none(noise.ghg),
        trace_h_sigma=stat_or_none(noise.trace_h_sigma),
        source=source,
        b_simple=b_simple,
        b_noise=b_noise,
        b_crit=b_crit,
        recommended=recommended,
        recommended_basis=basis,
        recommended_formula=None if basis is None else formulas.RECOMMENDED.format(basis=basis),
        lr_scaling=lr,
        missing=missing,
    )
