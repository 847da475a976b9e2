"""Gauss–Newton (outer-product) and functional parts of a Hessian block.

Petrov et al. 2025, eq. "gauss_decomposition" (docs/formulas.md#bounds):
H = Jᵀ (∂²ℓ/∂f²) J + (∂ℓ/∂f ⊗ I) ∂²f/∂w² = H_o (GGN) + H_f (functional).
The products are the curvature operator's (:meth:`CurvatureEngine.ggn_vector`: a forward-mode
jvp through the model for J v, the loss's output Hessian by double backward on the outputs, a
vjp for Jᵀ ·; the functional part is H v − G v with the exact double-backward H v).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from curvplan_worker.curvature.operator import CurvatureEngine


def ggn_product(engine: CurvatureEngine, names: Sequence[str], v: Tensor) -> Tensor:
    """G_BB v = Σ_b J_bᵀ H_out,b J_b v for the block ``names`` (Petrov et al. 2025, H_o)."""
    return engine.ggn_vector(names, v)


def functional_product(engine: CurvatureEngine, names: Sequence[str], v: Tensor) -> Tensor:
    """(H − G)_BB v: the functional part of the block (Petrov et al. 2025, H_f)."""
    return engine.functional_vector(names, v)
