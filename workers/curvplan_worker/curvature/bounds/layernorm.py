"""LayerNorm Jacobian and Hessian norms: exact values and the paper's Lemma 4 bounds.

Orientation: ``x`` is the LayerNorm *input*, (L, d), normalised row by row over its d features,
LN(x)_i = gamma * (x_i - mu_i) / s_i with s_i = sqrt(Var_i + eps) (biased variance).

Norm conventions (Petrov et al. 2025, §2 "derivative layout"): the Jacobian is the (Ld) x (Ld)
matrix d vec_r LN / d vec_r(x)^T, the Hessian is its (Ld)^2 x (Ld) matricization; every norm is
the largest singular value. Both are block-diagonal over rows, so the norms are maxima over rows.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

SigmaMin = Literal["per_row_std", "row_norm"]


def _check_input(x: Tensor, eps: float) -> None:
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D (L, d) LayerNorm input, got shape {tuple(x.shape)}")
    if eps < 0:
        raise ValueError(f"eps: must be >= 0, got {eps}")


def _gamma_scale(gamma: Tensor | None) -> float:
    return 1.0 if gamma is None else float(gamma.detach().abs().max())


def row_scales(x: Tensor, eps: float = 0.0) -> Tensor:
    """Per-row scales s_i = sqrt(Var_i + eps) (biased variance), shape (L,)."""
    _check_input(x, eps)
    return torch.sqrt(x.var(dim=-1, unbiased=False) + eps)


def _min_scale(x: Tensor, eps: float) -> float:
    s_min = float(row_scales(x, eps).min())
    if s_min <= 0.0:
        raise ValueError(
            "x: a row has zero variance and eps = 0 (Petrov et al. 2025 Assumption 2 fails); "
            "LayerNorm is not differentiable there"
        )
    return s_min


def layernorm_jacobian_norm(x: Tensor, eps: float = 0.0, gamma: Tensor | None = None) -> float:
    """Exact spectral norm of the LayerNorm Jacobian (Petrov et al. 2025, Theorem 2).

    Per row J_i = (1/s_i)(P_c - y_i y_i^T / d), y_i = (x_i - mu_i)/s_i, P_c the centring
    projector (docs/formulas.md#bounds, per-row form). Its eigenvalues are 1/s_i on the (d-2)-dim
    complement of {1, y_i} and (1/s_i)(1 - |y_i|^2/d) = eps/s_i^3 along y_i; so the norm is
    1/min_i s_i for d >= 3 (the closed form's value) and smaller for d <= 2. With an affine gamma
    the result is multiplied by max|gamma| (then an upper bound).
    """
    _check_input(x, eps)
    _min_scale(x, eps)
    d = x.shape[-1]
    s = row_scales(x, eps)
    var = x.var(dim=-1, unbiased=False)
    if d >= 3:
        per_row = 1.0 / s
    elif d == 2:
        # span(1)^perp is 1-dim: along y_i (or any direction if the row is constant).
        per_row = torch.where(var > 0, (eps / s**2) / s, 1.0 / s)
    else:
        per_row = torch.zeros_like(s)
    return float(per_row.max()) * _gamma_scale(gamma)


def layernorm_hessian_norm(x: Tensor, eps: float = 0.0, gamma: Tensor | None = None) -> float:
    """Exact spectral norm of the LayerNorm Hessian matricization (Petrov et al. 2025, Thm 3).

    Closed per-row form (docs/formulas.md#bounds): d^2 y_a/dx_b dx_c =
    [-(P_ab y_c + P_ac y_b + P_bc y_a) + (3/d) y_a y_b y_c] / (d s^2). Contracting with a unit
    w = alpha*u + beta*e (u = y/|y|, e orthogonal to u and 1) gives the squared Frobenius norm
    t [alpha^2 (9 (1 - t/d)^2 + d - 2) + 2 beta^2] / (d s^2)^2 with t = |y|^2 = d Var/s^2 (derived
    here), so per row ||H_i|| = sqrt(t max(9 (1 - t/d)^2 + d - 2, 2)) / (d s_i^2) for d >= 3
    (and sqrt(9 t) |1 - t/d| / (d s^2) for d = 2). With eps = 0 (t = d) this is the closed form's
    sqrt(max(d-2, 2)/d) / min_i s_i^2. Affine gamma multiplies by max|gamma| (upper bound).
    """
    _check_input(x, eps)
    _min_scale(x, eps)
    d = x.shape[-1]
    var = x.var(dim=-1, unbiased=False)
    s2 = var + eps
    t = d * var / s2
    if d >= 3:
        inner = torch.clamp(9.0 * (1.0 - t / d) ** 2 + d - 2, min=2.0)
        per_row = torch.sqrt(t * inner) / (d * s2)
    elif d == 2:
        per_row = torch.sqrt(9.0 * t) * (1.0 - t / d).abs() / (d * s2)
    else:
        per_row = torch.zeros_like(s2)
    return float(per_row.max()) * _gamma_scale(gamma)


def layernorm_hessian_norm_closed_form(
    x: Tensor, eps: float = 0.0, gamma: Tensor | None = None
) -> float:
    """The closed-form LayerNorm Hessian norm bound sqrt(max(d-2, 2)/d) / min_i s_i^2
    (docs/formulas.md#bounds).

    Equal to :func:`layernorm_hessian_norm` for eps = 0 and d >= 3. For eps > 0 it is an upper
    bound for every d except d = 4, where it can be up to ~3 % too small (at eps ~ 1.1 Var;
    found with the exact closed form, contrary to what the closed form suggests): the bounds use
    :func:`layernorm_hessian_norm`, this value is reported for reference only.
    """
    _check_input(x, eps)
    d = x.shape[-1]
    return math.sqrt(max(d - 2, 2) / d) / _min_scale(x, eps) ** 2 * _gamma_scale(gamma)


def lemma4_sigma_min(x: Tensor, eps: float = 0.0, sigma_min: SigmaMin = "per_row_std") -> float:
    """sigma_min of Petrov et al. 2025 Lemma 4.

    ``per_row_std``: min_i sqrt(Var_i + eps) — what the proof uses (||P|| = 1/sigma_min); the
    corrected reading. ``row_norm``: min_i ||M_i||_2, the norm of the centred row — the lemma's
    literal definition, which makes the bound false (docs/formulas.md#bounds).
    """
    _check_input(x, eps)
    if sigma_min == "per_row_std":
        return _min_scale(x, eps)
    if sigma_min == "row_norm":
        centred = x - x.mean(dim=-1, keepdim=True)
        value = float(centred.norm(dim=-1).min())
        if value <= 0.0:
            raise ValueError("x: a row has zero variance; Lemma 4 is undefined")
        return value
    raise ValueError(f"sigma_min: expected 'per_row_std' or 'row_norm', got {sigma_min!r}")


def lemma4_bounds(
    x: Tensor, eps: float = 0.0, sigma_min: SigmaMin = "per_row_std"
) -> tuple[float, float]:
    """Petrov et al. 2025, Lemma 4: bounds on ||J_LN|| and ||H_LN|| for x in R^{m x n}.

    ||J|| <= 1/s + ||x||^2/(sqrt(n) s^3);
    ||H|| <= ||x||/s^3 (1 + sqrt(m/n)) + ||x||^2/(sqrt(n) s^3) + 3 ||x||^3/(n s^5),
    with s = sigma_min chosen by ``sigma_min`` (see :func:`lemma4_sigma_min`).
    """
    m, n = x.shape
    s = lemma4_sigma_min(x, eps, sigma_min)
    xn = float(torch.linalg.matrix_norm(x, ord=2))
    jac = 1.0 / s + xn**2 / (math.sqrt(n) * s**3)
    hess = (
        xn / s**3 * (1.0 + math.sqrt(m / n))
        + xn**2 / (math.sqrt(n) * s**3)
        + 3.0 * xn**3 / (n * s**5)
    )
    return jac, hess


def layernorm_norms(
    x: Tensor,
    eps: float = 0.0,
    gamma: Tensor | None = None,
    method: Literal["exact", "lemma4"] = "exact",
    sigma_min: SigmaMin = "per_row_std",
) -> tuple[float, float]:
    """(||J_LN||, ||H_LN||): exact (Theorems 2-3, per-row closed forms) or Lemma 4 bounds.

    Lemma 4 has no gamma; with an affine gamma both are multiplied by max|gamma|.
    """
    if method == "exact":
        return (
            layernorm_jacobian_norm(x, eps, gamma),
            layernorm_hessian_norm(x, eps, gamma),
        )
    if method == "lemma4":
        jac, hess = lemma4_bounds(x, eps, sigma_min)
        scale = _gamma_scale(gamma)
        return jac * scale, hess * scale
    raise ValueError(f"ln_norms: expected 'exact' or 'lemma4', got {method!r}")
