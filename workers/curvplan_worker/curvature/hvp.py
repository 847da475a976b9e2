"""Finite-difference oracle and the start-up self-test of the curvature operator.

The products themselves live in :mod:`curvplan_worker.curvature.operator` (one operator for
every stage and every model source); ``CurvatureEngine`` and ``Layout`` are re-exported here
for the callers that import them from this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from curvplan_worker.curvature.operator import CurvatureEngine, Layout

__all__ = ["CurvatureEngine", "Layout", "SelfTestError", "finite_difference_hvp", "self_test"]


def finite_difference_hvp(
    engine: CurvatureEngine,
    rows: Sequence[str],
    cols: Sequence[str],
    v: Tensor,
    eps: float = 1e-3,
) -> Tensor:
    """Central difference D(h) = (∇_rows L(w + hv) − ∇_rows L(w − hv)) / 2h, Richardson-
    extrapolated (4 D(h/2) − D(h)) / 3 to O(h⁴) error, on a private copy of the weights
    (docs/numerics.md#no-live-perturbation: never perturb live weights). An independent oracle
    for tests and the start-up self-test; members may be slices (``name[:, a:b]``)."""
    col_layout, row_layout = engine.layout(cols), engine.layout(rows)
    v = v.to(engine.device, engine.dtype)
    scale = float(torch.linalg.vector_norm(v))
    if scale == 0.0:
        return torch.zeros(row_layout.numel, dtype=engine.dtype, device=engine.device)
    v = v / scale  # the step is eps in parameter space whatever ‖v‖ is
    direction = col_layout.expand(v)
    row_bases = row_layout.bases

    def grad_at(step: float) -> Tensor:
        shifted = {n: p.detach().clone() for n, p in engine.params.items()}
        for n, d in direction.items():
            shifted[n] = shifted[n] + step * d
        for n in row_bases:
            shifted[n].requires_grad_(True)
        tensors = [shifted[n] for n in row_bases]
        total = torch.zeros(row_layout.numel, dtype=engine.dtype, device=engine.device)
        for b in range(len(engine.batches)):
            grads = torch.autograd.grad(engine.batch_loss(b, shifted), tensors, allow_unused=True)
            total += row_layout.gather(dict(zip(row_bases, grads, strict=True)))
        return total

    def central(h: float) -> Tensor:
        return (grad_at(h) - grad_at(-h)) / (2 * h)

    return scale * (4 * central(eps / 2) - central(eps)) / 3


class SelfTestError(RuntimeError):
    """The start-up HVP self-test disagreed with finite differences (docs/numerics.md#self-test)."""


def self_test(device: torch.device | str = "cpu", tol: float = 1e-7) -> float:
    """Start-up check: on a tiny fp64 Transformer (LayerNorm, attention, GELU) on ``device``,
    double-backward block products must match Richardson-extrapolated central differences.
    Returns the worst relative error; raises :class:`SelfTestError` above ``tol``."""
    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.curvature.objective import objective_for

    spec = {
        "d_model": 4,
        "n_heads": 2,
        "d_ff": 6,
        "n_layers": 1,
        "task": {"type": "causal_lm", "vocab_size": 5, "seq_len": 4},
    }
    gen = torch.Generator().manual_seed(0)
    model = build_model(spec, seed=0, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    model = model.to(device)
    x = torch.randint(0, 5, (3, 4), generator=gen).to(device)
    worst = 0.0
    with CurvatureEngine(model, objective_for(spec), [(x[:, :-1], x[:, 1:])]) as eng:
        for names in (["layers.0.ln1.weight", "layers.0.ln1.bias"], ["layers.0.attn.q.weight"]):
            v = torch.randn(eng.layout(names).numel, generator=gen, dtype=torch.float64)
            exact = eng.block_hvp(names, v)
            approx = finite_difference_hvp(eng, names, names, v)
            err = float((exact - approx).norm() / max(float(approx.norm()), 1e-300))
            worst = max(worst, err)
    if not worst <= tol:
        raise SelfTestError(f"HVP self-test failed: relative error {worst:.3e} > {tol:.1e}")
    return worst
