"""Theoretical Hessian bounds of Petrov et al. 2025, "Closing the Curvature Gap".

Public API:
- :func:`block_bounds_for_model` — the engine's entry point (per block name, per sample);
  :func:`pair_bound` looks up an off-diagonal pair in either order; :func:`tightness`.
- :func:`theorem1_bounds` (single self-attention layer), :func:`theorem6_bounds` (one block).
- LayerNorm: :func:`layernorm_jacobian_norm`, :func:`layernorm_hessian_norm`,
  :func:`lemma4_bounds`.
- :class:`BoundOptions` (``mode``, ``c_A``, ``A_norm``, ``ln_norms``, ``sigma_min``).
"""

from curvplan_worker.curvature.bounds.attention import theorem1_bounds
from curvplan_worker.curvature.bounds.block import theorem6_bounds
from curvplan_worker.curvature.bounds.layernorm import (
    layernorm_hessian_norm,
    layernorm_hessian_norm_closed_form,
    layernorm_jacobian_norm,
    lemma4_bounds,
)
from curvplan_worker.curvature.bounds.model_bounds import (
    BoundsInputError,
    block_bounds_for_model,
    pair_bound,
    tightness,
)
from curvplan_worker.curvature.bounds.options import BoundOptions, BoundsOptionError

__all__ = [
    "BoundOptions",
    "BoundsInputError",
    "BoundsOptionError",
    "block_bounds_for_model",
    "layernorm_hessian_norm",
    "layernorm_hessian_norm_closed_form",
    "layernorm_jacobian_norm",
    "lemma4_bounds",
    "pair_bound",
    "theorem1_bounds",
    "theorem6_bounds",
    "tightness",
]
