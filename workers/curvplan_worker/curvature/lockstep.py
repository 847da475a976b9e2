"""Lockstep block spectra (docs/numerics.md#lockstep).

Every selected block's Lanczos (and every off-diagonal pair's) is a coroutine that yields the
Hessian products it needs (``spectra.block_steps``, ``spectra.pair_steps``). :class:`Lockstep`
advances all of them together: each round gathers the one pending product of every running
coroutine and computes them in ONE batched second backward over the cached graph
(``CurvatureEngine.multi_hvp``, ``is_grads_batched``), chunked to the memory plan's vectors
per product (``memory.plan_lockstep``). A finished coroutine drops out and the next queued one
starts, so at most the planned bases are resident at once. Each coroutine draws its start
vector from its own seeded generator and runs the same arithmetic as when driven alone
(``spectra.run_products``), so the results equal the sequential ones up to the rounding of the
products' summation order.

Where the batched backward fails (an operation without a batching rule under
``is_grads_batched``: a custom autograd function, data-dependent control flow in a backward),
the run falls back to one product per vector for the rest of the stage, logs the reason and
records it (``mode: "loop"``, ``fallback_reason``).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor

from curvplan_worker.curvature.cancel import check_cancel
from curvplan_worker.curvature.distributed import RankLost
from curvplan_worker.curvature.memory import OutOfDeviceMemory
from curvplan_worker.curvature.spectra import Product, ProductSteps

if TYPE_CHECKING:
    from curvplan_worker.curvature.operator import CurvatureEngine

log = logging.getLogger("curvplan.engine.lockstep")


@dataclass
class Task:
    """One coroutine to run: a block's or a pair's, with the bytes its basis holds."""

    key: str
    steps: ProductSteps
    basis_bytes: int = 0


class LockstepStatsJson(TypedDict):
    """:class:`LockstepStats` as the result's ``lockstep`` record stores it."""

    mode: str
    fallback_reason: str | None
    slow_batching_ops: list[str]
    vectors_per_product: int
    basis_room_bytes: int | None
    products: int
    backwards: int
    rounds: int
    max_running: int
    seconds: float


@dataclass
class LockstepStats:
    """What a lockstep run did (the result's ``lockstep`` record)."""

    mode: str = "batched"
    fallback_reason: str | None = None
    slow_batching_ops: list[str] = field(default_factory=list)
    vectors_per_product: int = 0
    basis_room_bytes: int | None = None
    products: int = 0
    backwards: int = 0
    rounds: int = 0
    max_running: int = 0
    seconds: float = 0.0

    def as_dict(self) -> LockstepStatsJson:
        return {
            "mode": self.mode,
            "fallback_reason": self.fallback_reason,
            "slow_batching_ops": list(self.slow_batching_ops),
            "vectors_per_product": self.vectors_per_product,
            "basis_room_bytes": self.basis_room_bytes,
            "products": self.products,
            "backwards": self.backwards,
            "rounds": self.rounds,
            "max_running": self.max_running,
            "seconds": self.seconds,
        }


Done = Callable[[str, object, int, int], None]
"""Called as ``done(key, result, finished, total)`` when a coroutine returns."""


class Lockstep:
    """Drive product coroutines together, one batched product per round (module docstring).

    ``vectors_per_product`` caps the vectors of one batched backward (None: all running);
    ``basis_room`` caps the summed ``basis_bytes`` of the running coroutines (None: no cap; at
    least one always runs); ``batched`` False is the loop path (one product per vector).
    """

    def __init__(
        self,
        engine: CurvatureEngine,
        *,
        vectors_per_product: int | None = None,
        basis_room: int | None = None,
        batched: bool = True,
    ) -> None:
        self.engine = engine
        self.cap = vectors_per_product
        self.room = basis_room
        self.batched = batched
        self.stats = LockstepStats(
            mode="batched" if batched else "loop",
            vectors_per_product=vectors_per_product or 0,
            basis_room_bytes=basis_room,
        )
        self._checked_warnings = False

    def run(self, tasks: Sequence[Task], done: Done | None = None) -> dict[str, object]:
        """Run every task to its end; returns key → the coroutine's return value."""
        started = time.perf_counter()
        queue = deque(tasks)
        running: dict[str, tuple[Task, Product]] = {}
        results: dict[str, object] = {}
        used = 0
        total = len(tasks)

        def finish(task: Task, value: object) -> None:
            results[task.key] = value
            if done is not None:
                done(task.key, value, len(results), total)

        while queue or running:
            while queue and (
                not running or self.room is None or used + queue[0].basis_bytes <= self.room
            ):
                task = queue.popleft()
                try:
                    first = next(task.steps)
                except StopIteration as stop:
                    finish(task, stop.value)
                    continue
                running[task.key] = (task, first)
                used += task.basis_bytes
            if not running:
                break
            self.stats.max_running = max(self.stats.max_running, len(running))
            check_cancel("lockstep spectra")
            keys = list(running)
            products = self._products([running[k][1] for k in keys])
            self.stats.rounds += 1
            for key, hv in zip(keys, products, strict=True):
                task, _ = running[key]
                try:
                    running[key] = (task, task.steps.send(hv))
                except StopIteration as stop:
                    del running[key]
                    used -= task.basis_bytes
                    finish(task, stop.value)
        self.stats.seconds += time.perf_counter() - started
        return results

    def _products(self, requests: list[Product]) -> list[Tensor]:
        size = self.cap or len(requests)
        out: list[Tensor] = []
        for start in range(0, len(requests), size):
            out += self._chunk(requests[start : start + size])
        self.stats.products += len(requests)
        return out

    def _chunk(self, chunk: list[Product]) -> list[Tensor]:
        if self.batched:  # a lone vector too: its product must not depend on the batch
            try:
                result = self._batched(chunk)
                self.stats.backwards += 1
                return result
            except (torch.cuda.OutOfMemoryError, OutOfDeviceMemory, RankLost):
                raise  # not a missing batching rule: the job's own errors
            except (RuntimeError, NotImplementedError) as exc:
                self.fall_back(f"{type(exc).__name__}: {exc}")
        self.stats.backwards += len(chunk)
        return [self.engine.hvp(p.rows, p.cols, p.vector) for p in chunk]

    def _batched(self, chunk: list[Product]) -> list[Tensor]:
        requests = [(p.rows, p.cols, p.vector) for p in chunk]
        if self._checked_warnings:
            return self.engine.multi_hvp(requests)
        # the first batched product: note operations that vmap runs through its slow fallback
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self.engine.multi_hvp(requests)
        self._checked_warnings = True
        for w in caught:
            text = str(w.message)
            if "batching rule" in text:
                self.stats.slow_batching_ops.append(text[:300])
                log.warning("batched Hessian products: %s", text[:300])
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return result

    def fall_back(self, reason: str) -> None:
        """Use one product per vector from now on, saying why."""
        self.batched = False
        self.stats.mode = "loop"
        self.stats.fallback_reason = reason[:500]
        log.warning(
            "batched Hessian products are not available for this model (%s); falling back to "
            "one second backward per vector",
            self.stats.fallback_reason,
        )
