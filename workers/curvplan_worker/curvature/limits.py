"""The worker's limits as the engine sees them: memory, time, the micro-batch after an OOM kill.

The worker passes :class:`AttemptLimits` to :func:`curvplan_worker.curvature.analyze.analyze`
(docs/operations.md#memory-limit). The engine then

* plans its products inside the worker's memory limit on a CPU that has no ``memory_budget``
  (:func:`host_budget`), so a job meets its own plan instead of the kernel's OOM killer;
* halves the planned micro-batch in the one retry after an out-of-memory kill
  (``micro_batch_factor``);
* measures one product before the spectra and fails at once with :class:`TooLarge` when even
  the smallest plan cannot fit (:func:`check_fits`), naming the options that shrink it;
* hands the measured figures (:func:`cost_inputs`) to the worker, which estimates the stages
  with the torch-free cost model and reports the ETA.

Importing this module does not import torch (the worker parent imports it for the dataclass).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from curvplan_core.cost_model import HOST_SAFETY, lanczos_basis_bytes, largest_basis_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import JsonValue
    from torch import Tensor

__all__ = [
    "HOST_SAFETY",
    "AttemptLimits",
    "AttemptLimitsJson",
    "CostInputs",
    "MeasuredSpectraTiming",
    "OneExampleTiming",
    "SpectraTimingArgs",
    "TooLarge",
    "lanczos_basis_bytes",
    "largest_basis_bytes",
]

SHRINK_OPTIONS = (
    "eval_batch_size (a smaller micro-batch), blocks (fewer or smaller blocks), max_iter (a "
    "shorter Lanczos basis), fewer or shorter examples in the dataset (tokens)"
)
"""What a client changes to make an analysis need less memory or time."""


class AttemptLimitsJson(TypedDict):
    """:class:`AttemptLimits` as the worker's ETA record reports it (``limits``)."""

    memory_limit_bytes: int | None
    memory_limit_source: str | None
    time_limit_seconds: float | None
    micro_batch_factor: float


SpectraItem = tuple[str, list[str], list[str]]
"""``(key, rows, cols)`` of one block (rows = cols) or pair (key ``row|col``) of the spectra."""


class SpectraTimingArgs(TypedDict):
    """:func:`time_spectra`'s keyword arguments as :func:`cost_inputs` takes them: the
    lockstep's items in its order and its plan."""

    items: list[SpectraItem]
    batched: bool
    vectors_per_product: int
    concurrent: int | None
    basis_budget: NotRequired[int | None]


class MeasuredSpectraTiming(TypedDict):
    """What :func:`time_spectra` measured (``cost_model.SpectraTiming``'s fields that apply):
    the batched round's figures with ``batched`` only, ``step_ms`` with the step overhead."""

    item_ms: dict[str, float]
    batched: bool
    vectors_per_product: int
    concurrent: int | None
    round_vectors: NotRequired[int]
    round_ms: NotRequired[float]
    one_vector_ms: NotRequired[float]
    step_ms: NotRequired[dict[str, float]]


class OneExampleTiming(TypedDict):
    """A one-example product over every parameter (:func:`time_one_example`), and in the cost
    inputs the Lanczos iteration's own ms per product at that size (``step_ms``)."""

    first_ms: float
    warm_ms: float
    step_ms: NotRequired[float]


class CostInputs(TypedDict):
    """What the worker's cost model needs, measured by :func:`cost_inputs` (the ``cost``
    progress event)."""

    spectra: MeasuredSpectraTiming | None
    example: OneExampleTiming | None
    ms_per_product: float
    first_product_ms: float
    blocks: dict[str, int]
    pairs: list[list[str | int]]
    n_params: int
    n_examples: int
    tokens: float
    micro_batch: int
    options: dict[str, JsonValue]
    stages: list[str] | None
    memory: dict[str, float]


@dataclass(frozen=True)
class AttemptLimits:
    """What the worker allows one attempt: host memory (bytes; None: unbounded), run time
    (seconds since ``started_at``, a ``time.monotonic()`` reading of the worker parent's clock,
    which a child on the same host shares), and the factor on the planned micro-batch (0.5 in
    the retry after an out-of-memory kill)."""

    memory_limit_bytes: int | None = None
    memory_limit_source: str = ""
    time_limit_seconds: float | None = None
    started_at: float | None = None
    micro_batch_factor: float = 1.0

    def seconds_left(self) -> float | None:
        """Seconds until the time limit (None: no limit)."""
        if self.time_limit_seconds is None:
            return None
        started = self.started_at if self.started_at is not None else time.monotonic()
        return self.time_limit_seconds - (time.monotonic() - started)

    def as_dict(self) -> AttemptLimitsJson:
        return {
            "memory_limit_bytes": self.memory_limit_bytes,
            "memory_limit_source": self.memory_limit_source or None,
            "time_limit_seconds": self.time_limit_seconds,
            "micro_batch_factor": self.micro_batch_factor,
        }


class TooLarge(RuntimeError):
    """The analysis cannot fit the worker's memory limit, whatever the micro-batch."""

    def __init__(self, estimate_bytes: float, limit: AttemptLimits, parts: dict[str, float]):
        self.estimate_bytes = estimate_bytes
        self.limit = limit
        self.parts = parts
        shown = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items())
        super().__init__(
            f"the analysis needs at least {_gib(estimate_bytes)} ({shown}); the worker's memory "
            f"limit is {_gib(limit.memory_limit_bytes or 0)} ({limit.memory_limit_source}). "
            f"Shrink it with {SHRINK_OPTIONS}, or run it on a worker with more memory "
            "(CURVPLAN_WORKER_MEMORY_LIMIT)"
        )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def process_rss_bytes() -> int:
    """This process's resident memory now (``/proc/self/statm``; 0 where there is none)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def host_budget(limits: AttemptLimits | None, basis_bytes: int) -> tuple[int | None, str]:
    """The products' budget on a host with a memory limit: limit × :data:`HOST_SAFETY` minus
    what the process holds now and the Lanczos basis (None when there is no limit)."""
    if limits is None or limits.memory_limit_bytes is None:
        return None, ""
    budget = int(limits.memory_limit_bytes * HOST_SAFETY) - process_rss_bytes() - basis_bytes
    source = (
        f"worker memory limit ({limits.memory_limit_source}) × {HOST_SAFETY:g} − resident − "
        "Lanczos basis"
    )
    return budget, source


def check_fits(
    limits: AttemptLimits | None, smallest_product_bytes: float, basis_bytes: int
) -> dict[str, float] | None:
    """The memory the smallest plan needs (resident now + one example's uncached product + the
    Lanczos basis) as parts; :class:`TooLarge` when it exceeds the worker's limit."""
    parts = {
        "resident": float(process_rss_bytes()),
        "one-example product": float(smallest_product_bytes),
        "Lanczos basis": float(basis_bytes),
    }
    if limits is None or limits.memory_limit_bytes is None:
        return parts
    if sum(parts.values()) > limits.memory_limit_bytes * HOST_SAFETY:
        raise TooLarge(sum(parts.values()), limits, parts)
    return parts


def time_products(engine: Any, names: list[str], repeats: int = 3) -> tuple[float, float]:
    """(first, steady) milliseconds of one Hessian-vector product on block ``names``: the first
    builds the cached first-backward graph, the steady figure is the median of ``repeats`` more
    (one product alone is at the mercy of a busy machine). The vector comes from its own
    generator, so no stage's random draws change."""
    import torch

    n = engine.layout(names).numel
    v = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    times = []
    for _ in range(1 + repeats):
        start = time.perf_counter()
        engine.block_hvp(names, v)
        times.append((time.perf_counter() - start) * 1000.0)
    engine.n_hvp -= 1 + repeats  # not the analysis's products
    return times[0], sorted(times[1:])[len(times[1:]) // 2]


PASS_SECONDS = 20.0
"""Timing passes over the spectra's items stop once they have taken this long."""


def _elapsed_everywhere(engine: Any, seconds: float) -> float:
    """This rank's ``seconds``, or more than :data:`PASS_SECONDS` when any data-parallel rank
    is past it (an all-reduce sum of the votes, ``engine.reducer``): every rank must stop its
    timing passes after the same pass, since every product is a collective
    (docs/numerics.md#data-parallel)."""
    reducer = getattr(engine, "reducer", None)
    if reducer is None:
        return seconds
    import torch

    votes = torch.tensor([seconds > PASS_SECONDS], dtype=torch.float64, device=engine.device)
    return PASS_SECONDS + 1.0 if float(reducer(votes)[0]) > 0 else seconds


def _synchronize(engine: Any) -> None:
    import torch

    if getattr(engine, "device", None) is not None and engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def lanczos_step_ms(
    n: int, *, device: Any, dtype: Any, basis_budget: int | None, steps: int = 60
) -> float:
    """Milliseconds of the Lanczos iteration itself per vector it yields, on an operator of
    size ``n`` whose product is free (a diagonal): the two orthogonalisations against the
    bounded basis, the restarts and the explicit certifications, and the coroutine's own
    Python cost (about 2 ms a step on the 2-core machine for small blocks, which is what the
    example's cheapest blocks pay besides their 0.5–2 ms products). ``steps`` (at tolerance 0,
    so it does not stop early) covers a restart of a 32-vector basis; a small operator's larger
    basis (up to 320 vectors, ``cost_model.SMALL_BASIS_BYTES``) does not restart in 60 steps
    and its later steps reorthogonalise against more vectors, so a long run of a small block is
    priced somewhat low (its projection's Ritz pairs cost O(steps) a step: ``spectra._ritz``)."""
    import torch

    from curvplan_worker.curvature.spectra import lanczos_steps

    diagonal = torch.linspace(-1.0, 2.0, n, dtype=dtype, device=device)
    coroutine = lanczos_steps(
        n,
        generator=torch.Generator().manual_seed(2),
        tol=0.0,
        max_iter=steps,
        basis_budget=basis_budget,
        device=device,
        dtype=dtype,
    )
    yielded = 0
    start = time.perf_counter()
    try:
        vector = next(coroutine)
        while True:
            yielded += 1
            vector = coroutine.send(diagonal * vector)
    except StopIteration:
        pass
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1000.0 / max(yielded, 1)


def time_spectra(
    engine: Any,
    items: list[SpectraItem],
    *,
    batched: bool,
    vectors_per_product: int,
    concurrent: int | None,
    repeats: int = 3,
    basis_budget: int | None = None,
    step_overhead: bool = True,
) -> MeasuredSpectraTiming:
    """The spectra's products priced as they will run (``cost_model.SpectraTiming``), after
    :func:`time_products` has built the cached graph.

    ``items``: ``(key, rows, cols)`` of every block (rows = cols) and pair, in the lockstep's
    order. Each item's ms is a warm product on that item alone (a pair: the mean of H_rc v
    and H_cr u), what the loop path and the trace pay for it: the median over ``repeats``
    passes over every item, or the lower middle of the passes made once they have taken
    :data:`PASS_SECONDS` (one pass of a large model): 1–3 products per item, i.e. at most
    3 / (products per item) of the spectra's own work. With ``batched`` (the plan's choice,
    ``memory.plan_lockstep``), also the batched second backward of the first
    min(vectors_per_product, concurrent, items) items' vectors (the first round's vectors in
    flight) and of one vector: each timed once to warm up, then the median of ``repeats``.
    The vectors come from their own generator; the products are not counted as the analysis's.
    With ``step_overhead``, the Lanczos iteration's own cost per product (:func:`lanczos_step_ms`
    on the smallest and the largest operator, linear in n between; a pair's per product is
    half its operator's, two products a step) as ``step_ms``.
    """
    import torch

    gen = torch.Generator().manual_seed(1)
    counted = engine.n_hvp

    def vector(names: list[str]) -> Tensor:
        return torch.randn(engine.layout(names).numel, generator=gen, dtype=torch.float64)

    def timed(fn: Callable[[], object]) -> float:
        _synchronize(engine)
        start = time.perf_counter()
        fn()
        _synchronize(engine)
        return (time.perf_counter() - start) * 1000.0

    vectors = {key: (vector(cols), vector(rows)) for key, rows, cols in items}
    seen: dict[str, list[float]] = {key: [] for key, _, _ in items}
    started = time.perf_counter()
    for _ in range(repeats):  # whole passes: a burst of load hits one pass, not every one
        for key, rows, cols in items:
            v, u = vectors[key]
            if list(rows) == list(cols):
                seen[key].append(timed(lambda r=rows, v=v: engine.hvp(r, r, v)))
            else:
                there = timed(lambda r=rows, c=cols, v=v: engine.hvp(r, c, v))
                back = timed(lambda r=rows, c=cols, u=u: engine.hvp(c, r, u))
                seen[key].append((there + back) / 2.0)
        if _elapsed_everywhere(engine, time.perf_counter() - started) > PASS_SECONDS:
            break  # products this long average the bursts out themselves
    item_ms = {key: sorted(t)[(len(t) - 1) // 2] for key, t in seen.items()}
    out: MeasuredSpectraTiming = {
        "item_ms": item_ms,
        "batched": bool(batched),
        "vectors_per_product": int(vectors_per_product),
        "concurrent": concurrent,
    }
    if batched and items:
        width = max(1, min(vectors_per_product, concurrent or len(items), len(items)))
        requests = [(rows, cols, vector(cols)) for _, rows, cols in items[:width]]

        def median(requests: list[tuple[list[str], list[str], Tensor]]) -> float:
            times = [timed(lambda: engine.multi_hvp(requests)) for _ in range(1 + repeats)]
            return sorted(times[1:])[len(times[1:]) // 2]

        out["round_vectors"] = width
        out["round_ms"] = median(requests)
        out["one_vector_ms"] = median(requests[:1]) if width > 1 else out["round_ms"]
    engine.n_hvp = counted  # not the analysis's products
    if step_overhead and items:
        from curvplan_worker.curvature.spectra import basis_dtype

        sizes = {key: engine.layout(cols).numel for key, _, cols in items}
        small, large = min(sizes.values()), max(sizes.values())
        kwargs = {
            "device": engine.device,
            "dtype": basis_dtype(engine.dtype),
            "basis_budget": basis_budget,
        }
        at_small = lanczos_step_ms(small, **kwargs)
        at_large = lanczos_step_ms(large, **kwargs) if large > small else at_small
        slope = (at_large - at_small) / (large - small) if large > small else 0.0
        out["step_ms"] = {
            key: (at_small + slope * (n - small)) / (1.0 if rows == cols else 2.0)
            for (key, rows, cols), n in zip(items, sizes.values(), strict=True)
        }
    return out


def _extend_step_ms(
    engine: Any, items: list[SpectraItem], timing: MeasuredSpectraTiming, n: int
) -> float | None:
    """The Lanczos iteration's own ms per product at ``n`` parameters: the line through the
    blocks' (``time_spectra``'s ``step_ms``, smallest and largest block), never below the
    smallest's."""
    steps = timing.get("step_ms") or {}
    sizes: dict[str, int] = {
        key: engine.layout(cols).numel for key, rows, cols in items if rows == cols
    }
    points = sorted((sizes[k], steps[k]) for k in sizes if k in steps)
    if not points:
        return None
    (n0, t0), (n1, t1) = points[0], points[-1]
    slope = (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0
    return max(t0, t0 + slope * (n - n0))


def time_one_example(model: Any, objective: Any, inputs: Any, targets: Any) -> OneExampleTiming:
    """Milliseconds of a Hessian-vector product over every parameter on the first example
    alone, what the per-sample Hessian norms make (``per_sample.per_sample_hessian_norms``:
    one engine per example, its first product builds the example's graph): ``first_ms`` the
    first product, ``warm_ms`` the median of three more."""
    import torch

    from curvplan_worker.curvature.operator import CurvatureEngine

    x, y = inputs[:1], targets[:1]
    times = []
    with CurvatureEngine(model, objective, [(x, y)]) as engine:
        names = list(engine.names)
        v = torch.randn(
            engine.layout(names).numel,
            generator=torch.Generator().manual_seed(3),
            dtype=torch.float64,
        )
        for _ in range(4):
            _synchronize(engine)
            start = time.perf_counter()
            engine.hvp(names, names, v)
            _synchronize(engine)
            times.append((time.perf_counter() - start) * 1000.0)
    return {"first_ms": times[0], "warm_ms": sorted(times[1:])[1]}


def cost_inputs(
    engine: Any,
    sizes: dict[str, int],
    pairs: list[tuple[str, str, int, int]],
    probe_block: list[str] | None,
    opts: Any,
    *,
    n_params: int,
    tokens: float,
    stages: list[str] | None,
    memory: dict[str, float],
    spectra: SpectraTimingArgs | None = None,
    example: OneExampleTiming | None = None,
) -> CostInputs:
    """What the worker's cost model needs, measured here: one product's milliseconds (on the
    first block to measure, else every parameter), the blocks and pairs, the sample size, and
    with ``spectra`` (:func:`time_spectra`'s keyword arguments: ``items``, ``batched``,
    ``vectors_per_product``, ``concurrent``) the spectra's products as they will run; with
    ``example`` (:func:`time_one_example`) a one-example product, which prices the per-sample
    Hessian norms with the Lanczos iteration's own cost at every parameter (``step_ms`` of the
    spectra's timing, extended linearly in n)."""
    first_ms, ms = time_products(engine, probe_block or list(engine.names))
    timing = time_spectra(engine, **spectra) if spectra is not None else None
    if example is not None and timing is not None and spectra is not None:
        step = _extend_step_ms(engine, spectra["items"], timing, n_params)
        if step is not None:
            example = {**example, "step_ms": step}
    return {
        "spectra": timing,
        "example": example,
        "ms_per_product": ms,
        "first_product_ms": first_ms,
        "blocks": dict(sizes),
        "pairs": [list(p) for p in pairs],
        "n_params": n_params,
        "n_examples": engine.n_examples,
        "tokens": tokens,
        "micro_batch": engine.micro_batch,
        "options": opts.model_dump(mode="json"),
        "stages": stages,
        "memory": memory,
    }
