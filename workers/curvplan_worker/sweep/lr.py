"""Learning rate per batch size (torch-free: the sweep parent plans points with it)."""

from __future__ import annotations

import math

from curvplan.types.sweep import OptimizerSpec


def lr_for_batch(optimizer: OptimizerSpec, batch_size: int, multiplier: float = 1.0) -> float:
    """Peak learning rate at ``batch_size`` under the sweep's rule.

    sqrt: lr·√(B/B₀) (the square-root rule for adaptive optimizers, Malladi et al. 2022);
    linear: lr·B/B₀ (Goyal et al. 2017); constant: lr; grid: the sqrt rule × ``multiplier``.
    """
    ratio = batch_size / optimizer.base_batch_size
    if optimizer.lr_rule == "linear":
        base = optimizer.lr * ratio
    elif optimizer.lr_rule == "constant":
        base = optimizer.lr
    else:
        base = optimizer.lr * math.sqrt(ratio)
    return base * multiplier
