"""The data-parallel operator on 2 CPU processes (gloo, fp64) against the single-process one.

Rank 0 runs in the test process, rank 1 in a spawned process; both build the same seeded
reference Transformer, sample and vectors (``_dp_ranks.products``). The oracle is the same
operator in one process over every micro-batch: the loss, the gradient, batched block HVPs,
Gauss–Newton products, a multi-block and an off-diagonal product must agree to 1e-12 relative
(only the summation order differs), and Lanczos at a fixed step count to 1e-10.
"""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch
from _dp_ranks import products, rank_main

from curvplan_worker.curvature.distributed import DataParallel, shard_batches

pytestmark = pytest.mark.slow  # spawns a second rank process that imports torch

#: 4 micro-batches (2, 2, 2, 1 examples) → 2 per rank; 1 micro-batch → re-split by example.
BATCH_SIZES = [2, 7]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def runs() -> list[tuple[dict, dict]]:
    init = f"tcp://127.0.0.1:{_free_port()}"
    ctx = multiprocessing.get_context("spawn")
    peer = ctx.Process(target=rank_main, args=(1, 2, init, BATCH_SIZES, torch.get_default_dtype()))
    peer.start()
    threads = torch.get_num_threads()
    dp = DataParallel(0, 2, 0, init_method=init, timeout_s=30)
    try:
        distributed = [products(dp, size) for size in BATCH_SIZES]
    finally:
        dp.close()
        peer.join(60)
        if peer.is_alive():
            peer.kill()
    torch.set_num_threads(threads)
    assert peer.exitcode == 0
    return [(products(None, size), d) for size, d in zip(BATCH_SIZES, distributed, strict=True)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("index", range(len(BATCH_SIZES)), ids=[f"batch{b}" for b in BATCH_SIZES])
def test_loss_gradient_and_products_equal_the_single_process_ones(runs, index):
    single, dp = runs[index]
    assert dp["count"] == single["count"]
    assert dp["loss"] == pytest.approx(single["loss"], rel=1e-13)
    assert _rel(dp["gradient"], single["gradient"]) <= 1e-12
    for key in ("multi", "off_diagonal"):
        assert _rel(dp[key], single[key]) <= 1e-12, key
    assert len(single["blocks"]) == 12
    for key, value in single["blocks"].items():
        if key.endswith(":lanczos"):
            assert torch.allclose(dp["blocks"][key], value, rtol=1e-10, atol=0), key
        else:
            assert value.norm() > 0, key
            assert _rel(dp["blocks"][key], value) <= 1e-12, key


def test_shards_are_contiguous_and_cover_the_sample_in_order():
    x = torch.arange(10).reshape(10, 1)
    batches = [(x[i : i + 3], x[i : i + 3]) for i in range(0, 10, 3)]  # 4 batches
    for world in (1, 2, 3, 4):
        shards = [shard_batches(batches, r, world) for r in range(world)]
        assert [id(b) for s in shards for b in s] == [id(b) for b in batches]
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    resplit = [shard_batches(batches[:1], r, 3)[0][0] for r in range(3)]
    assert torch.equal(torch.cat(resplit), x[:3]) and all(len(p) == 1 for p in resplit)
    with pytest.raises(ValueError, match=r"resources\.devices"):
        shard_batches(batches[:1], 0, 4)
