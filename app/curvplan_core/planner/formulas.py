"""The formula of every number the planner reports: ``"<id>: <one-line formula>"``.

The id is stable (a client may key on it); the line says what the number is. What each
number means, its assumptions, the paper's equation and our corrections are explained in
``docs/formulas.md`` under the same id (a test checks that every id has its section).
"""

from __future__ import annotations

from typing import Final


def formula(formula_id: str, text: str) -> str:
    """``"<id>: <text>"``: how a reported number names its formula."""
    return f"{formula_id}: {text}"


def formula_id(text: str) -> str:
    """The id of a formula string built by :func:`formula`."""
    return text.split(": ", 1)[0]


# Sample size (Petrov et al. 2025)
DELTA_ABS: Final = formula(
    "sample.delta", "Δ_k = |L_{k+1} − L_k| = |l_{k+1} − L_k|/(k+1), mean over random orderings"
)
DELTA_SQ: Final = formula("sample.delta_sq", "Δ2_k = mean over orderings of (L_{k+1} − L_k)²")
FIT_INTERVALS: Final = formula(
    "sample.fit_intervals", "bootstrap percentiles over orderings and over the N-sample draw"
)
POWER_LAW_FIT: Final = formula(
    "sample.power_law_fit",
    "Δ_k ≈ C·k^(−α), weighted least squares in log space on log-binned k; CIs: "
    "sample.fit_intervals",
)
POWER_LAW_FIT_SQ: Final = formula(
    "sample.power_law_fit_sq",
    "Δ2_k ≈ C2·k^(−α2), same fit as sample.power_law_fit; CIs: sample.fit_intervals",
)
C2_FIXED_SLOPE: Final = formula(
    "sample.c2_fixed_slope", "C2 = weighted geometric mean of Δ2_k·(k+1)² over the fit window"
)
K_EMPIRICAL: Final = formula("sample.k_empirical", "k*(ε) = ⌈(C/ε)^(1/α)⌉")
K_THM7: Final = formula("sample.k_theorem7", "k* = ⌈(2ℓ_max + M·R²)/ε⌉ − 1")
K_THM7_TIGHT: Final = formula("sample.k_theorem7_tight", "k* = ⌈(ℓ_max + M·R²)/ε⌉ − 1")
K_SQUARED: Final = formula("sample.k_squared", "k* = ⌈√(C2/ε)⌉ − 1 (ε on the mean Δ2)")
K_SQUARED_RMS: Final = formula("sample.k_squared_rms", "k* = ⌈√C2/ε⌉ − 1 (ε on √Δ2)")
LOSS_VARIANCE: Final = formula(
    "sample.loss_variance",
    "σ² = sample variance of the losses; CI σ²·exp(±z·se/σ²), se = √((m₄ − σ⁴(n−3)/(n−1))/n)",
)
LOSS_VARIANCE_CLUSTER: Final = formula(
    "sample.loss_variance_cluster",
    "σ²_eff = n·G/(G−1)·Σ_g(Σ_{i∈g}(l_i − l̄))²/n² (CR1); CI via χ²_{G−1}; deff = σ²_eff/s²",
)
K_LOSS_ACCURACY: Final = formula(
    "sample.k_loss_accuracy",
    "n = ⌈z²·σ²_eff/ε²⌉, z = Φ⁻¹((1 + confidence)/2), σ²_eff = σ² or cluster-robust; CI "
    "from its CI",
)
K_LOSS_ACCURACY_SQ: Final = formula(
    "sample.k_loss_accuracy_sq", "n = ⌈z²·C2/ε²⌉ (C2 ≈ σ² from the Δ2_k fit); CI over C2 draws"
)
THM7_CONSTANT: Final = formula(
    "sample.theorem7_constant",
    "|Δ_k| ≤ (2ℓ_max + M·r²)/(k+1); tight: ℓ_max + M·r²; tightness = C/(2ℓ_max + M·r²)",
)

LOSS_BOUND_INPUT: Final = formula("sample.loss_bound_input", "ℓ_max as given")
LOSS_BOUND_MEASURED: Final = formula(
    "sample.loss_bound_measured", "ℓ_max = max_i l_i(w*) over the given losses (a lower bound)"
)
HESSIAN_BOUND_INPUT: Final = formula("sample.hessian_bound_input", "M as given")
HESSIAN_BOUND_MEASURED: Final = formula(
    "sample.hessian_bound_measured", "M = max_i ‖H_i(w*)‖₂ over the measured samples"
)

# Batch size (McCandlish et al. 2018)
GRAD_SQ_DIRECT: Final = formula("batch.grad_sq_direct", "|G|² as measured")
TRACE_SIGMA_DIRECT: Final = formula("batch.trace_sigma_direct", "tr Σ as measured")
GHG_DIRECT: Final = formula("batch.ghg_direct", "GᵀHG as measured")
TRACE_H_SIGMA_DIRECT: Final = formula("batch.trace_h_sigma_direct", "tr(HΣ) as measured")
GRAD_SQ_TWO_BATCH: Final = formula(
    "batch.grad_sq_two_batch",
    "|G|² = (B_big|G_big|² − B_small|G_small|²)/(B_big − B_small), mean over steps",
)
TRACE_SIGMA_TWO_BATCH: Final = formula(
    "batch.trace_sigma_two_batch",
    "tr Σ = (|G_small|² − |G_big|²)/(1/B_small − 1/B_big), mean over steps",
)
GHG_TWO_BATCH: Final = formula(
    "batch.ghg_two_batch", "GᵀHG = (B_big h_big − B_small h_small)/(B_big − B_small)"
)
TRACE_H_SIGMA_TWO_BATCH: Final = formula(
    "batch.trace_h_sigma_two_batch", "tr(HΣ) = (h_small − h_big)/(1/B_small − 1/B_big)"
)
B_SIMPLE: Final = formula("batch.b_simple", "B_simple = tr Σ/|G|²")
B_SIMPLE_TWO_BATCH: Final = formula(
    "batch.b_simple_two_batch", "B_simple = mean(tr Σ_t)/mean(|G|²_t); CI bootstrap over steps"
)
B_NOISE: Final = formula("batch.b_noise", "B_noise = tr(HΣ)/GᵀHG")
B_NOISE_TWO_BATCH: Final = formula(
    "batch.b_noise_two_batch",
    "B_noise = tr(HΣ)/GᵀHG from the two-batch estimators; CI bootstrap over steps",
)
DELTA_METHOD: Final = "; CI: delta method on log(ratio), independent errors (batch.delta_method)"
JACKKNIFE_LOG_RATIO: Final = (
    "; CI: ratio·exp(±t·se), se = jackknife of log(ratio) on the same gradients "
    "(batch.jackknife_log_ratio)"
)
NOISE_RELIABILITY: Final = formula(
    "batch.noise_reliability",
    "P(defined), median estimate/truth | defined: wild bootstrap at the measured statistics",
)
B_CRIT_FIT: Final = formula(
    "batch.b_crit_fit",
    "S = S_min(1 + B_crit/B), variance-function GLS on log S, profile CIs; E_min = B_crit·S_min",
)
B_CRIT_LINEAR: Final = formula(
    "batch.b_crit_linear",
    "1/S = a + b/E with E = B·S: S_min = 1/a, B_crit = −b (informational, no alarm)",
)
B_20PCT: Final = formula(
    "batch.b_20pct_overhead", "S(B)·B/(S(B0)·B0) = 1.2 ⇒ B = 1.2·B0 + 0.2·B_crit"
)
LR_SCALING: Final = formula(
    "batch.lr_scaling", "ε_opt(B) = ε_max/(1 + B_noise/B), ε_max = |G|²/GᵀHG"
)

# Data scaling
SCALING_FIT: Final = formula(
    "scaling.fit",
    "L(D) = E + A·D^(−β), variance-function GLS; CIs: mean of model-based and HC3 cov, Student-t",
)

# Curvature
HETEROGENEITY: Final = formula(
    "curvature.heterogeneity", "max/min of the per-block spectral norms ‖H_B‖"
)
BLOCK_THRESHOLD: Final = formula(
    "curvature.block_threshold", "2/λ_max(H_gg) per block: an upper bound on 2/λ_max(H)"
)
ASSUMPTION1: Final = formula(
    "curvature.assumption1",
    "2·rms_i|g_i − ḡ|/(M·R): dropped first-order term over the second-order bound",
)

# The budget (docs/budget.md)
BUDGET_EXPECTED_STEPS: Final = formula(
    "budget.expected_steps",
    "S(B) = S_min·(1 + B_crit/B) at the recommended B; CI from the S_min and B_crit CI ends",
)
BUDGET_NOISE_TREND: Final = formula(
    "budget.noise_trend",
    "log B = a + b·L fitted over the checkpoints (weights 1/se²), evaluated at the target L",
)
BUDGET_SHARPNESS_THRESHOLD: Final = formula(
    "budget.gd_sharpness_threshold",
    "η = 2/λ_max(H), λ_max of the whole-model Hessian (one Lanczos over all parameters)",
)
BUDGET_DATA_SWEEP: Final = formula(
    "budget.data_sweep",
    "D = (A/(L* − E))^(1/β) from L(D) = E + A·D^(−β); unreachable only if L* < E's lower CI end",
)
BUDGET_BRANCHED_CBS: Final = formula(
    "budget.branched_cbs",
    "CBS(t) = max{B : L_B(t+Δ) ≤ L_B₀(t+Δ) + ε}, branches from checkpoint t (Merrill et al. 2025)",
)
BUDGET_BRANCHED_EFFICIENCY: Final = formula(
    "budget.branched_efficiency",
    "E/e_B = (B_c+B)/(B_c+B₀), e_B = B₀'s examples to B's end loss; LS fit (McCandlish eq. 2.11)",
)
BUDGET_BRANCHED_CROSSING: Final = formula(
    "budget.branched_crossing",
    "B_ε = B_k·(B_k+1/B_k)^((ε − x_k)/(x_k+1 − x_k)), x: end-of-window excess over B₀",
)
BUDGET_BATCH_SCALING_LAW: Final = formula(
    "budget.batch_scaling_law",
    "B_crit(D) = c·D^γ: WLS of log B_crit on log D, weights 1/(v_i + τ²); bootstrap over sweep CIs",
)
BUDGET_TARGET_RUN_STEPS: Final = formula(
    "budget.target_run_steps", "S = D/(B·tokens_per_example): the target run's tokens per step"
)
