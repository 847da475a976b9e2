"""The `batch_size` section: B_simple, B_noise, B_crit and the recommended batch size."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from scipy import stats as sps

from curvplan.types.planner import (
    BatchSizeSection,
    BCrit,
    DirectNoiseStats,
    Estimate,
    LrScaling,
    Measurements,
    NoiseReliability,
    NoiseTrendOut,
    NoiseTrendPoint,
    NotComputed,
    StepsPoint,
    Targets,
    TwoBatchNoiseSeries,
)
from curvplan_core.planner import formulas
from curvplan_core.planner.critical_batch import (
    batch_at_step_overhead,
    fit_steps_to_target,
    linear_cross_check,
    unbounded_reason,
)
from curvplan_core.planner.gradient_noise import (
    Ratio,
    Stat,
    ratio_direct,
    ratio_of_means_bootstrap,
    two_batch_estimates,
)
from curvplan_core.planner.noise_reliability import log_ratio_interval
from curvplan_core.planner.steps_interval import PROFILE_BOOTSTRAP
from curvplan_core.planner.warning_log import WarningLog

P_DEFINED_WARN = 0.9
MEDIAN_RATIO_WARN = 0.8
TREND_FACTOR = 2.0
#: A steps-to-target row whose crossing is known only to within this share of its steps (the
#: logging interval, ``steps_uncertainty``) is warned about: the S(B) fit cannot resolve it.
STEPS_UNCERTAINTY_WARN = 0.2
CROSS_CHECK_NOTE = (
    "informational: the linear form has the noisy S on both sides and disagrees with the "
    "nonlinear fit by chance (about 1 in 7 exact-model tables with 10 % noise differ by "
    "> 20 %), so no warning is raised from it"
)


def finite_or_none(value: float | None) -> float | None:
    """The value, or None where it is missing or not finite (an open interval end)."""
    return value if value is not None and math.isfinite(value) else None


def _ci(interval: tuple[float, float] | None) -> tuple[float | None, float | None] | None:
    if interval is None:
        return None
    return finite_or_none(interval[0]), finite_or_none(interval[1])


def _stat_out(stat: Stat, formula: str) -> Estimate:
    return Estimate(value=stat.value, ci=_ci(stat.ci), se=stat.se, formula=formula)


def _ratio_out(ratio: Ratio, dof: int | None = None) -> Estimate | NotComputed:
    if ratio.value is None:
        return NotComputed(reason=ratio.undefined_reason or "undefined")
    return Estimate(value=ratio.value, ci=_ci(ratio.ci), formula=ratio.formula, dof=dof)


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
        self.dof: int | None = None
        self.reliability_simple: NoiseReliability | None = None
        self.reliability_noise: NoiseReliability | None = None


def _jackknife_ratio(
    ratio: Ratio, log_se: float | None, confidence: float, dof: int | None
) -> Ratio:
    """Replace the independent-errors interval by the log-ratio jackknife one when given."""
    if ratio.value is None or log_se is None:
        return ratio
    ci = log_ratio_interval(ratio.value, log_se, confidence, dof)
    base = ratio.formula.split(formulas.DELTA_METHOD)[0]
    return Ratio(ratio.value, ci, log_se, base + formulas.JACKKNIFE_LOG_RATIO)


def _reliability(p: float | None, median: float | None) -> NoiseReliability | None:
    if p is None:
        return None
    return NoiseReliability(p_defined=p, median_ratio=median, formula=formulas.NOISE_RELIABILITY)


def _direct_noise(stats: DirectNoiseStats, confidence: float) -> _Noise:
    if stats.jackknife_groups is not None:
        dof: int | None = stats.jackknife_groups - 1
    else:
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
    if out.b_simple is not None:
        out.b_simple = _jackknife_ratio(out.b_simple, stats.log_b_simple_se, confidence, dof)
    if out.b_noise is not None:
        out.b_noise = _jackknife_ratio(out.b_noise, stats.log_b_noise_se, confidence, dof)
    out.dof = dof
    out.reliability_simple = _reliability(stats.b_simple_p_defined, stats.b_simple_median_ratio)
    out.reliability_noise = _reliability(stats.b_noise_p_defined, stats.b_noise_median_ratio)
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


def _b_crit(
    measurements: Measurements, targets: Targets, seed: int, log: WarningLog
) -> BCrit | NotComputed:
    table = measurements.steps_to_target
    if table is None:
        return NotComputed(reason="measurements.steps_to_target not given")
    if len(table) < 2:
        return NotComputed(reason="steps_to_target needs at least 2 batch sizes (3 for intervals)")
    b = np.array([p.batch_size for p in table], dtype=np.float64)
    input_unit = measurements.steps_to_target_unit
    unit = input_unit
    if input_unit == "tokens" and measurements.tokens_per_example is not None:
        b = b / measurements.tokens_per_example  # B_crit in examples, like the noise scales
        unit = "examples"
    s = np.array([p.steps for p in table], dtype=np.float64)
    _warn_coarse_steps(table, log)
    try:
        fit = fit_steps_to_target(
            b, s, targets.confidence, bootstrap=min(targets.bootstrap, PROFILE_BOOTSTRAP), seed=seed
        )
    except ValueError as exc:
        return NotComputed(reason=str(exc))
    if fit.unbounded:
        return NotComputed(reason=unbounded_reason(fit, targets.confidence))
    cross = linear_cross_check(b, s)
    cross_out: dict[str, float | str] | None = None
    if cross is not None:
        cross_out = {
            "b_crit": cross.b_crit,
            "s_min": cross.s_min,
            "e_min": cross.e_min,
            "formula": formulas.B_CRIT_LINEAR,
        }
        # Informational only: regressing 1/S on 1/(B·S) puts the noisy S on both sides
        # (errors in variables), so it disagrees with the nonlinear fit by chance; a calibrated
        # band (parametric bootstrap of the linear form under the fit) had no power against
        # tables that do not follow the model, so no alarm is raised from it.
        cross_out["note"] = CROSS_CHECK_NOTE
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
        measured_range=(math.floor(b.min()), math.ceil(b.max())),
        input_unit=input_unit,
        unit=unit,
    )


def _warn_coarse_steps(table: list[StepsPoint], log: WarningLog) -> None:
    """Warn when a row's crossing is known only to within more than STEPS_UNCERTAINTY_WARN
    of its steps (the evaluations that time the target are too far apart)."""
    coarse = [
        p
        for p in table
        if p.steps_uncertainty is not None
        and p.steps_uncertainty > STEPS_UNCERTAINTY_WARN * p.steps
    ]
    if coarse:
        rows = ", ".join(
            f"B={p.batch_size}: {p.steps:g} steps ± {p.steps_uncertainty:g}" for p in coarse
        )
        log.add(
            "steps_to_target_coarse",
            "batch_size",
            f"the target's crossing is known only to within more than "
            f"{STEPS_UNCERTAINTY_WARN:.0%} of the steps at {rows}: the evaluations that time "
            "it are too far apart for the S(B) fit to resolve; log the evaluation loss more often",
        )


def build_batch_section(
    measurements: Measurements, targets: Targets, seed: int, log: WarningLog
) -> BatchSizeSection | NotComputed:
    """B_simple/B_noise from gradient-noise statistics, B_crit from steps-to-target and the
    learning-rate scaling rule: the evidence behind budget.batch, which alone recommends a
    batch (``lr_scaling_at`` evaluates the rule at it)."""
    noise_input = measurements.gradient_noise
    trend_input = measurements.gradient_noise_trend or []
    if noise_input is None and trend_input:
        noise_input = trend_input[-1]  # the latest checkpoint of the trend
    if noise_input is None and measurements.steps_to_target is None:
        return NotComputed(
            reason="needs measurements.gradient_noise and/or measurements.steps_to_target"
        )
    noise, source = _noise_estimates(noise_input, targets, seed)
    b_simple = _ratio_or_reason(
        noise.b_simple,
        noise.dof,
        "B_simple",
        "gradient_noise with grad_sq_norm and trace_sigma (or series)",
    )
    b_noise = _ratio_or_reason(
        noise.b_noise,
        noise.dof,
        "B_noise",
        "gradient_noise with gHg and trace_h_sigma (or gHg series)",
    )
    _warn_about_noise(noise, log)
    trend, trend_note = _trend(trend_input, targets.confidence, log)
    b_crit = _b_crit(measurements, targets, seed, log)
    tpe = measurements.tokens_per_example
    unit = _unit(b_crit, log)
    return BatchSizeSection(
        grad_sq_norm=_stat_or_none(noise.grad_sq),
        trace_sigma=_stat_or_none(noise.trace_sigma),
        gHg=_stat_or_none(noise.ghg),
        trace_h_sigma=_stat_or_none(noise.trace_h_sigma),
        source=source,
        b_simple=b_simple,
        b_noise=b_noise,
        b_crit=b_crit,
        lr_scaling=_lr_scaling(noise, b_noise),
        unit=unit,
        tokens_per_example=tpe,
        b_simple_reliability=noise.reliability_simple,
        b_noise_reliability=noise.reliability_noise,
        trend=trend,
        trend_note=trend_note,
    )


def _noise_estimates(
    noise_input: TwoBatchNoiseSeries | DirectNoiseStats | None, targets: Targets, seed: int
) -> tuple[_Noise, Literal["direct", "two_batch"] | None]:
    """Step 1: the noise statistics and B_simple/B_noise ratios of the gradient-noise input
    (two-batch series or direct statistics), and which it was."""
    if isinstance(noise_input, TwoBatchNoiseSeries):
        return _two_batch_noise(noise_input, targets, seed), "two_batch"
    if isinstance(noise_input, DirectNoiseStats):
        return _direct_noise(noise_input, targets.confidence), "direct"
    return _Noise(), None


def _ratio_or_reason(
    ratio: Ratio | None, dof: int | None, what: str, needs: str
) -> Estimate | NotComputed:
    if ratio is None:
        return NotComputed(reason=f"{what} needs {needs}")
    return _ratio_out(ratio, dof)


def _stat_or_none(stat: Stat | None) -> Estimate | None:
    return None if stat is None else _stat_out(stat, stat.formula)


def _warn_about_noise(noise: _Noise, log: WarningLog) -> None:
    """Step 2: undefined ratios, negative trace estimates and a likely-low noise scale."""
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
    for rel, name in ((noise.reliability_simple, "B_simple"), (noise.reliability_noise, "B_noise")):
        if rel is None:
            continue
        biased = rel.median_ratio is not None and rel.median_ratio < MEDIAN_RATIO_WARN
        if rel.p_defined < P_DEFINED_WARN or biased:
            median = "n/a" if rel.median_ratio is None else f"{rel.median_ratio:.2f}"
            log.add(
                "noise_scale_conditional_bias",
                "batch_size",
                f"{name}: a re-measurement would be defined with probability "
                f"{rel.p_defined:.2f}, and when defined its median estimate/truth is {median}: "
                "at this signal a reported value is likely too low (measure more gradient "
                "examples or an earlier checkpoint)",
            )


def _unit(b_crit: BCrit | NotComputed, log: WarningLog) -> Literal["examples", "tokens"]:
    """Step 3: the section's batch unit (B_crit's: tokens when steps_to_target is in tokens
    and tokens_per_example is unknown)."""
    if not isinstance(b_crit, BCrit):
        return "examples"
    if b_crit.unit == "tokens":
        log.add(
            "batch_unit_mismatch",
            "batch_size",
            "steps_to_target is in tokens and measurements.tokens_per_example is not "
            "given: B_crit is in tokens, B_simple/B_noise in examples; no batch is "
            "recommended and the learning-rate factor is not computed",
        )
    return b_crit.unit


def _lr_scaling(noise: _Noise, b_noise: Estimate | NotComputed) -> LrScaling | NotComputed:
    """Step 4: the learning-rate rule ε_opt(B) = ε_max/(1 + B_noise/B) of McCandlish et al.
    (2018) §2.2; ``lr_scaling_at`` evaluates it at budget.batch's batch."""
    if not isinstance(b_noise, Estimate):
        return NotComputed(
            reason="the learning-rate scaling ε_opt(B) = ε_max/(1 + B_noise/B) needs B_noise"
        )
    eps_max = None
    eps_note = None
    if noise.grad_sq is None or noise.ghg is None:
        eps_note = "ε_max = |G|²/GᵀHG needs |G|² and GᵀHG"
    elif noise.grad_sq.value > 0 and noise.ghg.value > 0:
        eps_max = noise.grad_sq.value / noise.ghg.value
        if not math.isfinite(eps_max):  # a GᵀHG near the smallest double
            eps_max, eps_note = (
                None,
                (
                    f"ε_max = |G|²/GᵀHG overflows float64 (|G|² = {noise.grad_sq.value:.4g}, "
                    f"GᵀHG = {noise.ghg.value:.4g})"
                ),
            )
    else:
        # an unbiased |G|² ≤ 0 (near w*) gives no step size: never report a negative ε_max
        eps_note = (
            f"ε_max undefined: |G|² = {noise.grad_sq.value:.4g}, GᵀHG = "
            f"{noise.ghg.value:.4g} (both must be positive); the factor 1/(1 + B_noise/B) "
            "still scales whatever learning rate is tuned at large batch"
        )
    return LrScaling(
        formula=formulas.LR_SCALING, b_noise=b_noise.value, epsilon_max=eps_max, note=eps_note
    )


def lr_scaling_at(
    section: BatchSizeSection | NotComputed, batch: int | None
) -> BatchSizeSection | NotComputed:
    """The section with its learning-rate rule ε_opt(B) = ε_max/(1 + B_noise/B) (McCandlish
    et al. 2018 §2.2) evaluated at ``batch``, budget.batch.recommended: the factor answers the
    batch the budget recommends, never another one."""
    if not isinstance(section, BatchSizeSection) or not isinstance(section.lr_scaling, LrScaling):
        return section
    if batch is None or section.unit != "examples":
        return section
    rule = section.lr_scaling
    factor = 1.0 / (1.0 + rule.b_noise / batch)
    eps_opt = None if rule.epsilon_max is None else rule.epsilon_max * factor
    update = {"factor_at_recommended": factor, "epsilon_opt_at_recommended": eps_opt}
    return section.model_copy(update={"lr_scaling": rule.model_copy(update=update)})


def _trend(
    points: list[NoiseTrendPoint], confidence: float, log: WarningLog
) -> tuple[list[NoiseTrendOut], str | None]:
    """B_simple / B_noise at every intermediate checkpoint (oldest first) and how they move."""
    out = []
    for point in points:
        noise = _direct_noise(point, confidence)

        def est(
            ratio: Ratio | None, what: str, dof: int | None = noise.dof
        ) -> Estimate | NotComputed:
            if ratio is None:
                return NotComputed(reason=f"{what} not measured at this checkpoint")
            return _ratio_out(ratio, dof)

        out.append(
            NoiseTrendOut(
                checkpoint=point.checkpoint,
                step=point.step,
                b_simple=est(noise.b_simple, "B_simple"),
                b_noise=est(noise.b_noise, "B_noise"),
                b_simple_reliability=noise.reliability_simple,
            )
        )
    defined = [
        (p, t.b_simple.value)
        for p, t in zip(points, out, strict=True)
        if isinstance(t.b_simple, Estimate)
    ]
    if len(defined) < 2:
        return out, None
    first, last = defined[0][1], defined[-1][1]
    factor = last / first

    def label(p: NoiseTrendPoint) -> str:
        return p.checkpoint or (f"step {p.step}" if p.step is not None else "?")

    note = (
        f"B_simple moved from {first:.4g} ({label(defined[0][0])}) to {last:.4g} "
        f"({label(defined[-1][0])}), ×{factor:.3g} over the measured checkpoints: the noise "
        "scale changes during training, so the late value is the efficient batch size late in "
        "training, not a constant for the whole run"
    )
    if factor > TREND_FACTOR or factor < 1.0 / TREND_FACTOR:
        log.add("noise_scale_trend", "batch_size", note)
    return out, note
