"""Gauss–Newton (outer-product) and functional parts of a Hessian block.

Petrov et al. 2025, eq. "gauss_decomposition" (paper-digest §1.3):
H = Jᵀ (∂²ℓ/∂f²) J + (∂ℓ/∂f ⊗ I) ∂²f/∂w² = H_o (GGN) + H_f (functional).
The GGN product Jᵀ H_out J v uses a forward-mode jvp through the model (J v), the loss's output
Hessian by double backward on the outputs (H_out u), and a vjp (Jᵀ ·); the functional product is
H v − G v with the exact double-backward H v.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.func import functional_call, jvp

from curvplan_worker.curvature.hvp import CurvatureEngine


def ggn_product(engine: CurvatureEngine, names: Sequence[str], v: Tensor) -> Tensor:
    """G_BB v = Σ_b J_bᵀ H_out,b J_b v for the block ``names`` (flat (n_B,) vector)."""
    names = list(names)
    layout = engine.layout(names)
    parts = layout.split(v.to(engine.device, engine.dtype))
    frozen = {n: p.detach() for n, p in engine.params.items()}
    primals = tuple(frozen[n] for n in names)
    total = torch.zeros(layout.numel, dtype=engine.dtype, device=engine.device)
    for x, y in engine.batches:

        def forward(*block: Tensor, x: Tensor = x) -> Tensor:
            params = dict(frozen)
            params.update(zip(names, block, strict=True))
            return functional_call(engine.model, params, (x,))

        out, j_v = jvp(forward, primals, tuple(parts))
        out_d = out.detach().requires_grad_(True)
        losses, _ = engine.objective.output_losses(out_d, y)
        g_out = torch.autograd.grad(losses.sum() / engine.total_count, out_d, create_graph=True)[0]
        h_jv = torch.autograd.grad(g_out, out_d, grad_outputs=j_v.detach())[0]
        block = [t.clone().requires_grad_(True) for t in primals]
        out2 = forward(*block)
        grads = torch.autograd.grad(out2, block, grad_outputs=h_jv, allow_unused=True)
        total += torch.cat(
            [
                (g if g is not None else torch.zeros_like(t)).reshape(-1)
                for g, t in zip(grads, block, strict=True)
            ]
        )
    engine.n_hvp += 1
    return total


def functional_product(engine: CurvatureEngine, names: Sequence[str], v: Tensor) -> Tensor:
    """(H − G)_BB v: the functional part of the block (Petrov et al. 2025, H_f)."""
    return engine.block_hvp(names, v) - ggn_product(engine, names, v)
