"""The budget and the main numbers of a recommendation, under stable flat names.

One reading of a :class:`~curvplan.types.planner.Recommendation` for everything that shows
or exports "the numbers": the top of the report page, experiment-tracker metrics
(``curvplan.integrations.mlflow``) and pipeline step outputs. The names are a contract
(docs/integrations.md): a renamed metric breaks every dashboard built on it.

No formula is evaluated here; every value is one the planner computed, except the data size
of a recommendation stored before it had a budget, solved from its stored fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from curvplan.types.planner import (
    BatchSizeSection,
    BCrit,
    Budget,
    CurvatureSection,
    Estimate,
    PowerLawFit,
    Recommendation,
    SampleSizeSection,
    SampleSizeValue,
    ScalingSection,
)

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ ]")


@dataclass(frozen=True)
class Headline:
    """One number: its stable name, value, unit and where it comes from."""

    name: str
    value: float
    unit: str
    label: str
    source: str


def metric_name(*parts: str) -> str:
    """Parts joined by dots; characters outside [A-Za-z0-9_.-/ ] become '_' (MLflow's rule)."""
    return ".".join(_NAME_UNSAFE.sub("_", p) for p in parts)


def tolerance_key(tolerance: float) -> str:
    """A tolerance in a metric name: 0.01 → '0.01', 1e-05 → '1e-05'."""
    return f"{tolerance:g}"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def headline_numbers(rec: Recommendation) -> list[Headline]:
    """The budget first (data, batch size, learning-rate ceiling), then the numbers behind it.

    Names: ``budget.*`` for what to do; ``sample_size.*``, ``batch.*``, ``scaling.*``,
    ``curvature.*`` for the evidence. Per-tolerance sample sizes are
    ``sample_size.k_empirical.tol_<ε>``; per-block curvature is
    ``curvature.lambda_max.<block name>``.
    """
    out: list[Headline] = []

    def add(name: str, value: Any, unit: str, label: str, source: str) -> None:
        number = _finite(value)
        if number is not None:
            out.append(Headline(name, number, unit, label, source))

    sample = rec.sample_size if isinstance(rec.sample_size, SampleSizeSection) else None
    batch = rec.batch_size if isinstance(rec.batch_size, BatchSizeSection) else None
    scaling = rec.scaling if isinstance(rec.scaling, ScalingSection) else None
    curvature = rec.curvature if isinstance(rec.curvature, CurvatureSection) else None

    if rec.budget is not None:
        _budget_numbers(rec.budget, add)
    else:  # a recommendation stored before the budget section existed
        _derived_budget(sample, batch, scaling, add)

    # ---- evidence: sample size
    if sample is not None:
        if isinstance(sample.fit, PowerLawFit):
            add("sample_size.C", sample.fit.C, "loss units", "C of Δ_k ≈ C·k^(−α)", "Δ_k fit")
            add("sample_size.alpha", sample.fit.alpha, "1", "α of Δ_k ≈ C·k^(−α)", "Δ_k fit")
            add("sample_size.r2", sample.fit.r2, "1", "r² of the Δ_k fit", "Δ_k fit")
        for row in sample.per_tolerance:
            tol = tolerance_key(row.tolerance)
            for key, value in (
                ("k_empirical", row.empirical),
                ("k_theorem7", row.theoretical),
                ("k_theorem7_tight", row.theoretical_tight),
                ("evaluation_set_size", row.evaluation_set_size),
            ):
                if isinstance(value, SampleSizeValue):
                    add(metric_name("sample_size", key, f"tol_{tol}"), value.k, "samples",
                        f"{key} at ε = {tol}", "sample-size section")  # fmt: skip
    # ---- evidence: batch
    if batch is not None:
        for key in ("b_simple", "b_noise"):
            est = getattr(batch, key)
            if isinstance(est, Estimate):
                add(f"batch.{key}", est.value, "examples", key, "gradient noise")
        crit = batch.b_crit
        if isinstance(crit, BCrit):
            add("batch.b_crit", crit.value, "examples", "B_crit", "steps-to-target fit")
            if crit.ci is not None:
                add("batch.b_crit_lo", crit.ci[0], "examples", "B_crit interval low", "fit")
                add("batch.b_crit_hi", crit.ci[1], "examples", "B_crit interval high", "fit")
            add("batch.s_min", crit.s_min, "steps", "S_min: steps at an infinite batch", "fit")
            add("batch.e_min", crit.e_min, "examples", "E_min", "fit")
    # ---- evidence: scaling
    if scaling is not None:
        add("scaling.E", scaling.E, "loss units", "irreducible loss E", "L(D) fit")
        add("scaling.A", scaling.A, "loss units", "A of L(D)", "L(D) fit")
        add("scaling.beta", scaling.beta, "1", "β of L(D)", "L(D) fit")
    # ---- evidence: curvature
    if curvature is not None:
        add("curvature.heterogeneity_ratio", curvature.heterogeneity_ratio, "1",
            "max/min block norm", "curvature")  # fmt: skip
        for b in curvature.blocks:
            add(metric_name("curvature.lambda_max", b.name), b.lambda_max, "loss/param²",
                f"λ_max of {b.name}", "curvature")  # fmt: skip
            add(metric_name("curvature.spectral_norm", b.name), b.spectral_norm, "loss/param²",
                f"‖H‖₂ of {b.name}", "curvature")  # fmt: skip
    return out


def _budget_numbers(budget: Budget, add: Any) -> None:
    data, batch, lr = budget.data, budget.batch, budget.learning_rate
    add("budget.samples", data.recommended_examples, "examples",
        "recommended training-set size", data.source)  # fmt: skip
    if data.recommended_examples_ci is not None:
        add("budget.samples_lo", data.recommended_examples_ci[0], "examples", "interval low",
            data.source)  # fmt: skip
        add("budget.samples_hi", data.recommended_examples_ci[1], "examples", "interval high",
            data.source)  # fmt: skip
    add("budget.samples_tokens", data.recommended_tokens, "tokens",
        "recommended training-set size", data.source)  # fmt: skip
    add("budget.available_samples", data.available_samples, "examples", "examples you have",
        "targets")  # fmt: skip
    if data.landscape_stabilisation is not None:
        add("budget.landscape_stabilisation", data.landscape_stabilisation.examples, "examples",
            data.landscape_stabilisation.label, "Δ_k fit")  # fmt: skip
    add("budget.target_loss", data.target_loss, "loss units", "target loss", "defaults")
    add("budget.batch_size", batch.recommended, "examples per step", "recommended batch size",
        batch.source)  # fmt: skip
    add("budget.batch_size_tokens", batch.recommended_tokens, "tokens per step",
        "recommended batch size", batch.source)  # fmt: skip
    add("budget.critical_batch_size", batch.critical, "examples per step",
        "critical batch size B_crit", batch.source)  # fmt: skip
    if batch.critical_ci is not None:
        add("budget.critical_batch_size_lo", batch.critical_ci[0], "examples per step",
            "B_crit interval low", batch.source)  # fmt: skip
        add("budget.critical_batch_size_hi", batch.critical_ci[1], "examples per step",
            "B_crit interval high", batch.source)  # fmt: skip
    add("budget.expected_steps", batch.expected_steps, "steps",
        "expected steps at the recommended batch size", batch.source)  # fmt: skip
    if data.evaluation_set_size is not None:
        add("budget.evaluation_set_size", data.evaluation_set_size.examples, "examples",
            "evaluation-set size: examples that measure the loss to ±ε",
            data.evaluation_set_size.variance_method)  # fmt: skip
    add("budget.gd_sharpness_threshold", lr.gd_sharpness_threshold, "learning rate", lr.label,
        "curvature (whole model)")  # fmt: skip


def _derived_budget(sample: Any, batch: Any, scaling: Any, add: Any) -> None:
    """The budget of a recommendation stored before the budget section existed."""
    # ---- the budget: data
    data_source = None
    solved = _data_for_target(scaling)
    if solved is not None:
        add("budget.samples", solved, "samples",
            f"training samples for loss {scaling.target_loss:g}", "scaling fit L(D)")  # fmt: skip
        data_source = "scaling"
    elif sample is not None:
        for row in sorted(sample.per_tolerance, key=lambda r: r.tolerance):
            if isinstance(row.empirical, SampleSizeValue) and row.empirical.k is not None:
                add("budget.samples", row.empirical.k, "samples",
                    f"samples for Δ_k ≤ {row.tolerance:g} (loss units)", "Δ_k fit")  # fmt: skip
                data_source = "delta_fit"
                break
    if data_source is not None and sample is not None and sample.available_samples is not None:
        add("budget.available_samples", sample.available_samples, "samples",
            "samples available", "targets")  # fmt: skip
    # ---- the budget: batch (the batch sweep's B_crit; no batch size: one number per question,
    # and a per-checkpoint batch is not the answer; no block's 2/λ_max as a learning rate)
    if batch is not None and isinstance(batch.b_crit, BCrit):
        add("budget.critical_batch_size", batch.b_crit.value, "examples per step",
            "critical batch size B_crit", "steps-to-target fit")  # fmt: skip


def _data_for_target(scaling: ScalingSection | None) -> float | None:
    """D = (A/(target − E))^(1/β), the data at which the fit L(D) = E + A·D^(−β) reaches the
    target loss (Hoffmann et al. 2022 eq. 2 without the model term; docs/formulas.md
    scaling.n_for_target), for a recommendation stored before it had a budget; None without
    a target above E or a finite size."""
    if scaling is None or scaling.target_loss is None or scaling.target_loss <= scaling.E:
        return None
    if scaling.A <= 0 or scaling.beta <= 0:
        return None
    log_d = (math.log(scaling.A) - math.log(scaling.target_loss - scaling.E)) / scaling.beta
    return math.exp(log_d) if log_d < 700 else None


def headline_dict(rec: Recommendation) -> dict[str, float]:
    """``{name: value}`` of :func:`headline_numbers` (the metrics an experiment tracker logs)."""
    return {h.name: h.value for h in headline_numbers(rec)}
