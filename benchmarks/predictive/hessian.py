"""The full-Hessian λ_max of the benchmark's own: Lanczos over ALL parameters at once, with
autograd Hessian-vector products (double backward), and the gradient-descent check of what
2/λ_max means.

Independent of ``curvplan_worker.curvature`` (its operators and spectra): the Hessian here is
the one of the mean token loss of the given sample, in float64, as one operator on the
concatenated parameter vector.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from predictive.training import mean_token_loss
from torch import Tensor, nn


def hvp_operator(model: nn.Module, x: Tensor, y: Tensor):
    """v ↦ H v for H = ∇² (mean token loss of (x, y)) over every parameter (flat vectors)."""
    params = [p for p in model.parameters() if p.requires_grad]

    def apply(v: Tensor) -> Tensor:
        loss = mean_token_loss(model, x, y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        hv = torch.autograd.grad(flat @ v, params)
        return torch.cat([h.reshape(-1) for h in hv]).detach()

    size = sum(p.numel() for p in params)
    return apply, size


def lanczos_extremes(
    apply, size: int, *, iterations: int = 80, tol: float = 1e-7, seed: int = 0
) -> dict:
    """Largest and smallest eigenvalue of a symmetric operator by Lanczos with full
    reorthogonalisation (Golub & Van Loan, Matrix Computations, 4th ed., Alg. 10.1.1 with
    complete reorthogonalisation, §10.3.1). Stops when the Ritz residual |β_k s_k| of the
    largest Ritz value is below ``tol``·|θ_max|. The residual bound is returned with it."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(size, generator=gen, dtype=torch.float64)
    q /= q.norm()
    basis = [q]
    alphas: list[float] = []
    betas: list[float] = []
    theta_max = theta_min = math.nan
    residual = math.inf
    for _ in range(min(iterations, size)):
        w = apply(basis[-1])
        alpha = float(w @ basis[-1])
        alphas.append(alpha)
        q_mat = torch.stack(basis)
        for _pass in range(2):  # twice is enough (Kahan's "twice is enough")
            w = w - q_mat.T @ (q_mat @ w)
        beta = float(w.norm())
        t = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
        evals, evecs = np.linalg.eigh(t)
        theta_max, theta_min = float(evals[-1]), float(evals[0])
        residual = float(abs(beta * evecs[-1, -1]))
        if residual <= tol * abs(theta_max) or beta < 1e-14:
            break
        betas.append(beta)
        basis.append(w / beta)
    return {
        "lambda_max": theta_max,
        "lambda_min_ritz": theta_min,
        "residual": residual,
        "iterations": len(alphas),
        "converged": bool(residual <= tol * abs(theta_max)),
    }


def full_lambda_max(model: nn.Module, x: Tensor, y: Tensor, **kwargs) -> dict:
    """λ_max of the full Hessian of the mean token loss of (x, y), float64."""
    m64 = copy.deepcopy(model).double().eval()
    apply, size = hvp_operator(m64, x, y)
    out = lanczos_extremes(apply, size, **kwargs)
    out["n_parameters"] = size
    return out


@dataclass
class GdRun:
    lr: float
    losses: list[float]

    @property
    def monotone(self) -> bool:
        return all(b <= a + 1e-12 for a, b in zip(self.losses, self.losses[1:], strict=False))

    @property
    def max_rise(self) -> float:
        return max([b - a for a, b in zip(self.losses, self.losses[1:], strict=False)] + [0.0])

    def as_dict(self) -> dict:
        return {
            "lr": self.lr,
            "monotone": self.monotone,
            "max_rise": self.max_rise,
            "first_loss": self.losses[0],
            "last_loss": self.losses[-1],
            "max_loss": max(self.losses),
            "losses": [round(v, 6) for v in self.losses],
        }


def gradient_descent(model: nn.Module, x: Tensor, y: Tensor, lr: float, steps: int) -> GdRun:
    """Full-batch gradient descent on the loss of (x, y) from the model's weights (a copy,
    float64): the loss before each step and after the last. Cohen et al. 2021 ("Gradient
    descent on neural networks typically occurs at the edge of stability"): above
    η = 2/λ_max the loss stops decreasing monotonically and the sharpness adapts."""
    m64 = copy.deepcopy(model).double().train()
    params = [p for p in m64.parameters() if p.requires_grad]
    losses = []
    for _ in range(steps):
        loss = mean_token_loss(m64, x, y)
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(lr * g)
    with torch.no_grad():
        losses.append(float(mean_token_loss(m64, x, y)))
    return GdRun(lr, losses)
