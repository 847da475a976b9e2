"""What each rank of the data-parallel engine tests computes (imported by the spawned rank too).

``products(dp)`` builds the reference Transformer case (fp64, seeded: every process builds the
same model, sample and vectors) and returns the loss, the gradient, batched block HVPs, a
multi-block HVP, an off-diagonal product, GGN products and Lanczos eigenvalues at a fixed step
count, computed by the operator on ``dp``'s shard (``dp`` None: one process, every batch).
"""

from __future__ import annotations

from typing import Any

import torch
from _engine_cases import build_case

from curvplan_worker.curvature.distributed import DataParallel
from curvplan_worker.curvature.operator import CurvatureEngine, batches_of
from curvplan_worker.curvature.spectra import block_spectrum

CASE = "lm_post_gelu_tied"
LANCZOS_STEPS = 6


def products(dp: DataParallel | None, batch_size: int = 2) -> dict[str, Any]:
    torch.set_num_threads(1)
    case = build_case(CASE)
    batches = batches_of(case.inputs, case.targets, batch_size)
    shard = batches if dp is None else dp.start(batches)
    reducer = None if dp is None else dp.reduce
    gen = torch.Generator().manual_seed(7)
    blocks = list(case.blocks.values())
    out: dict[str, Any] = {"blocks": {}}
    with CurvatureEngine(case.model, case.objective, shard, reducer=reducer) as engine:
        out["loss"] = engine.loss_value
        out["count"] = engine.total_count
        out["gradient"] = engine.gradient()
        for name, members in list(case.blocks.items())[:4]:
            n = engine.layout(members).numel
            v = torch.randn(3, n, generator=gen, dtype=torch.float64)
            out["blocks"][name] = engine.block_hvp(members, v)
            out["blocks"][name + ":ggn"] = engine.ggn_vector(members, v[0])
            spectrum = block_spectrum(
                engine, members, generator=gen, tol=1e-300, max_iter=LANCZOS_STEPS
            )
            out["blocks"][name + ":lanczos"] = torch.tensor(
                [spectrum.lambda_max, spectrum.lambda_min], dtype=torch.float64
            )
        vs = [
            torch.randn(engine.layout(b).numel, generator=gen, dtype=torch.float64)
            for b in blocks[:3]
        ]
        out["multi"] = torch.cat(engine.multi_block_hvp(blocks[:3], vs))
        col = torch.randn(engine.layout(blocks[1]).numel, generator=gen, dtype=torch.float64)
        out["off_diagonal"] = engine.hvp(blocks[0], blocks[1], col)
    return out


def rank_main(
    rank: int,
    world_size: int,
    init_method: str,
    batch_sizes: list[int],
    default_dtype: torch.dtype = torch.float32,
) -> None:
    """Entry of a spawned rank: the same products on its shards (rank 0 checks them).

    ``default_dtype`` is the test process's: the model's initial weights are drawn in it, and
    other test modules set float64 at import, so a fresh process must follow suit to build the
    same model."""
    torch.set_default_dtype(default_dtype)
    dp = DataParallel(rank, world_size, rank, init_method=init_method, timeout_s=30)
    try:
        for size in batch_sizes:
            products(dp, size)
    finally:
        dp.close()
