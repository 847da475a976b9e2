"""The closed-form laws the planner fits and bounds, evaluated at a point (pure math, no numpy).

One place for each formula: the planner's sample-size code and the report's figures both
evaluate them here, so a constant changed here changes both (docs/planner.md).
"""

from __future__ import annotations


def power_law(k: float, C: float, alpha: float) -> float:
    """Δ_k ≈ C·k^(−α), the fitted loss-difference curve (Petrov et al. 2025, §3.3)."""
    decay: float = k ** (-alpha)
    return C * decay


def theorem7_constant(
    loss_bound: float, hessian_bound: float, radius: float, *, tight: bool = False
) -> float:
    """The numerator of Petrov et al. 2025, Theorem 7: 2ℓ_max + M·R².

    ``tight``: ℓ_max + M·R², the tighter constant that holds for non-negative losses.
    """
    return (1.0 if tight else 2.0) * loss_bound + hessian_bound * radius**2


def theorem7_bound(k: float, constant: float) -> float:
    """Petrov et al. 2025, Theorem 7: |L_{k+1}(w) − L_k(w)| ≤ constant/(k+1)."""
    return constant / (k + 1.0)


def steps_to_target(batch_size: float, s_min: float, b_crit: float) -> float:
    """S(B) = S_min·(1 + B_crit/B) (McCandlish et al. 2018, eq. 2.11)."""
    return s_min * (1.0 + b_crit / batch_size)


def loss_vs_data(n_samples: float, E: float, A: float, beta: float) -> float:
    """L(D) = E + A·D^(−β) (Hoffmann et al. 2022, eq. 2 with the data term only)."""
    decay: float = n_samples ** (-beta)
    return E + A * decay
