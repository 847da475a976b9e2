"""Gradient-noise scales B_simple and B_noise (McCandlish et al. 2018; docs/formulas.md#batch-size).

Two input forms:
- direct statistics |G|², tr Σ, GᵀHG, tr(HΣ), optionally with standard errors (delta-method
  intervals on the log of the ratio);
- per-step squared gradient norms at two batch sizes (App. A): unbiased per-step estimates of
  |G|² and tr Σ, averaged separately, B_simple = ratio of the averages; intervals by a bootstrap
  over steps (percentiles of the ratio of resampled averages).

|G|² must be significantly above zero (one-sided test at the requested confidence) for
B_simple to be defined; likewise GᵀHG for B_noise. Otherwise the ratio is reported undefined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

FloatArray = NDArray[np.float64]

#: The noise scales in the order the budget's noise-scale trend tries them: the first one
#: defined at ≥ 2 checkpoints leads ``budget.batch``. B_noise = tr(HΣ)/GᵀHG is the scale that
#: McCandlish et al. 2018 (§2.2, eq. 2.8) relate to B_crit; B_simple = tr Σ/|G|² (eq. 2.9)
#: equals it only when H ∝ I. On real text (benchmarks/bench_predictive.py, the one seed
#: measured: benchmarks/results/predictive-quick-20261201-1703.md) the B_simple trend gave
#: 0.73× the brute-force B_crit and the B_noise trend 0.18–0.25×, so B_simple leads and B_noise
#: is the fallback (docs/budget.md); the 2-seed full run is still to confirm it.
TREND_SCALE_ORDER: tuple[str, ...] = ("B_simple", "B_noise")

#: (numerator, denominator) field names of each noise scale in the measurements.
NOISE_SCALE_FIELDS: dict[str, tuple[str, str]] = {
    "B_noise": ("trace_h_sigma", "gHg"),
    "B_simple": ("trace_sigma", "grad_sq_norm"),
}


@dataclass(frozen=True)
class Stat:
    """A statistic with its standard error (None when unknown) and its bootstrap replicates."""

    value: float
    se: float | None
    ci: tuple[float, float] | None
    formula: str


@dataclass(frozen=True)
class Ratio:
    """A noise-scale ratio, or the reason it is undefined."""

    value: float | None
    ci: tuple[float, float] | None
    se_log: float | None
    formula: str
    undefined_reason: str | None = None


def two_batch_estimates(
    b_small: int, b_big: int, sq_small: FloatArray, sq_big: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Per-step unbiased estimates (McCandlish et al. 2018, App. A):

    |G|²_t = (B_big·|G_big,t|² − B_small·|G_small,t|²)/(B_big − B_small)
    S_t    = (|G_small,t|² − |G_big,t|²)/(1/B_small − 1/B_big)

    with E|G_B|² = |G|² + tr Σ/B these have expectations |G|² and tr Σ. The same algebra on
    h_B = G_BᵀHG_B gives GᵀHG and tr(HΣ) (docs/formulas.md#batch-size).
    """
    bs, bb = float(b_small), float(b_big)
    g2 = (bb * sq_big - bs * sq_small) / (bb - bs)
    tr = (sq_small - sq_big) / (1.0 / bs - 1.0 / bb)
    return g2, tr


def _z(confidence: float, dof: int | None = None) -> float:
    """Two-sided normal quantile, or Student-t with `dof` degrees of freedom when given."""
    if dof is not None and dof > 0:
        return float(stats.t.ppf((1 + confidence) / 2, dof))
    return float(stats.norm.ppf((1 + confidence) / 2))


def _z_one_sided(confidence: float, dof: int | None = None) -> float:
    if dof is not None and dof > 0:
        return float(stats.t.ppf(confidence, dof))
    return float(stats.norm.ppf(confidence))


def significantly_positive(
    value: float, se: float | None, confidence: float, dof: int | None = None
) -> bool:
    """One-sided test value > 0 at `confidence`; without an SE only value > 0 is required."""
    if se is None:
        return value > 0
    return value - _z_one_sided(confidence, dof) * se > 0


def ratio_direct(
    numerator: float,
    denominator: float,
    numerator_se: float | None,
    denominator_se: float | None,
    confidence: float,
    formula: str,
    names: tuple[str, str],
    dof: int | None = None,
) -> Ratio:
    """numerator/denominator with a delta-method interval on log(ratio) (independent errors).

    Used for B_simple = tr Σ/|G|² and B_noise = tr(HΣ)/GᵀHG (McCandlish et al. 2018). With
    `dof` (sample count − 1) the quantiles are Student-t, else normal."""
    num_name, den_name = names
    if not significantly_positive(denominator, denominator_se, confidence, dof):
        return Ratio(
            None,
            None,
            None,
            formula,
            f"{den_name} = {denominator:.4g}"
            + (f" ± {denominator_se:.3g}" if denominator_se is not None else "")
            + f" is not significantly above zero at confidence {confidence}",
        )
    if numerator <= 0:
        return Ratio(None, None, None, formula, f"{num_name} = {numerator:.4g} is not positive")
    value = numerator / denominator
    if not math.isfinite(value):
        return Ratio(None, None, None, formula, f"{num_name}/{den_name} overflows float64")
    if numerator_se is None or denominator_se is None:
        return Ratio(value, None, None, formula)
    se_log = math.hypot(numerator_se / numerator, denominator_se / denominator)
    z = _z(confidence, dof)
    return Ratio(
        value, (value * math.exp(-z * se_log), value * math.exp(z * se_log)), se_log, formula
    )


def ratio_of_means_bootstrap(
    numerator_series: FloatArray,
    denominator_series: FloatArray,
    *,
    confidence: float,
    bootstrap: int,
    rng: np.random.Generator,
    formula: str,
    names: tuple[str, str],
) -> tuple[Stat, Stat, Ratio]:
    """mean(numerator)/mean(denominator) over steps with a bootstrap over steps.

    Separate averages then their ratio, never an average of per-step ratios (the per-step
    estimates can be negative; McCandlish et al. 2018 App. A). Standard errors of the means
    assume independent steps."""
    num_name, den_name = names
    t = numerator_series.size
    num_mean = float(numerator_series.mean())
    den_mean = float(denominator_series.mean())
    num_se = float(numerator_series.std(ddof=1) / math.sqrt(t)) if t > 1 else None
    den_se = float(denominator_series.std(ddof=1) / math.sqrt(t)) if t > 1 else None
    z = _z(confidence)
    num_stat = Stat(
        num_mean,
        num_se,
        None if num_se is None else (num_mean - z * num_se, num_mean + z * num_se),
        "",
    )
    den_stat = Stat(
        den_mean,
        den_se,
        None if den_se is None else (den_mean - z * den_se, den_mean + z * den_se),
        "",
    )
    if not significantly_positive(den_mean, den_se, confidence):
        reason = (
            f"{den_name} = {den_mean:.4g}"
            + (f" ± {den_se:.3g}" if den_se is not None else "")
            + f" is not significantly above zero at confidence {confidence}"
        )
        return num_stat, den_stat, Ratio(None, None, None, formula, reason)
    if num_mean <= 0:
        return (
            num_stat,
            den_stat,
            Ratio(None, None, None, formula, f"{num_name} = {num_mean:.4g} is not positive"),
        )
    value = num_mean / den_mean
    if not math.isfinite(value):
        reason = f"{num_name}/{den_name} overflows float64"
        return num_stat, den_stat, Ratio(None, None, None, formula, reason)
    ci = None
    se_log = None
    if t > 1 and bootstrap > 0:
        counts = rng.multinomial(t, np.full(t, 1.0 / t), bootstrap).astype(np.float64)
        num_b = counts @ numerator_series / t
        den_b = counts @ denominator_series / t
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(den_b > 0, num_b / den_b, np.inf)
        lo, hi = np.quantile(
            ratios, [(1 - confidence) / 2, (1 + confidence) / 2], method="inverted_cdf"
        )
        ci = (float(lo), float(hi))  # hi may be inf (resampled |G|² ≤ 0): reported as null
        finite = ratios[np.isfinite(ratios) & (ratios > 0)]
        se_log = float(np.log(finite).std(ddof=1)) if finite.size > 1 else None
    return num_stat, den_stat, Ratio(value, ci, se_log, formula)
