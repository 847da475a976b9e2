"""Hutch++ trace estimates of Hessian blocks with a standard error.

Meyer, Musco, Musco & Woodruff 2021, "Hutch++: Optimal Stochastic Trace Estimation",
Algorithm 1: with m products, S, G ∈ {±1}^{n×m/3}, Q = orth(H S),
tr(H) ≈ tr(Qᵀ H Q) + (3/m) tr(Gᵀ (I − QQᵀ) H (I − QQᵀ) G).
The standard error is that of the Hutchinson part (sample std of gᵢᵀ P H P gᵢ over √(m/3));
the low-rank part is exact given Q. With only m/3 (≈ 10) Hutchinson samples the interval uses
Student-t quantiles on m/3 − 1 degrees of freedom (``dof``, ``ci``), not normal ones. Blocks
with n ≤ m are traced exactly from n products.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from curvplan_worker.curvature.cancel import check_cancel

CONFIDENCE = 0.95


@dataclass
class TraceEstimate:
    value: float
    stderr: float
    n_products: int
    exact: bool
    dof: int | None = None

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """value ± t_{dof}·stderr (Student-t: the SE comes from few Hutchinson samples)."""
        if self.exact:
            return self.value, self.value
        if self.dof is None or self.dof < 1 or not math.isfinite(self.stderr):
            return -math.inf, math.inf
        from scipy import stats

        half = float(stats.t.ppf((1 + confidence) / 2, self.dof)) * self.stderr
        return self.value - half, self.value + half

    def as_dict(self) -> dict:
        lo, hi = self.interval()
        return {
            "value": self.value,
            "stderr": self.stderr,
            "dof": self.dof,
            "ci": [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None,
            "confidence": CONFIDENCE,
            "n_products": self.n_products,
            "exact": self.exact,
            "method": "exact" if self.exact else "hutch++",
        }


def _rademacher(n: int, k: int, generator: torch.Generator) -> Tensor:
    return torch.randint(0, 2, (n, k), generator=generator, dtype=torch.int64).double() * 2 - 1


def hutchpp_trace(
    matvec: Callable[[Tensor], Tensor],
    n: int,
    *,
    n_products: int = 30,
    generator: torch.Generator,
) -> TraceEstimate:
    """Hutch++ (Meyer et al. 2021, Alg. 1) with ``n_products`` operator products (rounded to a
    multiple of 3, at least 6); the exact trace when n ≤ n_products."""

    def apply(v: Tensor) -> Tensor:
        check_cancel("trace")
        return matvec(v).detach().to("cpu", torch.float64).reshape(-1)

    if n <= n_products:
        eye = torch.eye(n, dtype=torch.float64)
        value = sum(float(apply(eye[i])[i]) for i in range(n))
        return TraceEstimate(value, 0.0, n, True)
    third = max(2, n_products // 3)
    s = _rademacher(n, third, generator)
    g = _rademacher(n, third, generator)
    hs = torch.stack([apply(s[:, i]) for i in range(third)], dim=1)
    q, _ = torch.linalg.qr(hs)
    hq = torch.stack([apply(q[:, i]) for i in range(q.shape[1])], dim=1)
    low_rank = float(torch.trace(q.T @ hq))
    g_perp = g - q @ (q.T @ g)
    samples = []
    for i in range(third):
        hg = apply(g_perp[:, i])
        samples.append(float(g_perp[:, i] @ (hg - q @ (q.T @ hg))))
    t = torch.tensor(samples, dtype=torch.float64)
    value = low_rank + float(t.mean())
    stderr = float(t.std(unbiased=True)) / math.sqrt(third) if third > 1 else float("inf")
    return TraceEstimate(value, stderr, 3 * third, False, third - 1)
