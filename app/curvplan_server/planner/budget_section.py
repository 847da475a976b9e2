"""The budget: one place that says how much data and which batch size (docs/budget.md).

What leads, in order:

* data — the data-sweep size for the target loss, L(D) = E + A·D^(−β) solved for D
  (Kaplan et al. 2020 eq. 1.4 form), when a data sweep exists; else the loss-accuracy sample
  size k = z²σ̂²/ε² (docs/numbers.md); the landscape-stabilisation k*(ε) of Petrov et al.
  (2025) beside it, labelled as such.
* batch — B_crit from a batch sweep (S = S_min(1 + B_crit/B), McCandlish et al. 2018
  eq. 2.11); else the noise-scale trend over intermediate checkpoints evaluated at the target
  loss (B_crit ≈ B_noise, McCandlish et al. 2018 §2.2); else not available, with the reason.
  A single checkpoint's noise scale is never used as a constant for the whole run.
* learning rate — 2/λ_max, the stability limit of gradient descent (Cohen et al. 2021).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from curvplan.types.planner import (
    DEFAULT_TOLERANCE_RATIO,
    BatchSizeSection,
    BCrit,
    Budget,
    BudgetBatch,
    BudgetData,
    BudgetDefaults,
    BudgetLearningRate,
    CurvatureSection,
    LandscapeStabilisation,
    Measurements,
    NoiseTrendPoint,
    SampleSizeSection,
    SampleSizeValue,
    ScalingSection,
    Targets,
)
from curvplan_core.planner import formulas
from curvplan_core.planner.critical_batch import nearest_power_of_two
from curvplan_core.planner.gradient_noise import NOISE_SCALE_FIELDS, TREND_SCALE_ORDER

TARGET_LOSS_RULE = (
    "without targets.target_loss the target is the mean loss at w* (the loss the analysed "
    "checkpoint reached): the budget then answers 'how much data and which batch size to get "
    "back to this loss'"
)
STEPS_FORMULA = formulas.BUDGET_EXPECTED_STEPS
TREND_FORMULA = formulas.BUDGET_NOISE_TREND


def default_targets(measurements: Measurements, targets: Targets) -> tuple[Targets, BudgetDefaults]:
    """Targets with the documented defaults filled in, and what was assumed."""
    losses = measurements.per_sample_losses
    mean_loss = float(np.mean(losses)) if losses else None
    update: dict[str, object] = {}
    if targets.tolerances is None and mean_loss is not None and mean_loss > 0:
        update["tolerances"] = [DEFAULT_TOLERANCE_RATIO * mean_loss]
    if targets.target_loss is None and mean_loss is not None:
        update["target_loss"] = mean_loss
    effective = targets.model_copy(update=update) if update else targets
    defaults = BudgetDefaults(
        tolerances_given=targets.tolerances is not None,
        tolerance_ratio=DEFAULT_TOLERANCE_RATIO,
        mean_loss_at_w_star=mean_loss,
        tolerances=list(effective.tolerances or []),
        target_loss_given=targets.target_loss is not None,
        target_loss=effective.target_loss,
        target_loss_rule=TARGET_LOSS_RULE,
    )
    return effective, defaults


def _available(measurements: Measurements, targets: Targets) -> int | None:
    value = getattr(targets, "available_samples", None)
    return value if value is not None else measurements.available_samples


def _tokens_per_example(measurements: Measurements) -> float | None:
    return getattr(measurements, "tokens_per_example", None)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def build_data(
    measurements: Measurements,
    targets: Targets,
    sample_size: SampleSizeSection | object,
    scaling: ScalingSection | object,
) -> tuple[BudgetData, list[str]]:
    warnings: list[str] = []
    available = _available(measurements, targets)
    tokens = _tokens_per_example(measurements)
    conf = targets.confidence
    first = None
    if isinstance(sample_size, SampleSizeSection) and sample_size.per_tolerance:
        first = sample_size.per_tolerance[0]
    loss_acc = getattr(first, "loss_accuracy", None) if first is not None else None
    loss_acc = loss_acc if isinstance(loss_acc, SampleSizeValue) else None
    stab = None
    if first is not None and isinstance(first.empirical, SampleSizeValue):
        stab = LandscapeStabilisation(
            examples=first.empirical.k,
            ci=first.empirical.ci,
            tolerance=first.tolerance,
            label="landscape stabilisation k*(ε) (Petrov et al. 2025): beyond it one more "
            "example changes the average loss by about ε or less; it is not the accuracy of "
            "the loss, which needs loss_accuracy_examples",
        )
    data = None
    if isinstance(scaling, ScalingSection) and isinstance(scaling.n_for_target_loss, float):
        n = scaling.n_for_target_loss
        ci = scaling.n_for_target_loss_ci
        data = BudgetData(
            recommended_examples=math.ceil(n) if math.isfinite(n) else None,
            recommended_examples_ci=ci,
            recommended_tokens=None if tokens is None else math.ceil(n) * tokens,
            source="data_sweep",
            criterion="data sweep: the size at which the fitted L(D) = E + A·D^(−β) reaches the "
            "target loss leads, because it answers how low training on that much data gets "
            "the held-out loss",
            guarantee=f"Training on about {_fmt(n)} examples is predicted to reach a held-out "
            f"loss of {scaling.target_loss:.4g} (nats per token); the {conf:.0%} interval of the "
            "size reflects the fit's uncertainty. It assumes the same model, optimizer, early "
            "stopping and data distribution as the sweep.",
            target_loss=scaling.target_loss,
            tolerance=None if first is None else first.tolerance,
            loss_accuracy_examples=None if loss_acc is None else loss_acc.k,
            landscape_stabilisation=stab,
        )
    elif isinstance(scaling, ScalingSection) and scaling.n_for_target_loss == "unreachable":
        warnings.append(
            f"data: the target loss {scaling.target_loss} is at or below the fitted irreducible "
            f"loss E = {scaling.E:.4g}: no amount of data reaches it with this model"
        )
    if data is None and loss_acc is not None and loss_acc.k is not None and first is not None:
        eps = first.tolerance
        data = BudgetData(
            recommended_examples=loss_acc.k,
            recommended_examples_ci=loss_acc.ci,
            recommended_tokens=None if tokens is None else loss_acc.k * tokens,
            source="loss_accuracy",
            criterion="loss accuracy (k = z²σ̂²/ε²) leads: no data sweep was given, and it is the "
            "number whose guarantee is about the loss itself; k*(ε) is shown beside it",
            guarantee=f"With {loss_acc.k:,} examples drawn like the measured ones, the average "
            f"loss at these weights is within ±{eps:.3g} nats of its population value with "
            f"probability ≈ {conf:.0%}. It says how precisely that many examples measure the "
            "loss, not how low training on them gets it (run a data sweep for that).",
            tolerance=eps,
            loss_accuracy_examples=loss_acc.k,
            landscape_stabilisation=stab,
        )
    if data is None:
        reason = (
            "no data sweep (measurements.loss_vs_data with targets.target_loss) and no "
            "loss-accuracy sample size (needs measurements.per_sample_losses)"
        )
        if isinstance(scaling, ScalingSection) and scaling.n_for_target_loss == "unreachable":
            reason = "the target loss is below the data sweep's irreducible loss"
        return (
            BudgetData(
                recommended_examples=None,
                source="not_available",
                criterion="nothing to lead with",
                guarantee="no recommendation",
                landscape_stabilisation=stab,
                available_samples=available,
                reason=reason,
            ),
            warnings,
        )
    data.available_samples = available
    if available is not None and data.recommended_examples is not None:
        ci = data.recommended_examples_ci
        upper = ci[1] if ci is not None and ci[1] is not None else None
        need = upper if upper is not None else data.recommended_examples
        data.available_is_enough = available >= need
        data.available_note = (
            f"you have {available:,} examples; the recommendation needs "
            f"{data.recommended_examples:,}"
            + (f" (up to {_fmt(upper)} at the interval's upper end)" if upper is not None else "")
        )
        if not data.available_is_enough:
            warnings.append(f"data: {data.available_note}: not enough data")
    elif available is None:
        data.available_note = "targets.available_samples not given: enough data is not assessed"
    return data, warnings


def _trend_at_target(
    points: list[NoiseTrendPoint], target: float | None, confidence: float
) -> tuple[float, tuple[float | None, float | None] | None, str] | str:
    """(B, interval, which) from the trend at the target loss; or the reason it is missing."""
    if target is None:
        return "no target loss"
    rows: list[tuple[float, float, float | None]] = []
    which = "B_noise"
    z = float(stats.norm.ppf((1 + confidence) / 2))
    for name in TREND_SCALE_ORDER:  # the leading scale is one named constant
        num, den = NOISE_SCALE_FIELDS[name]
        rows = []
        for p in points:
            a, b = getattr(p, num), getattr(p, den)
            if p.loss is None or a is None or b is None or a <= 0 or b <= 0:
                continue
            a_se, b_se = getattr(p, f"{num}_se"), getattr(p, f"{den}_se")
            if b_se is not None and b <= z * b_se:
                continue  # the denominator is not significantly positive: ratio undefined
            se = getattr(p, "log_b_noise_se" if name == "B_noise" else "log_b_simple_se", None)
            if se is None and a_se is not None and b_se is not None:
                se = math.hypot(a_se / a, b_se / b)  # delta method on log(a/b)
            rows.append((p.loss, math.log(a / b), se))
        which = name
        if len(rows) >= 2:
            break
    if len(rows) < 2:
        return (
            "the noise scale is defined (significantly positive |G|² or GᵀHG), with a loss, at "
            "fewer than 2 intermediate checkpoints; "
            "a single checkpoint's value is not used as a constant for the whole run"
        )
    loss = np.array([r[0] for r in rows])
    logb = np.array([r[1] for r in rows])
    se = np.array([r[2] if r[2] else np.nan for r in rows])
    if np.unique(loss).size < 2:
        return "the intermediate checkpoints have the same loss"
    w = np.where(np.isfinite(se) & (se > 0), 1.0 / np.maximum(se, 1e-6) ** 2, 1.0)
    x = np.column_stack([np.ones_like(loss), loss])
    xtw = x.T * w
    cov_unscaled = np.linalg.inv(xtw @ x)
    beta = cov_unscaled @ (xtw @ logb)
    x0 = np.array([1.0, target])
    center = float(x0 @ beta)
    n = loss.size
    ci = None
    if n >= 3:
        resid = logb - x @ beta
        s2 = float((w * resid**2).sum() / (n - 2))
        var = float(x0 @ cov_unscaled @ x0) * s2
        t = float(stats.t.ppf((1 + confidence) / 2, n - 2))
        half = t * math.sqrt(max(var, 0.0))
        ci = (math.exp(center - half), math.exp(center + half))
    elif np.isfinite(se).all():
        var = float(x0 @ cov_unscaled @ x0)
        z = float(stats.norm.ppf((1 + confidence) / 2))
        ci = (math.exp(center - z * math.sqrt(var)), math.exp(center + z * math.sqrt(var)))
    return math.exp(center), ci, which


def build_batch(
    measurements: Measurements, targets: Targets, batch: BatchSizeSection | object
) -> tuple[BudgetBatch, list[str]]:
    warnings: list[str] = []
    tokens = _tokens_per_example(measurements)
    bcrit = batch.b_crit if isinstance(batch, BatchSizeSection) else None

    def tok(x: float | None) -> float | None:
        return None if x is None or tokens is None else x * tokens

    def tok_ci(ci: tuple[float | None, float | None] | None):
        if ci is None or tokens is None:
            return None
        return tuple(None if v is None else v * tokens for v in ci)

    if isinstance(bcrit, BCrit) and getattr(bcrit, "unit", "examples") == "examples":
        rec = nearest_power_of_two(bcrit.value)
        steps = steps_ci = None
        if rec is not None:
            steps = bcrit.s_min * (1 + bcrit.value / rec)
            if bcrit.s_min_ci is not None and bcrit.ci is not None:
                lo_s, hi_s = bcrit.s_min_ci
                lo_b, hi_b = bcrit.ci
                if None not in (lo_s, hi_s, lo_b, hi_b):
                    steps_ci = (lo_s * (1 + lo_b / rec), hi_s * (1 + hi_b / rec))
        lo, hi = bcrit.measured_range or (None, None)
        if lo is not None and not lo <= bcrit.value <= hi:
            warnings.append(
                f"batch: B_crit = {bcrit.value:.4g} lies outside the swept batch sizes "
                f"{lo}–{hi}: extrapolated"
            )
        return (
            BudgetBatch(
                recommended=rec,
                recommended_tokens=tok(rec),
                critical=bcrit.value,
                critical_ci=bcrit.ci,
                critical_tokens=tok(bcrit.value),
                critical_tokens_ci=tok_ci(bcrit.ci),
                tokens_per_example=tokens,
                source="batch_sweep",
                basis="B_crit = E_min/S_min fitted to the batch sweep's steps to the target loss "
                "(S(B) = S_min·(1 + B_crit/B), McCandlish et al. 2018, eq. 2.11)",
                target_loss=targets.target_loss,
                expected_steps=steps,
                expected_steps_ci=steps_ci,
                expected_steps_formula=STEPS_FORMULA,
                expected_examples=None if steps is None or rec is None else steps * rec,
            ),
            warnings,
        )
    trend = list(getattr(measurements, "gradient_noise_trend", None) or [])
    found = _trend_at_target(trend, targets.target_loss, targets.confidence) if trend else None
    if isinstance(found, tuple):
        value, ci, which = found
        losses = [p.loss for p in trend if p.loss is not None]
        target = targets.target_loss
        if target is not None and losses and not min(losses) <= target <= max(losses):
            warnings.append(
                f"batch: the target loss {target:.4g} is outside the checkpoints' losses "
                f"{min(losses):.4g}–{max(losses):.4g}: the noise-scale trend is extrapolated"
            )
        rec = nearest_power_of_two(value)
        return (
            BudgetBatch(
                recommended=rec,
                recommended_tokens=tok(rec),
                critical=value,
                critical_ci=ci,
                critical_tokens=tok(value),
                critical_tokens_ci=tok_ci(ci),
                tokens_per_example=tokens,
                source="noise_scale_trend",
                basis=f"{which} trend over {len(trend)} intermediate checkpoints evaluated at "
                f"the target loss ({TREND_FORMULA}); B_crit ≈ B_noise (McCandlish et al. 2018 "
                "§2.2; B_simple is its proxy when the Hessian terms are missing)",
                target_loss=target,
                reason="expected steps need S_min, which only a batch sweep measures",
            ),
            warnings,
        )
    if trend or measurements.gradient_noise is not None:
        reason = (
            found
            if isinstance(found, str)
            else (
                "only one checkpoint's noise scale was measured; its late value is not used as a "
                "constant for the whole run: give intermediate checkpoints or run a batch sweep"
            )
        )
    else:
        reason = (
            "no batch sweep (measurements.steps_to_target) and no noise-scale trend "
            "(intermediate checkpoints): run a batch sweep, or analyze with "
            "intermediate_checkpoints"
        )
    if isinstance(bcrit, BCrit):
        reason = "B_crit is in tokens and tokens_per_example is unknown; " + reason
    return (
        BudgetBatch(
            recommended=None,
            critical=None,
            tokens_per_example=tokens,
            source="not_available",
            basis="not available",
            target_loss=targets.target_loss,
            reason=reason,
        ),
        warnings,
    )


def build_learning_rate(curvature: CurvatureSection | object) -> BudgetLearningRate:
    label = (
        "stability limit of gradient descent / SGD: η < 2/λ_max (Cohen et al. 2021); not a "
        "limit for Adam or other preconditioned optimizers"
    )
    blocks = curvature.blocks if isinstance(curvature, CurvatureSection) else []
    positive = [b for b in blocks if b.lambda_max > 0]
    if not positive:
        return BudgetLearningRate(
            gd_stability_limit=None,
            lambda_max=None,
            label=label,
            reason="no block spectra with a positive λ_max (measurements.blocks)",
        )
    top = max(positive, key=lambda b: b.lambda_max)
    return BudgetLearningRate(
        gd_stability_limit=2.0 / top.lambda_max,
        lambda_max=top.lambda_max,
        lambda_max_source=f"largest block λ_max ({top.name}); the full Hessian's λ_max is at "
        "least this, so 2/λ_max here is an upper bound on the limit",
        label=label,
    )


def build_budget(
    measurements: Measurements,
    targets: Targets,
    defaults: BudgetDefaults,
    *,
    sample_size: object,
    batch_size: object,
    scaling: object,
    curvature: object,
) -> Budget:
    """The budget from the plan's sections (``targets`` with defaults already filled in)."""
    data, w1 = build_data(measurements, targets, sample_size, scaling)
    batch, w2 = build_batch(measurements, targets, batch_size)
    warnings = w1 + w2
    if not defaults.tolerances_given and defaults.tolerances:
        warnings.append(
            f"defaults: tolerance ε = {defaults.tolerances[0]:.4g} nats = "
            f"{defaults.tolerance_ratio:g} × the mean loss at w* (targets.tolerances not given)"
        )
    if not defaults.target_loss_given and defaults.target_loss is not None:
        warnings.append(
            f"defaults: target loss = {defaults.target_loss:.4g} nats, the mean loss at w* "
            "(targets.target_loss not given)"
        )
    return Budget(
        data=data,
        batch=batch,
        learning_rate=build_learning_rate(curvature),
        defaults=defaults,
        warnings=warnings,
    )
