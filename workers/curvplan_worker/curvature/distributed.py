"""Data-parallel curvature products with ``torch.distributed`` (docs/numerics.md#data-parallel).

One analysis runs on ``world_size`` ranks of one process group (gloo on the CPU, NCCL on CUDA
with rank r on ``cuda:LOCAL_RANK``). The evaluation micro-batches are split into contiguous,
deterministic shards (:func:`shard_batches`); the operator (``CurvatureEngine(reducer=…)``)
sums each rank's partial loss sums, counts, gradients and products with one all-reduce, so every
rank holds the global L = Σ s_i / Σ c_i and the same H v. Lanczos, Hutch++ and the off-diagonal
power iterations then run identically on every rank: the same seeded generator draws the same
start vectors, and an all-reduce hands every rank the same bits (a ring all-reduce reduces each
element once and broadcasts it; with two ranks a + b = b + a exactly), so every rank takes the
same branch at every convergence test and issues the same collectives in the same order.

What the ranks do (``analyze``): all of them load the model and the sample and run the operator
stages (gradient, block spectra, traces, GGN parts, off-diagonal norms, dense Hessian, top
eigenspace); the per-sample statistics, gradient noise and bounds run on rank 0 alone, which
alone reports progress and returns the result. The job layer (``curvplan_worker.analyze.ranks``)
starts the ranks, the way ``torchrun`` does, and ends them all when one dies.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import Tensor

log = logging.getLogger("curvplan.engine.distributed")

Batch = tuple[Tensor, Tensor]


class RankLost(RuntimeError):
    """A collective failed: another rank of the group died or stopped answering."""


def shard_batches(batches: Sequence[Batch], rank: int, world_size: int) -> list[Batch]:
    """Rank ``rank``'s contiguous share of the micro-batches (deterministic, in order).

    Rank r gets batches [⌊r·n/W⌋, ⌊(r+1)·n/W⌋), so shards differ by at most one batch and their
    concatenation in rank order is the single-process order. With fewer micro-batches than ranks
    the examples are re-split into W contiguous micro-batches of near-equal size instead (the
    loss normalisation is by the total count, so L is unchanged); fewer examples than ranks is a
    ``ValueError`` naming ``resources.devices``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of {world_size}")
    n = len(batches)
    if n >= world_size:
        return list(batches[rank * n // world_size : (rank + 1) * n // world_size])
    inputs = torch.cat([x for x, _ in batches])
    targets = torch.cat([y for _, y in batches])
    if inputs.shape[0] < world_size:
        raise ValueError(
            f"resources.devices: the evaluation sample has {inputs.shape[0]} examples, fewer "
            f"than the {world_size} devices asked for (each device needs at least one)"
        )
    parts = zip(
        torch.tensor_split(inputs, world_size), torch.tensor_split(targets, world_size), strict=True
    )
    return [list(parts)[rank]]


def rank_device(base: torch.device, local_rank: int) -> torch.device:
    """The device of a rank: ``cuda:LOCAL_RANK`` on a CUDA machine, else the CPU."""
    if base.type == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU tensors."""
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass
class DataParallel:
    """One rank's side of an analysis's process group, as ``analyze`` uses it.

    ``init_method`` is the rendezvous (``tcp://127.0.0.1:PORT``; the ranks started by the job
    layer read ``env://``: MASTER_ADDR/MASTER_PORT, like ``torchrun``). ``timeout_s`` bounds
    every collective (the job layer keeps it below the worker's lease). ``before_join`` runs
    on this rank before the rendezvous (rank 0 starts the other ranks there, after the inputs
    were validated); ``on_lost`` is called when a collective fails (default: raise
    :class:`RankLost`).
    """

    rank: int
    world_size: int
    local_rank: int = 0
    init_method: str = "env://"
    timeout_s: float = 60.0
    before_join: Callable[[], None] | None = None
    on_lost: Callable[[str], NoReturn] | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _joined: bool = False

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return backend_for(self.device)

    def place(self, base: torch.device) -> torch.device:
        """This rank's device for the machine's ``base`` device (remembered for the group)."""
        self.device = rank_device(base, self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return self.device

    def start(self, batches: Sequence[Batch]) -> list[Batch]:
        """Join the process group (once) and return this rank's shard of ``batches``."""
        shard = shard_batches(batches, self.rank, self.world_size)
        if self._joined:
            return shard
        if self.before_join is not None:
            self.before_join()
        try:
            dist.init_process_group(
                self.backend,
                init_method=self.init_method,
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.timeout_s),
            )
        except Exception as exc:  # a rank that never came, a port taken meanwhile
            detail = f"rank {self.rank}: joining the process group failed ({exc})"
            if self.on_lost is not None:
                self.on_lost(detail)
            raise RankLost(detail) from exc
        self._joined = True
        return shard

    def reduce(self, partial: Tensor) -> Tensor:
        """Σ over the ranks of ``partial``, in place (one all-reduce); every rank gets it."""
        try:
            dist.all_reduce(partial, op=dist.ReduceOp.SUM)
        except Exception as exc:  # gloo/NCCL raise RuntimeError subclasses on a lost peer
            detail = f"rank {self.rank}: a collective failed ({type(exc).__name__}: {exc})"
            if self.on_lost is not None:
                self.on_lost(detail)
            raise RankLost(detail) from exc
        return partial

    def close(self) -> None:
        """Leave the process group (local; safe to call twice)."""
        if self._joined and dist.is_initialized():
            dist.destroy_process_group()
        self._joined = False
