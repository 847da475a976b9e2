"""Extreme eigenvalues of symmetric operators by Lanczos with full reorthogonalisation.

λ_max and λ_min are both read from one Krylov space and each is certified separately by its
explicit residual ‖Hy − θy‖ ≤ tol·max(|θ|, floor·‖H‖) (docs/numerics.md#lanczos: power iteration
returns the largest *magnitude*; stop on residuals, surface ``converged`` and the number of
products). By the Bauer–Fike theorem for symmetric matrices a residual r certifies an eigenvalue
within r of θ (Parlett, "The Symmetric Eigenvalue Problem", Thm 4.5.1 / §13.2 for Lanczos).
Lanczos vectors are kept in float64 whatever the product's precision (docs/numerics.md#precision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from curvplan_worker.curvature.cancel import check_cancel

MatVec = Callable[[Tensor], Tensor]


@dataclass
class EigenEnd:
    """One certified Ritz pair."""

    value: float
    residual: float
    converged: bool
    vector: Tensor | None = None
    scale: float = 1.0  # the certification scale max(|θ|, floor·‖H‖)


@dataclass
class Spectrum:
    """Result of :func:`lanczos_spectrum` for one symmetric operator."""

    lambda_max: float
    lambda_min: float
    converged: bool
    n_products: int
    iterations: int
    residual_max: float
    residual_min: float
    tolerance: float
    top: list[EigenEnd] = field(default_factory=list)
    scale_max: float = 1.0
    scale_min: float = 1.0
    precision_limited: bool = False

    @property
    def worst_absolute_residual(self) -> float:
        parts = [self.residual_max, self.residual_min, *(e.residual for e in self.top)]
        return max((p for p in parts if p == p), default=float("nan"))

    @property
    def worst_relative_residual(self) -> float:
        """max over the certified pairs of residual / (tol-scale), i.e. the attained tolerance."""
        parts = [self.residual_max / self.scale_max, self.residual_min / self.scale_min]
        parts += [e.residual / e.scale for e in self.top]
        return max(p for p in parts if p == p) if any(p == p for p in parts) else float("nan")

    @property
    def spectral_norm(self) -> float:
        return max(abs(self.lambda_max), abs(self.lambda_min))

    def as_dict(self) -> dict:
        out = {
            "lambda_max": self.lambda_max,
            "lambda_min": self.lambda_min,
            "spectral_norm": self.spectral_norm,
            "converged": self.converged,
            "n_products": self.n_products,
            "iterations": self.iterations,
            "residual": max(self.residual_max, self.residual_min),
            "residual_max": self.residual_max,
            "residual_min": self.residual_min,
            "tolerance": self.tolerance,
            "attained_tolerance": self.worst_relative_residual,
            "precision_limited": self.precision_limited,
        }
        if self.top:
            out["top_k"] = [
                {"value": e.value, "residual": e.residual, "converged": e.converged}
                for e in self.top
            ]
        return out


def _random_unit(n: int, generator: torch.Generator) -> Tensor:
    v = torch.randn(n, generator=generator, dtype=torch.float64)
    return v / torch.linalg.vector_norm(v)


def lanczos_spectrum(
    matvec: MatVec,
    n: int,
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    top_k: int = 0,
    ends: tuple[str, ...] = ("max", "min"),
    floor: float = 1e-3,
    want_vectors: bool = False,
) -> Spectrum:
    """Lanczos (full reorthogonalisation) for the extreme eigenvalues of a symmetric operator.

    ``matvec`` maps a float64 vector (n,) to H·v (any float dtype, any device). Stops when every
    requested Ritz pair (``ends`` and the ``top_k`` largest) passes its *explicit* residual test
    ‖Hy − θy‖ ≤ tol·max(|θ|, floor·max|θ|); the explicit checks are counted in ``n_products``.
    An invariant Krylov subspace (β ≈ 0) ends the iteration early with exact Ritz values.
    ``converged`` is False when ``max_iter`` steps (default min(n, 500)) do not certify them,
    or when the explicit residual stagnates above the tolerance while the recurrence says
    converged (``precision_limited``: the products' rounding noise, typically float32, is above
    tol·scale; ``attained_tolerance`` then says what was certified).
    """
    if n <= 0:
        raise ValueError("empty operator")
    m_max = min(n, max_iter or 500)
    basis = torch.zeros(m_max + 1, n, dtype=torch.float64)
    alphas: list[float] = []
    betas: list[float] = []
    q = _random_unit(n, generator)
    basis[0] = q
    n_products = 0
    next_check = 0
    next_periodic = 20
    noise_level = 0.0
    previous_failure: float | None = None
    stagnant = 0
    result: Spectrum | None = None
    for j in range(m_max):
        check_cancel("lanczos")
        w = matvec(basis[j]).detach()
        noise_level = 30 * torch.finfo(w.dtype).eps  # residual/‖H‖ at the rounding level
        w = w.to("cpu", torch.float64).reshape(-1)
        n_products += 1
        alpha = float(basis[j] @ w)
        w = w - alpha * basis[j]
        if j > 0:
            w = w - betas[-1] * basis[j - 1]
        for _ in range(2):  # full reorthogonalisation, twice is enough (Parlett §6.9)
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        beta = float(torch.linalg.vector_norm(w))
        alphas.append(alpha)
        theta, s = _ritz(alphas, betas)
        norm_est = max(abs(theta[0]), abs(theta[-1]), 1e-300)
        invariant = beta <= 1e-13 * norm_est * max(1.0, np.sqrt(n))
        exhausted = j + 1 == m_max
        wanted = _wanted(theta, ends, top_k)
        estimates_ok = all(
            beta * abs(s[-1, i]) <= tol * max(abs(theta[i]), floor * norm_est) for i in wanted
        )
        periodic = j >= next_periodic
        if (estimates_ok and j >= next_check) or periodic or invariant or exhausted:
            result = _certify(
                matvec, basis[: j + 1], theta, s, ends, top_k, tol, floor, want_vectors
            )
            n_products += result.n_products
            result.iterations = j + 1
            if result.converged or invariant or exhausted:
                break
            # Not certified yet. When the residual stops improving at the products' rounding
            # level (e.g. float32), more steps cannot help: re-check with growing gaps and stop
            # when two further checks do not halve it (converged stays False, honestly).
            worst = result.worst_relative_residual
            at_noise = result.worst_absolute_residual <= noise_level * norm_est
            if previous_failure is not None and worst > 0.5 * previous_failure and at_noise:
                stagnant += 1
            else:
                stagnant = 0
            previous_failure = worst if previous_failure is None else min(previous_failure, worst)
            if stagnant >= 2:
                result.precision_limited = True
                break
            next_check = j + max(3, (j + 1) // 4)
            next_periodic = j + max(10, (j + 1) // 2)
        if beta == 0.0:
            break
        betas.append(beta)
        basis[j + 1] = w / beta
    assert result is not None
    result.n_products = n_products
    return result


def _ritz(alphas: list[float], betas: list[float]) -> tuple[np.ndarray, np.ndarray]:
    from scipy.linalg import eigh_tridiagonal

    from curvplan_worker.curvature.device import pinned_blas_threads

    d = np.asarray(alphas)
    if len(d) == 1:
        return d.copy(), np.ones((1, 1))
    with pinned_blas_threads(1):
        theta, s = eigh_tridiagonal(d, np.asarray(betas[: len(d) - 1]))
    return theta, s


def _wanted(theta: np.ndarray, ends: tuple[str, ...], top_k: int) -> list[int]:
    m = len(theta)
    idx: list[int] = []
    if "max" in ends:
        idx.append(m - 1)
    if "min" in ends:
        idx.append(0)
    for i in range(min(top_k, m)):
        idx.append(m - 1 - i)
    return sorted(set(idx))


def _certify(
    matvec: MatVec,
    basis: Tensor,
    theta: np.ndarray,
    s: np.ndarray,
    ends: tuple[str, ...],
    top_k: int,
    tol: float,
    floor: float,
    want_vectors: bool,
) -> Spectrum:
    norm_est = max(abs(theta[0]), abs(theta[-1]), 1e-300)
    checked: dict[int, EigenEnd] = {}
    products = 0
    for i in _wanted(theta, ends, top_k):
        y = basis.T @ torch.from_numpy(np.ascontiguousarray(s[:, i]))
        y = y / torch.linalg.vector_norm(y)
        hy = matvec(y).detach().to("cpu", torch.float64).reshape(-1)
        products += 1
        lam = float(y @ hy)  # Rayleigh quotient of the normalised Ritz vector
        res = float(torch.linalg.vector_norm(hy - lam * y))
        scale = max(abs(lam), floor * norm_est, 1e-300)
        ok = res <= tol * scale
        checked[i] = EigenEnd(lam, res, ok, y if want_vectors else None, scale)
    m = len(theta)
    top = [checked[m - 1 - i] for i in range(min(top_k, m))]
    hi = checked.get(m - 1)
    lo = checked.get(0)
    return Spectrum(
        lambda_max=hi.value if hi else float("nan"),
        lambda_min=lo.value if lo else float("nan"),
        converged=all(e.converged for e in checked.values()),
        n_products=products,
        iterations=0,
        residual_max=hi.residual if hi else float("nan"),
        residual_min=lo.residual if lo else float("nan"),
        tolerance=tol,
        top=top,
        scale_max=hi.scale if hi else 1.0,
        scale_min=lo.scale if lo else 1.0,
    )


def block_spectrum(
    engine,
    names: list[str],
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    top_k: int = 0,
    floor: float = 1e-3,
    want_vectors: bool = False,
) -> Spectrum:
    """λ_max, λ_min (and top-k) of the diagonal Hessian block H_BB of ``names``."""
    n = engine.layout(names).numel
    return lanczos_spectrum(
        lambda v: engine.block_hvp(names, v),
        n,
        generator=generator,
        tol=tol,
        max_iter=max_iter,
        top_k=top_k,
        floor=floor,
        want_vectors=want_vectors,
    )


@dataclass
class SingularValue:
    """σ_max of an off-diagonal block, from Lanczos on H_ijᵀ H_ij."""

    sigma_max: float
    converged: bool
    n_products: int
    residual: float
    precision_limited: bool = False

    def as_dict(self) -> dict:
        return {
            "sigma_max": self.sigma_max,
            "converged": self.converged,
            "n_products": self.n_products,
            "residual": self.residual,
            "precision_limited": self.precision_limited,
        }


def off_diagonal_norm(
    engine,
    rows: list[str],
    cols: list[str],
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
) -> SingularValue:
    """σ_max(H_ij) = sqrt(λ_max(H_ijᵀ H_ij)); each operator product costs two Hessian products
    (H_ij v, then H_ji u = H_ijᵀ u), as in docs/formulas.md#curvature."""
    n = engine.layout(cols).numel

    def normal_op(v: Tensor) -> Tensor:
        u = engine.hvp(rows, cols, v)
        return engine.hvp(cols, rows, u)

    spec = lanczos_spectrum(
        normal_op, n, generator=generator, tol=tol, max_iter=max_iter, ends=("max",)
    )
    sigma = float(np.sqrt(max(spec.lambda_max, 0.0)))
    return SingularValue(
        sigma_max=sigma,
        converged=spec.converged,
        n_products=2 * spec.n_products,
        residual=spec.residual_max,
        precision_limited=spec.precision_limited,
    )
