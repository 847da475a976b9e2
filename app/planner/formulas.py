"""The formulas behind every number the planner reports.

"digest" = docs/science/paper-digest.md.
"""

DELTA_ABS = (
    "Δ_k = |L_{k+1} − L_k| = |l_{k+1} − L_k|/(k+1) averaged over random orderings "
    "(Petrov et al. 2025 §3.3; digest §3, §8 item 3)"
)
DELTA_SQ = "Δ2_k = mean over orderings of (L_{k+1} − L_k)² (squared criterion; digest §6.4)"
FIT_INTERVALS = (
    "intervals: percentiles over bootstrap replicates combining (i) the fit refitted on "
    "orderings resampled with replacement (randomness of the R orderings) and (ii) an "
    "independent draw of the error from drawing the N samples: for Δ_k a normal draw of "
    "(log C, α) with the covariance of their influence functions over the N losses "
    "(E|l − L_k| per bin, CLT for L_k), for Δ2_k a grouped bootstrap over the N losses of "
    "Var l, which sets C2; so the intervals cover the population C, α, k* for a fresh draw of "
    "N i.i.d. samples, not only the given losses (synthetic check at nominal 0.90, N = 1000, "
    "R = 100: k* 0.87-0.88, C 0.87, α 0.79-0.90; k* intervals from the orderings alone: "
    "< 0.5)"
)
POWER_LAW_FIT = (
    "Δ_k ≈ C·k^(−α): weighted least squares in log space on log-binned k, weights "
    "1/Var(log mean) across orderings (digest §8 item 4); " + FIT_INTERVALS
)
POWER_LAW_FIT_SQ = "Δ2_k ≈ C2·k^(−α2), same fit as Δ_k (digest §6.4, §8 item 4); " + FIT_INTERVALS
C2_FIXED_SLOPE = (
    "C2 = weighted geometric mean of Δ2_k·(k+1)² over the fit window, i.e. the fit "
    "Δ2_k = C2/(k+1)² with the slope fixed at the theory's 2 (digest §3 end, §6.4)"
)
K_EMPIRICAL = (
    "k*(ε) = ⌈(C/ε)^(1/α)⌉ from the fitted Δ_k ≈ C·k^(−α) (digest §8 item 5); interval: "
    "percentiles of k* over the (C, α) replicates, which include both the orderings and the "
    "drawing of the N samples (see the fit's formula)"
)
K_THM7 = "Petrov et al. 2025 Thm 7 (digest §3): k* = ⌈(2ℓ_max + M·R²)/ε⌉ − 1"
K_THM7_TIGHT = "Thm 7 tighter constant ℓ_max (digest §3 DERIVED): k* = ⌈(ℓ_max + M·R²)/ε⌉ − 1"
K_SQUARED = (
    "squared criterion (digest §3, §6.4): k* = ⌈√(C2/ε)⌉ − 1, tolerance ε applied to the "
    "mean squared difference Δ2"
)
K_SQUARED_RMS = (
    "squared criterion as RMS difference: k* = ⌈√C2/ε⌉ − 1, i.e. √Δ2 ≤ ε "
    "(digest §6.4 with tolerance ε² on Δ2)"
)

GRAD_SQ_DIRECT = "|G|² as measured (direct statistic)"
TRACE_SIGMA_DIRECT = "tr Σ as measured (direct statistic)"
GRAD_SQ_TWO_BATCH = (
    "|G|² = (B_big|G_big|² − B_small|G_small|²)/(B_big − B_small), averaged over steps "
    "(McCandlish et al. 2018 App. A; digest §7.1)"
)
TRACE_SIGMA_TWO_BATCH = (
    "tr Σ = (|G_small|² − |G_big|²)/(1/B_small − 1/B_big), averaged over steps "
    "(McCandlish et al. 2018 App. A; digest §7.1)"
)
GHG_TWO_BATCH = (
    "GᵀHG = (B_big h_big − B_small h_small)/(B_big − B_small), h = G_BᵀHG_B "
    "(digest §7.1 DERIVED, Hessian-aware analogue of App. A)"
)
TRACE_H_SIGMA_TWO_BATCH = "tr(HΣ) = (h_small − h_big)/(1/B_small − 1/B_big) (digest §7.1 DERIVED)"
B_SIMPLE = "McCandlish et al. 2018 eq. 2.8 (digest §7.1): B_simple = tr Σ/|G|²"
B_SIMPLE_TWO_BATCH = (
    "McCandlish et al. 2018 eq. 2.8 (digest §7.1) with App. A: "
    "B_simple = mean(tr Σ_t)/mean(|G|²_t) "
    "(ratio of separate averages); CI = bootstrap percentiles over steps"
)
B_NOISE = "McCandlish et al. 2018 §2.2 (digest §7.1): B_noise = tr(HΣ)/GᵀHG"
B_NOISE_TWO_BATCH = (
    "McCandlish et al. 2018 §2.2 (digest §7.1) with the two-batch estimators of GᵀHG and tr(HΣ) "
    "(digest §7.1 DERIVED); CI = bootstrap percentiles over steps"
)
DELTA_METHOD = (
    "; CI by the delta method on log(ratio) from the given standard errors, treated as "
    "independent (give log_b_*_se for the correlated case)"
)
JACKKNIFE_LOG_RATIO = (
    "; CI = ratio·exp(±t·se) with se the jackknife standard error of log(ratio) on the same "
    "per-example gradients (Efron & Tibshirani 1993 ch. 11), t on jackknife groups − 1 dof"
)
NOISE_RELIABILITY = (
    "selection bias: Gaussian wild bootstrap of the gradient groups at the measured "
    "statistics (Wu 1986); p_defined = share of re-measurements whose ratio is defined, "
    "median_ratio = median estimate/truth among them (docs/numbers.md)"
)
B_CRIT_FIT = (
    "McCandlish et al. 2018 §2.3 (digest §7.1): S = S_min(1 + B_crit/B), "
    "nonlinear least squares on "
    "log S; CIs from the HC3 heteroskedasticity-robust sandwich covariance (no constant-noise "
    "assumption) with Student-t quantiles; E_min = B_crit·S_min"
)
B_CRIT_LINEAR = (
    "McCandlish et al. 2018 §2.3 (digest §7.1) linear form 1/S = a + b/E (E = B·S): S_min = 1/a, "
    "B_crit = −b (digest §7.1); informational, no alarm (errors in variables: the noisy S is "
    "on both sides)"
)
B_20PCT = (
    "batch size with 20 % step overhead over perfect scaling from the smallest measured "
    "batch B0: S(B)·B/(S(B0)·B0) = 1.2 ⇒ B = 1.2·B0 + 0.2·B_crit (Zhang et al. 2024 "
    "definition, UNVERIFIED wording, digest §7.2; S(B) from McCandlish et al. 2018 §2.3)"
)
RECOMMENDED = "power of two nearest (in log2) to {basis}"
LR_SCALING = (
    "McCandlish et al. 2018 §2.2 (digest §7.1): ε_opt(B) = ε_max/(1 + B_noise/B), ε_max = |G|²/GᵀHG"
)
SCALING_FIT = (
    "L(D) = E + A·D^(−β) by bounded nonlinear least squares (scipy least_squares, TRF); "
    "CIs from the HC3 heteroskedasticity-robust sandwich covariance with Student-t quantiles"
)
N_FOR_TARGET = (
    "D = (A/(target − E))^(1/β) from L(D) = E + A·D^(−β); CI by sampling the fitted "
    "parameters' asymptotic normal distribution"
)
HETEROGENEITY = "max/min per-block spectral norm (digest §8 items 1, 7)"
LR_CEILING = "η_g < 2/λ_max(H_gg), GD stability ceiling per block (digest §8 item 7)"
THM7_CONSTANT = (
    "Thm 7 (digest §3): |Δ_k| ≤ (2ℓ_max + M·r²)/(k+1) at radius r; tight: ℓ_max + M·r²; "
    "tightness = fitted C / (2ℓ_max + M·r²)"
)
LOSS_VARIANCE = (
    "σ² = sample variance of the per-example losses (ddof 1); CI = σ²·exp(±z·se/σ²) with the "
    "distribution-free se = √((m₄ − σ⁴(n−3)/(n−1))/n) (Cramér 1946 §27.4; docs/numbers.md)"
)
K_LOSS_ACCURACY = (
    "loss accuracy: k = ⌈z²·σ²/ε²⌉, z = Φ⁻¹((1 + confidence)/2), so that P(|L_k − μ| ≤ ε) ≈ "
    "confidence (Cochran 1977 eq. 4.2); CI from the CI of σ² (docs/numbers.md)"
)
K_LOSS_ACCURACY_SQ = (
    "loss accuracy from the Δ_k² criterion: Δ2_k = σ²/(k(k+1)) for i.i.d. losses, so the "
    "fixed-slope constant C2 ≈ σ² and k = ⌈z²·C2/ε²⌉; CI = percentiles over the C2 replicates"
)
