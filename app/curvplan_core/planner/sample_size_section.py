"""The `sample_size` section: loss-difference fits and k*(ε) per tolerance
(docs/formulas.md#sample-size 3–5)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypedDict

import numpy as np

from curvplan.types.planner import (
    BoundValue,
    Curve,
    LossCorrelation,
    LossVarianceOut,
    Measurements,
    Missing,
    NotComputed,
    OffMinimumFit,
    PerTolerance,
    PerturbedLosses,
    PowerLawFit,
    SampleSizeSection,
    SampleSizeValue,
    Targets,
)
from curvplan_core.planner import formulas
from curvplan_core.planner.laws import theorem7_constant
from curvplan_core.planner.loss_accuracy import (
    MIN_GROUPS,
    LossVariance,
    adjacent_correlation,
    cluster_robust_variance,
    k_loss_accuracy,
    loss_error_at,
    loss_variance,
    z_two_sided,
)
from curvplan_core.planner.loss_curve import (
    DataScaleBootstrap,
    FitError,
    OrderingCurves,
    PowerLawEstimate,
    data_influence_cov,
    data_influence_draws,
    data_scale_bootstrap,
    default_window,
    fit_power_law,
    loss_difference_curves,
)
from curvplan_core.planner.sample_size import (
    ceil_interval,
    k_empirical,
    k_empirical_many,
    k_squared,
    k_squared_rms,
    k_theorem7,
    k_theorem7_tight,
    percentile_interval,
)
from curvplan_core.planner.warning_log import WarningLog

MIN_SAMPLES_FOR_FIT = 20
FEW_SAMPLES = 1000
FEW_ORDERINGS = 50
MIN_WINDOW_DECADES = 1.0
MIN_WINDOW_BINS = 6
ALPHA_THEORY = 1.0
ALPHA_SQ_THEORY = 2.0
ALPHA_TOLERANCE = 0.1
POOR_R2 = 0.9
_BOOT_STREAM = 1
_DATA_STREAM = 2
_IF_STREAM = 40


MEANING_STABILISATION = (
    "landscape stabilisation (Petrov et al. 2025): beyond k*, adding ONE example changes the "
    "average loss by about ε or less; it does not make the loss itself accurate to ε (that "
    "error is ≈ σ/√k*, see loss_error_at_empirical and loss_accuracy)"
)
MEANING_THEOREM7 = (
    "worst-case bound on the same per-example increment (Theorem 7), in practice ≈ 2ℓ_max/ε; "
    "a ceiling, not an estimate, and not a loss-accuracy guarantee"
)
MEANING_SQUARED_RMS = (
    "per-example increment as an RMS, √E(L_{k+1} − L_k)² ≤ ε: comparable with the empirical k*"
)
MEANING_LOSS_ACCURACY = (
    "evaluation-set size: with k examples drawn like the measured ones the average loss at w* "
    "is within ±ε of its population value with probability ≈ confidence; it measures the "
    "loss, it does not say how low training on k examples gets it (budget.data does)"
)
CORRELATED_DESIGN_EFFECT = 1.1
ADJACENT_CORRELATION_LIMIT = 0.1
CORRELATION_RULE = (
    f"with per_sample_groups: the lower confidence end of the design effect exceeds "
    f"{CORRELATED_DESIGN_EFFECT:g}; without: the lag-1 correlation of consecutive losses "
    f"exceeds {ADJACENT_CORRELATION_LIMIT:g} and is significant (> z/√n)"
)


def _loss_correlation(
    losses: np.ndarray, groups: list[int] | None, conf: float
) -> tuple[LossCorrelation, float, tuple[float, float]]:
    """The variance the evaluation-set size uses (cluster-robust with groups) and how
    correlated the sample looks; (diagnostics, σ²_eff, its interval)."""
    adjacent = adjacent_correlation(losses)
    if groups is not None and np.unique(np.asarray(groups)).size >= MIN_GROUPS:
        return _clustered_correlation(losses, groups, conf, adjacent)
    return _iid_correlation(losses, groups, conf, adjacent)


def _clustered_correlation(
    losses: np.ndarray, groups: list[int], conf: float, adjacent: float | None
) -> tuple[LossCorrelation, float, tuple[float, float]]:
    """The cluster-robust variance over ``groups`` and its design effect."""
    cv = cluster_robust_variance(losses, np.asarray(groups, dtype=np.int64), conf)
    correlated = cv.design_effect_ci is not None and (
        cv.design_effect_ci[0] > CORRELATED_DESIGN_EFFECT
    )
    deff = "n/a" if cv.design_effect is None else f"{cv.design_effect:.3g}"
    note = (
        f"cluster-robust over {cv.n_groups} groups (mean size {cv.mean_group_size:.3g}): "
        f"design effect {deff}"
        + (
            f", intra-cluster correlation {cv.intra_cluster_correlation:.3g}"
            if cv.intra_cluster_correlation is not None
            else ""
        )
        + (
            ": the losses are correlated within groups, so the evaluation set must be "
            "drawn as whole groups like these and needs the inflated size"
            if correlated
            else ": no sign of correlation within groups"
        )
    )
    return (
        LossCorrelation(
            variance_method="cluster_robust",
            effective_variance=cv.effective_variance,
            effective_variance_ci=cv.ci,
            n_groups=cv.n_groups,
            mean_group_size=cv.mean_group_size,
            design_effect=cv.design_effect,
            design_effect_ci=cv.design_effect_ci,
            intra_cluster_correlation=cv.intra_cluster_correlation,
            adjacent_correlation=adjacent,
            correlated=correlated,
            rule=CORRELATION_RULE,
            note=note,
            formula=formulas.LOSS_VARIANCE_CLUSTER,
        ),
        cv.effective_variance,
        cv.ci,
    )


def _iid_correlation(
    losses: np.ndarray, groups: list[int] | None, conf: float, adjacent: float | None
) -> tuple[LossCorrelation, float, tuple[float, float]]:
    """The i.i.d. variance s², and whether consecutive losses correlate significantly."""
    iid = loss_variance(losses, conf)
    z = z_two_sided(conf)
    adjacent_flag = (
        adjacent is not None
        and adjacent > ADJACENT_CORRELATION_LIMIT
        and adjacent > z / math.sqrt(losses.size)
    )
    note = (
        "i.i.d. variance s²"
        + (
            f" (per_sample_groups has fewer than {MIN_GROUPS} groups)"
            if groups is not None
            else " (no per_sample_groups)"
        )
        + (
            f": consecutive losses correlate ({adjacent:.3g}), as windows of one document do; "
            "the evaluation-set size then under-states what a correlated sample needs: give "
            "per_sample_groups (a groups tensor in the dataset) for a cluster-robust size"
            if adjacent_flag and adjacent is not None
            else ": consecutive losses show no significant correlation"
        )
    )
    return (
        LossCorrelation(
            variance_method="iid",
            effective_variance=iid.variance,
            effective_variance_ci=iid.ci,
            adjacent_correlation=adjacent,
            correlated=bool(adjacent_flag),
            rule=CORRELATION_RULE,
            note=note,
            formula=formulas.LOSS_VARIANCE,
        ),
        iid.variance,
        iid.ci,
    )


def _available_samples(
    measurements: Measurements, targets: Targets, log: WarningLog
) -> tuple[int | None, Literal["targets", "measurements (deprecated)"] | None]:
    """targets.available_samples, else the deprecated measurements.available_samples (with a
    `deprecated_field` warning); never the size of the evaluation sample."""
    old = measurements.available_samples
    if old is not None:
        detail = (
            "measurements.available_samples is deprecated: give targets.available_samples "
            "(your dataset size)"
        )
        if targets.available_samples is not None:
            detail += "; targets.available_samples was given and is used"
        log.add("deprecated_field", "sample_size", detail)
    if targets.available_samples is not None:
        return targets.available_samples, "targets"
    if old is not None:
        return old, "measurements (deprecated)"
    return None, None


def _loss_accuracy(
    variance: tuple[float, tuple[float, float]] | None, tol: float, conf: float, n: int
) -> SampleSizeValue | NotComputed:
    if variance is None:
        return NotComputed(
            reason="needs measurements.per_sample_losses (at least 4) for the loss variance"
        )
    k = math.ceil(k_loss_accuracy(variance[0], tol, conf) * (1 - 1e-12))
    lo, hi = variance[1]
    ci = (
        max(1, math.ceil(k_loss_accuracy(lo, tol, conf) * (1 - 1e-12))),
        math.ceil(k_loss_accuracy(hi, tol, conf) * (1 - 1e-12)),
    )
    note = None
    if ci[1] > n:
        note = (
            f"beyond the {n} measured losses: assumes the loss variance stays what it is on "
            "the measured sample"
        )
    return SampleSizeValue(
        k=max(1, k),
        ci=ci,
        formula=formulas.K_LOSS_ACCURACY,
        note=note,
        meaning=MEANING_LOSS_ACCURACY,
    )


def _loss_accuracy_squared(fits: _Fits, tol: float, conf: float) -> SampleSizeValue | NotComputed:
    est = fits.c2
    if est is None:
        return NotComputed(reason="the Δ_k² fit could not be computed")
    k = math.ceil(k_loss_accuracy(est.C, tol, conf) * (1 - 1e-12))
    ci = None
    if est.C_boot.size > 1:
        boot = np.asarray([k_loss_accuracy(float(c), tol, conf) for c in est.C_boot])
        ci = ceil_interval(percentile_interval(boot, conf))
    return SampleSizeValue(
        k=max(1, k),
        ci=ci,
        formula=f"{formulas.K_LOSS_ACCURACY_SQ}; C2 = {est.C:.6g}",
        meaning=MEANING_LOSS_ACCURACY + " (from the Δ_k² fit: an independent cross-check)",
    )


class _Fits:
    """The three fits of one set of curves (|Δ| free, Δ² free, Δ² with the slope fixed at 2)."""

    def __init__(self) -> None:
        self.abs: PowerLawEstimate | None = None
        self.sq: PowerLawEstimate | None = None
        self.c2: PowerLawEstimate | None = None
        self.abs_out: PowerLawFit | NotComputed = NotComputed(reason="not fitted")
        self.sq_out: PowerLawFit | NotComputed = NotComputed(reason="not fitted")


def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float] | None:
    return percentile_interval(samples, confidence) if samples.size > 1 else None


def _fit_out(
    est: PowerLawEstimate, theory_alpha: float, formula: str, confidence: float
) -> PowerLawFit:
    return PowerLawFit(
        C=est.C,
        alpha=est.alpha,
        C_ci=_interval(est.C_boot, confidence),
        alpha_ci=_interval(est.alpha_boot, confidence),
        r2=est.r2,
        window=est.window,
        n_points=est.n_points,
        theory_alpha=theory_alpha,
        formula=formula,
    )


def _window(n: int, targets: Targets) -> tuple[int, int]:
    if targets.fit_window is None:
        return default_window(n)
    k_min, k_max = targets.fit_window
    return int(k_min), int(min(k_max, n - 1))


def _fit_curves(
    curves: OrderingCurves,
    losses: np.ndarray,
    window: tuple[int, int],
    targets: Targets,
    seed: int,
    data: DataScaleBootstrap | None,
) -> _Fits:
    fits = _Fits()
    conf = targets.confidence
    sq_scale = data.sq_factor if data is not None else None
    try:
        fits.abs = fit_power_law(
            curves.abs_by_ordering,
            curves.grid,
            window,
            bootstrap=targets.bootstrap,
            seed=seed,
            stream=_BOOT_STREAM,
        )
        if data is not None and fits.abs.C_boot.size > 0:
            cov = data_influence_cov(
                losses, curves.grid, window, fits.abs.weights, seed=seed, stream=_IF_STREAM
            )
            shift = data_influence_draws(
                np.nan_to_num(cov, nan=0.0, posinf=0.0, neginf=0.0),
                bootstrap=targets.bootstrap,
                seed=seed,
                stream=_IF_STREAM + 1,
            )
            fits.abs = fit_power_law(
                curves.abs_by_ordering,
                curves.grid,
                window,
                bootstrap=targets.bootstrap,
                seed=seed,
                stream=_BOOT_STREAM,
                data_shift=shift,
            )
        fits.abs_out = _fit_out(fits.abs, ALPHA_THEORY, formulas.POWER_LAW_FIT, conf)
    except FitError as exc:
        fits.abs_out = NotComputed(reason=str(exc))
    try:
        fits.sq = fit_power_law(
            curves.sq_by_ordering,
            curves.grid,
            window,
            bootstrap=targets.bootstrap,
            seed=seed,
            stream=_BOOT_STREAM,
            data_scale=sq_scale,
        )
        fits.sq_out = _fit_out(fits.sq, ALPHA_SQ_THEORY, formulas.POWER_LAW_FIT_SQ, conf)
        fits.c2 = fit_power_law(
            curves.sq_by_ordering,
            curves.grid,
            window,
            bootstrap=targets.bootstrap,
            seed=seed,
            stream=_BOOT_STREAM,
            fixed_alpha=ALPHA_SQ_THEORY,
            k_offset=1.0,
            data_scale=sq_scale,
        )
    except FitError as exc:
        fits.sq_out = NotComputed(reason=str(exc))
    return fits


def _data_bootstrap(
    losses: np.ndarray, targets: Targets, seed: int, stream: int
) -> DataScaleBootstrap | None:
    if targets.bootstrap == 0:
        return None
    return data_scale_bootstrap(
        losses, bootstrap=targets.bootstrap, seed=seed, stream=_DATA_STREAM + stream
    )


def _check_fit(fits: _Fits, label: str, log: WarningLog) -> None:
    for est, theory, name in (
        (fits.abs, ALPHA_THEORY, "|Δ_k|"),
        (fits.sq, ALPHA_SQ_THEORY, "Δ_k²"),
    ):
        if est is None:
            continue
        decades = math.log10(est.window[1] / est.window[0]) if est.window[0] > 0 else 0.0
        if decades < MIN_WINDOW_DECADES or est.n_points < MIN_WINDOW_BINS:
            log.add(
                "fit_window_too_short",
                "sample_size",
                f"{label}: the {name} fit window {list(est.window)} spans {decades:.2f} decades "
                f"({est.n_points} bins); the exponent is poorly determined",
            )
        if abs(est.alpha - theory) > ALPHA_TOLERANCE * theory:
            log.add(
                "alpha_far_from_theory",
                "sample_size",
                f"{label}: fitted {name} exponent {est.alpha:.3f} differs from the theory's "
                f"{theory:g} by more than {ALPHA_TOLERANCE * 100:.0f} %",
            )
        if est.r2 < POOR_R2:
            log.add(
                "poor_fit",
                "sample_size",
                f"{label}: {name} power-law fit has R² = {est.r2:.3f} < {POOR_R2}",
            )


def _curve_out(curves: OrderingCurves) -> Curve:
    return Curve(
        k=[round(float(k)) for k in curves.k],
        delta=[float(v) for v in curves.abs_by_ordering.mean(axis=0)],
        delta_sq=[float(v) for v in curves.sq_by_ordering.mean(axis=0)],
        formula=f"{formulas.DELTA_ABS}; {formulas.DELTA_SQ}; bin means over log-spaced k",
    )


def _empirical(fits: _Fits, tol: float, conf: float) -> SampleSizeValue | NotComputed:
    est = fits.abs
    if est is None:
        return NotComputed(reason="the Δ_k fit could not be computed")
    k = k_empirical(est.C, est.alpha, tol)
    ci = None
    if est.C_boot.size > 1:
        ci = ceil_interval(
            percentile_interval(k_empirical_many(est.C_boot, est.alpha_boot, tol), conf)
        )
    note = None
    if k is None:
        note = "not finite: the fitted exponent is not positive or k* exceeds 1e18"
    return SampleSizeValue(
        k=k, ci=ci, formula=formulas.K_EMPIRICAL, note=note, meaning=MEANING_STABILISATION
    )


def _squared(fits: _Fits, tol: float, conf: float, rms: bool) -> SampleSizeValue | NotComputed:
    est = fits.c2
    if est is None:
        return NotComputed(reason="the Δ_k² fit could not be computed")
    if rms:
        k = k_squared_rms(est.C, tol)
        boot = np.sqrt(est.C_boot) / tol
        formula = formulas.K_SQUARED_RMS
    else:
        k = k_squared(est.C, tol)
        boot = np.sqrt(est.C_boot / tol)
        formula = formulas.K_SQUARED
    ci = ceil_interval(percentile_interval(boot, conf), minus_one=True) if boot.size > 1 else None
    return SampleSizeValue(
        k=k,
        ci=ci,
        formula=f"{formula}; C2 = {est.C:.6g} ({formulas.formula_id(formulas.C2_FIXED_SLOPE)})",
    )


def _theoretical(
    loss_bound: BoundValue | None,
    m_bound: BoundValue | None,
    radius: float | None,
    tol: float,
    tight: bool,
    theory_note: str | None = None,
) -> SampleSizeValue | NotComputed:
    missing = []
    if loss_bound is None:
        missing.append("measurements.loss_bound (or per_sample_losses for the observed max)")
    if radius is None:
        missing.append("targets.radius")
    elif radius > 0 and m_bound is None:
        missing.append("measurements.hessian_norm_bound (or per_sample_hessian_norms)")
    if missing:
        return NotComputed(reason="needs " + " and ".join(missing))
    assert loss_bound is not None and radius is not None
    m_value = m_bound.value if m_bound is not None else 0.0
    fn = k_theorem7_tight if tight else k_theorem7
    k = fn(loss_bound.value, m_value, radius, tol)
    notes = []
    if loss_bound.source == "observed_max":
        notes.append("ℓ_max is the observed maximum loss, a lower bound on the true ℓ_max")
    if m_bound is not None and m_bound.source == "per_sample_max" and radius > 0:
        notes.append(
            "M is the largest measured per-sample Hessian norm, a lower estimate of the bound "
            "Theorem 7 assumes over all samples: this k* may be optimistic"
        )
    if theory_note is not None:
        notes.append(theory_note)
    note = "; ".join(notes) if notes else None
    return SampleSizeValue(
        k=k,
        formula=formulas.K_THM7_TIGHT if tight else formulas.K_THM7,
        note=note,
        meaning=MEANING_THEOREM7,
    )


def build_sample_size_section(
    measurements: Measurements, targets: Targets, seed: int, log: WarningLog
) -> SampleSizeSection | NotComputed:
    """Loss-difference curves, their fits and k*(ε) per tolerance."""
    losses = measurements.per_sample_losses
    perturbed = measurements.perturbed_losses
    has_theory = measurements.loss_bound is not None and targets.radius is not None
    if losses is None and perturbed is None and not has_theory:
        return NotComputed(
            reason="needs measurements.per_sample_losses (empirical k*) or loss_bound, "
            "hessian_norm_bound and targets.radius (Theorem 7 k*)"
        )
    conf = targets.confidence
    missing: list[Missing] = []
    fits, curve, n = _fit_at_minimum(losses, targets, seed, log, missing)
    loss_bound, m_bound = _theorem7_bounds(measurements)
    off_minimum = []
    if perturbed is not None:
        off_minimum.append(_off_minimum_fit(perturbed, targets, seed, loss_bound, m_bound, log))
    theory_note = _theory_note(measurements)
    available, available_source = _available_samples(measurements, targets, log)
    variance, correlation, effective = _variance_and_correlation(measurements, n, conf, log)
    per_tolerance = []
    if targets.tolerances is None:
        missing.append(Missing(item="per_tolerance", reason="targets.tolerances not given"))
    else:
        bounds = _Theorem7Inputs(loss_bound, m_bound, targets.radius, theory_note)
        for tol in dict.fromkeys(targets.tolerances):
            entry = _per_tolerance(tol, fits, bounds, effective, conf, n, losses)
            per_tolerance.append(entry)
            _warn_if_extrapolated(entry, fits, tol, log)
    return SampleSizeSection(
        n_losses=n,
        orderings=targets.orderings,
        bootstrap=targets.bootstrap,
        confidence=conf,
        fit=fits.abs_out,
        fit_squared=fits.sq_out,
        curve=curve,
        loss_bound=loss_bound,
        hessian_norm_bound=m_bound,
        radius=targets.radius,
        available_samples=available,
        available_samples_source=available_source,
        loss_variance=_variance_out(variance),
        loss_correlation=correlation,
        off_minimum=off_minimum,
        per_tolerance=per_tolerance,
        missing=missing,
    )


def _fit_at_minimum(
    losses: list[float] | None,
    targets: Targets,
    seed: int,
    log: WarningLog,
    missing: list[Missing],
) -> tuple[_Fits, Curve | None, int]:
    """Step 1: the Δ_k curves of the losses at w* and their power-law fits; (fits, the curve,
    the number of losses). Too few or constant losses leave the fits not computed."""
    fits = _Fits()
    if losses is None:
        reason = "measurements.per_sample_losses not given"
        fits.abs_out = NotComputed(reason=reason)
        fits.sq_out = NotComputed(reason=reason)
        missing.append(Missing(item="fit", reason=reason))
        return fits, None, 0
    arr = np.asarray(losses, dtype=np.float64)
    n = arr.size
    if n < MIN_SAMPLES_FOR_FIT:
        log.add(
            "insufficient_samples",
            "sample_size",
            f"{n} per-sample losses; at least {MIN_SAMPLES_FOR_FIT} are needed for a Δ_k fit",
        )
        reason = f"only {n} per-sample losses (need ≥ {MIN_SAMPLES_FOR_FIT})"
        fits.abs_out = NotComputed(reason=reason)
        fits.sq_out = NotComputed(reason=reason)
        return fits, None, n
    if float(np.ptp(arr)) == 0.0:
        reason = "all per-sample losses are equal: Δ_k ≡ 0 and has no power law to fit"
        fits.abs_out = NotComputed(reason=reason)
        fits.sq_out = NotComputed(reason=reason)
        return fits, None, n
    if n < FEW_SAMPLES:
        log.add(
            "insufficient_samples",
            "sample_size",
            f"only {n} per-sample losses: the fit covers less than 3 decades of k",
        )
    if targets.orderings < FEW_ORDERINGS and targets.bootstrap > 0:
        log.add(
            "few_orderings",
            "sample_size",
            f"{targets.orderings} orderings: the bootstrap over orderings has few units "
            f"and the C and α intervals under-cover (synthetic check: ≈ 0.5 of the "
            f"nominal 0.9 at 5 orderings, ≈ 0.8 at 20); use ≥ {FEW_ORDERINGS}",
        )
    curves = loss_difference_curves(arr, orderings=targets.orderings, seed=seed)
    fits = _fit_curves(
        curves, arr, _window(n, targets), targets, seed, _data_bootstrap(arr, targets, seed, 0)
    )
    _check_fit(fits, "losses at w*", log)
    return fits, _curve_out(curves), n


def _theorem7_bounds(measurements: Measurements) -> tuple[BoundValue | None, BoundValue | None]:
    """Step 2: ℓ_max and M for Theorem 7, given or else measured; (ℓ_max, M)."""
    losses = measurements.per_sample_losses
    loss_bound = None
    if measurements.loss_bound is not None:
        loss_bound = BoundValue(
            value=measurements.loss_bound, source="input", formula=formulas.LOSS_BOUND_INPUT
        )
    elif losses is not None:
        loss_bound = BoundValue(
            value=float(max(losses)),
            source="observed_max",
            formula=formulas.LOSS_BOUND_MEASURED,
        )
    m_bound = None
    if measurements.hessian_norm_bound is not None:
        m_bound = BoundValue(
            value=measurements.hessian_norm_bound,
            source="input",
            formula=formulas.HESSIAN_BOUND_INPUT,
        )
    elif measurements.per_sample_hessian_norms is not None:
        m_bound = BoundValue(
            value=float(max(measurements.per_sample_hessian_norms)),
            source="per_sample_max",
            formula=formulas.HESSIAN_BOUND_MEASURED,
        )
    return loss_bound, m_bound


def _off_minimum_fit(
    perturbed: PerturbedLosses,
    targets: Targets,
    seed: int,
    loss_bound: BoundValue | None,
    m_bound: BoundValue | None,
    log: WarningLog,
) -> OffMinimumFit:
    """Step 3: the same fits on the losses at perturbed points, with Theorem 7's constant at
    their radius and how tight the fitted C is against it."""
    p_arr = np.asarray(perturbed.losses, dtype=np.float64)
    p_n = p_arr.shape[1]
    if p_n < MIN_SAMPLES_FOR_FIT:
        reason = f"only {p_n} samples per perturbed point (need ≥ {MIN_SAMPLES_FOR_FIT})"
        return OffMinimumFit(
            radius=perturbed.radius,
            kind=perturbed.kind,
            n_points=p_arr.shape[0],
            fit=NotComputed(reason=reason),
            fit_squared=NotComputed(reason=reason),
        )
    p_curves = loss_difference_curves(p_arr, orderings=targets.orderings, seed=seed, stream=10)
    p_fits = _fit_curves(
        p_curves,
        p_arr,
        _window(p_n, targets),
        targets,
        seed,
        _data_bootstrap(p_arr, targets, seed, 10),
    )
    _check_fit(p_fits, f"perturbed losses at radius {perturbed.radius:g}", log)
    thm7: _Theorem7 = {}
    if loss_bound is not None and m_bound is not None:
        args = (loss_bound.value, m_bound.value, perturbed.radius)
        full = theorem7_constant(*args)
        thm7 = {
            "theorem7_C": full,
            "theorem7_C_tight": theorem7_constant(*args, tight=True),
            "tightness": p_fits.abs.C / full if p_fits.abs is not None else None,
            "theorem7_formula": formulas.THM7_CONSTANT,
        }
    return OffMinimumFit(
        radius=perturbed.radius,
        kind=perturbed.kind,
        n_points=p_arr.shape[0],
        fit=p_fits.abs_out,
        fit_squared=p_fits.sq_out,
        **thm7,
    )


class _Theorem7(TypedDict, total=False):
    """An off-minimum fit's Theorem 7 constants, when the loss and Hessian bounds are known."""

    theorem7_C: float
    theorem7_C_tight: float
    tightness: float | None
    theorem7_formula: str


def _theory_note(measurements: Measurements) -> str | None:
    """The note on Theorem 7's k* when the model is outside its assumptions."""
    if measurements.theory is not None and not measurements.theory.applicable:
        return "the model is outside Theorem 7's assumptions (measurements.theory): indicative only"
    return None


def _variance_and_correlation(
    measurements: Measurements, n: int, conf: float, log: WarningLog
) -> tuple[LossVariance | None, LossCorrelation | None, tuple[float, tuple[float, float]] | None]:
    """Step 4: the loss variance, how correlated the losses look, and the effective variance
    (value, interval) the evaluation-set size uses; all None below 4 losses."""
    losses = measurements.per_sample_losses
    if losses is None or n < 4:
        return None, None, None
    arr_losses = np.asarray(losses, dtype=np.float64)
    variance = loss_variance(arr_losses, conf)
    correlation, eff_value, eff_ci = _loss_correlation(
        arr_losses, measurements.per_sample_groups, conf
    )
    if correlation.correlated:
        log.add("correlated_losses", "sample_size", correlation.note)
    return variance, correlation, (eff_value, eff_ci)


@dataclass(frozen=True)
class _Theorem7Inputs:
    """What Theorem 7's k* of every tolerance needs."""

    loss_bound: BoundValue | None
    m_bound: BoundValue | None
    radius: float | None
    note: str | None

    def k(self, tol: float, tight: bool) -> SampleSizeValue | NotComputed:
        return _theoretical(self.loss_bound, self.m_bound, self.radius, tol, tight, self.note)


def _per_tolerance(
    tol: float,
    fits: _Fits,
    bounds: _Theorem7Inputs,
    effective: tuple[float, tuple[float, float]] | None,
    conf: float,
    n: int,
    losses: list[float] | None,
) -> PerTolerance:
    """Step 5: every k*(ε) of one tolerance: empirical, Theorem 7 (and tight), squared, RMS,
    and the evaluation-set size."""
    no_losses = NotComputed(reason="measurements.per_sample_losses not given")
    empirical = _empirical(fits, tol, conf) if losses is not None else no_losses
    accuracy = _loss_accuracy(effective, tol, conf, n)
    accuracy_sq = _loss_accuracy_squared(fits, tol, conf)
    error_at = None
    if effective is not None and isinstance(empirical, SampleSizeValue) and empirical.k is not None:
        error_at = loss_error_at(empirical.k, effective[0], conf)
    squared_rms = _squared(fits, tol, conf, rms=True) if losses is not None else no_losses
    if isinstance(squared_rms, SampleSizeValue):
        squared_rms = squared_rms.model_copy(update={"meaning": MEANING_SQUARED_RMS})
    return PerTolerance(
        tolerance=tol,
        empirical=empirical,
        theoretical=bounds.k(tol, False),
        theoretical_tight=bounds.k(tol, True),
        squared=_squared(fits, tol, conf, rms=False) if losses is not None else no_losses,
        squared_rms=squared_rms,
        evaluation_set_size=accuracy,
        loss_accuracy_squared=accuracy_sq,
        loss_error_at_empirical=error_at,
    )


def _warn_if_extrapolated(entry: PerTolerance, fits: _Fits, tol: float, log: WarningLog) -> None:
    """Warn when the empirical k*(ε) lies beyond the k range the power law was fitted on."""
    empirical = entry.empirical
    if (
        isinstance(empirical, SampleSizeValue)
        and fits.abs is not None
        and (empirical.k is None or empirical.k > fits.abs.window[1])
    ):
        log.add(
            "extrapolation",
            "sample_size",
            f"empirical k*(ε={tol:g}) lies beyond the fitted range k ≤ "
            f"{fits.abs.window[1]}: the power law is extrapolated",
        )


def _variance_out(variance: LossVariance | None) -> LossVarianceOut | None:
    """The loss variance as the section reports it."""
    if variance is None:
        return None
    return LossVarianceOut(
        value=variance.variance,
        ci=variance.ci,
        se=variance.se,
        formula=formulas.LOSS_VARIANCE,
    )
