"""Exact dense Hessian (and its blocks) for small models, column by column from double backward.

H[:, j] = ∂∇L/∂w_j = grad(∇L, w, e_j); columns are computed ``chunk`` at a time. Intended for
models up to a few thousand parameters (the paper's MNIST model has 3,552; docs/formulas.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from curvplan_worker.curvature.cancel import check_cancel
from curvplan_worker.curvature.hvp import CurvatureEngine

DEFAULT_DENSE_LIMIT = 5000


def dense_hessian(
    engine: CurvatureEngine,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    *,
    chunk: int = 1,
) -> Tensor:
    """H[rows, cols] as a dense (n_rows, n_cols) matrix in the engine's dtype.

    Column j is H[rows, cols] e_j from :meth:`CurvatureEngine.hvp`; ``chunk`` > 1 uses batched
    second backwards (faster on GPUs, not on small CPUs).
    """
    rows = list(rows or engine.names)
    cols = list(cols or engine.names)
    n_rows = engine.layout(rows).numel
    n_cols = engine.layout(cols).numel
    out = torch.zeros(n_rows, n_cols, dtype=engine.dtype, device=engine.device)
    eye = torch.eye(n_cols, dtype=engine.dtype, device=engine.device)
    for start in range(0, n_cols, chunk):
        check_cancel("dense Hessian")
        stop = min(start + chunk, n_cols)
        block = eye[start:stop]
        if stop - start == 1:
            out[:, start] = engine.hvp(rows, cols, block[0])
        else:
            out[:, start:stop] = engine.hvp(rows, cols, block).T
    return out


def split_blocks(
    hessian: Tensor, names: Sequence[str], blocks: Mapping[str, Sequence[str]], engine
) -> dict[tuple[str, str], Tensor]:
    """Every (row block, column block) sub-matrix of a dense Hessian over ``names``."""
    offsets = engine.layout(names).offsets()
    spans = {}
    for block, members in blocks.items():
        idx = torch.cat([torch.arange(*offsets[m]) for m in members])
        spans[block] = idx.to(hessian.device)
    return {
        (a, b): hessian.index_select(0, ia).index_select(1, ib)
        for a, ia in spans.items()
        for b, ib in spans.items()
    }


def dense_summary(
    engine: CurvatureEngine, blocks: Mapping[str, Sequence[str]], *, chunk: int = 1
) -> dict:
    """Exact eigenvalues of the whole Hessian and of each diagonal block, σ_max of every
    off-diagonal block, and the asymmetry ‖H − Hᵀ‖_max / ‖H‖_max of the computed matrix."""
    names = [n for members in blocks.values() for n in members]
    h = dense_hessian(engine, names, names, chunk=chunk).to("cpu", torch.float64)
    asym = float((h - h.T).abs().max() / max(float(h.abs().max()), 1e-300))
    sym = 0.5 * (h + h.T)
    eig = np.linalg.eigvalsh(sym.numpy())
    parts = split_blocks(sym, names, blocks, engine)
    block_rows = []
    block_names = list(blocks)
    norm_matrix = np.zeros((len(block_names), len(block_names)))
    for i, a in enumerate(block_names):
        ev = np.linalg.eigvalsh(parts[(a, a)].numpy())
        block_rows.append(
            {
                "name": a,
                "lambda_max": float(ev[-1]),
                "lambda_min": float(ev[0]),
                "spectral_norm": float(max(abs(ev[0]), abs(ev[-1]))),
                "trace": float(ev.sum()),
            }
        )
        for j, b in enumerate(block_names):
            norm_matrix[i, j] = float(np.linalg.norm(parts[(a, b)].numpy(), 2))
    return {
        "n_parameters": int(h.shape[0]),
        "lambda_max": float(eig[-1]),
        "lambda_min": float(eig[0]),
        "spectral_norm": float(max(abs(eig[0]), abs(eig[-1]))),
        "trace": float(eig.sum()),
        "asymmetry": asym,
        "blocks": block_rows,
        "block_names": block_names,
        "block_norm_matrix": norm_matrix.tolist(),
    }
