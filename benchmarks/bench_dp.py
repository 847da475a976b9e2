"""Data-parallel curvature products: ms per HVP on 1 process and on 2 gloo ranks, side by side.

The reference GPT of the curvature benchmark (``bench_curvature.reference_problem``: 2 pre-LN
layers, d_model 64, ~115k parameters, briefly trained), an evaluation sample of ``--examples``
sequences of 32 tokens in micro-batches of ``--micro-batch``: large enough that the two
backward passes dominate the all-reduce of one parameter-sized vector. Every process runs on
ONE intra-op thread. Measured: the median wall time of one full-model Hessian-vector product
(cached first-backward graph, docs/numerics.md#graph-cache) and of one gradient; on 2 ranks the
time of rank 0 including the all-reduce (every rank starts each product together, after a
barrier), the CPU time of rank 0 per product (its share of the work, which the wall time on a
loaded machine hides) and one all-reduce of a parameter-sized vector alone (the
communication). The
products of the two runs are compared too (relative difference of H v, fp32).

The speed-up is bounded by 2 and by the cores actually free: on a loaded machine the two ranks
compete with everything else. A timing is never an assertion here.

    python benchmarks/bench_dp.py [--examples 64] [--micro-batch 8] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_curvature import reference_problem

from curvplan_worker.curvature.distributed import DataParallel
from curvplan_worker.curvature.example import markov_chain, sample_sequences
from curvplan_worker.curvature.operator import CurvatureEngine, batches_of


def _problem(examples: int):
    model, objective, _, _ = reference_problem(train_steps=20)
    gen = torch.Generator().manual_seed(1)
    trans, pi = markov_chain(100, gen)
    seq = sample_sequences(trans, pi, examples, 32, gen)
    return model, objective, seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def _run(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    torch.set_num_threads(1)
    model, objective, x, y = _problem(args.examples)
    batches = batches_of(x, y, args.micro_batch)
    dp = None
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dp = DataParallel(rank, world, rank, timeout_s=300)
    shard = batches if dp is None else dp.start(batches)
    reducer = None if dp is None else dp.reduce

    def barrier() -> None:
        if dp is not None:
            dist.barrier()

    try:
        with CurvatureEngine(model, objective, shard, reducer=reducer) as engine:
            names = engine.names
            n = engine.layout(names).numel
            v = torch.randn(n, generator=torch.Generator().manual_seed(2))
            figures = {}
            for label, product in (
                ("hvp", lambda: engine.hvp(names, names, v)),
                ("gradient", engine.gradient),
            ):
                hv = product()  # warm-up (builds and caches the first-backward graphs)
                times = []
                for _ in range(args.repeats):
                    barrier()
                    start = time.perf_counter()
                    hv = product()
                    times.append(time.perf_counter() - start)
                figures[f"{label}_ms"] = 1e3 * statistics.median(times)
                figures[label] = hv
            # CPU time of this process per product (rank 0's share of the work; on a loaded
            # machine the wall time also counts waiting for a core)
            cpu = []
            for _ in range(args.repeats):
                barrier()
                start = time.process_time()
                engine.hvp(names, names, v)
                cpu.append(time.process_time() - start)
            figures["hvp_cpu_ms"] = 1e3 * statistics.median(cpu)
            if dp is not None:  # the communication alone: one all-reduce of n floats
                buffer = torch.zeros(n)
                times = []
                for _ in range(args.repeats):
                    barrier()
                    start = time.perf_counter()
                    dp.reduce(buffer)
                    times.append(time.perf_counter() - start)
                figures["allreduce_ms"] = 1e3 * statistics.median(times)
            figures["n_params"] = n
            figures["n_batches"] = len(shard)
        if rank == 0:
            out.update(figures)
    finally:
        if dp is not None:
            dp.close()


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    out: dict = {}
    _run(rank, world, port, args, out)
    if rank == 0:
        queue.put({k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in out.items()})


def _measure(world: int, args: argparse.Namespace) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_spawned, args=(r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=1800)
    for p in procs:
        p.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    one = _measure(1, args)
    two = _measure(2, args)
    hv1, hv2 = torch.tensor(one["hvp"]), torch.tensor(two["hvp"])
    diff = float((hv1 - hv2).norm() / hv1.norm())
    print(
        f"reference GPT: {one['n_params']} parameters, {args.examples} x 32 tokens, "
        f"micro-batch {args.micro_batch}, fp32, 1 thread per process, cores {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'':<22}{'1 process':>12}{'2 gloo ranks':>14}{'speed-up':>10}")
    for key, label in (("hvp_ms", "ms per full HVP"), ("gradient_ms", "ms per gradient")):
        print(f"{label:<22}{one[key]:>12.1f}{two[key]:>14.1f}{one[key] / two[key]:>9.2f}x")
    print(
        f"{'CPU ms per HVP, rank 0':<22}{one['hvp_cpu_ms']:>12.1f}{two['hvp_cpu_ms']:>14.1f}"
        f"{one['hvp_cpu_ms'] / two['hvp_cpu_ms']:>9.2f}x"
    )
    print(f"{'ms per all-reduce':<22}{'-':>12}{two['allreduce_ms']:>14.2f}")
    print(f"{'micro-batches per rank':<22}{one['n_batches']:>12}{two['n_batches']:>14}")
    print(f"relative difference of H v, 2 ranks vs 1: {diff:.1e}")


if __name__ == "__main__":
    main()
