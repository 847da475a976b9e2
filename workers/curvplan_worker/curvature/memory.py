"""Memory planning of the curvature products (docs/numerics.md#memory-plan).

Before the spectra the engine measures what one Hessian-vector product on one micro-batch
holds, then chooses the micro-batch size and whether the first-backward graphs are cached so
that the whole job fits the memory budget (the ``memory_budget`` worker setting; on CUDA by
default the free device memory × :data:`CUDA_SAFETY`; unbounded on CPU unless set).

Measurement (``memory_fit.measure_product``), on a probe of the first ``p`` examples:

* ``saved_bytes``: the distinct storages autograd saves for backward during the forward and
  the first backward with ``create_graph=True`` (``torch.autograd.graph.saved_tensors_hooks``;
  the parameters' own storages are not counted: they are resident anyway). This is what a
  cached batch keeps alive, and it grows linearly with the examples: per example ``a = S/p``.
* ``gradient_bytes`` ``g``: the first-order gradient tensors (one parameter-sized set per
  cached batch).
* on CUDA also the ``torch.cuda.max_memory_allocated`` increase over one uncached product on
  the probe (forward, first backward, second backward): ``P``.

The model of a product's peak (bytes on top of the model and data), micro-batch ``m``:

* uncached: ``f · (m·a + g)``, where ``f`` is the second backward's overhead on top of the
  graph it walks: measured ``f = P / (p·a + g)`` on CUDA (source ``cuda-peak``), assumed
  ``f = 2`` elsewhere (source ``saved-tensors``: the second backward produces one gradient per
  saved activation, at most as large as the graph);
* cached (every micro-batch's graph kept): ``N·a + B·g + (f − 1)·(m·a + g)`` with ``N`` examples
  in ``B = ⌈N/m⌉`` micro-batches.

The plan is the largest micro-batch (at most the configured one) for which the cached job
fits, if caching is allowed; else the largest for which the uncached one fits; else
:class:`OutOfDeviceMemory` (one example does not fit). Micro-batching never changes the loss:
every batch is divided by the total count (docs/numerics.md#loss-normalisation).
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import NotRequired, TypedDict, cast

import torch

CUDA_SAFETY = 0.9
"""The share of the free CUDA memory a job plans to use when no budget is configured."""

CPU_PRODUCT_FACTOR = 2.0
"""Assumed peak of a product relative to its graph where it cannot be measured (CPU)."""

PROBE_EXAMPLES = 2
"""Examples of the probe micro-batch the memory of one product is measured on."""


def format_bytes(n: float | None) -> str:
    """``1536`` → ``"1.50 KiB"`` (binary units)."""
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


class OutOfDeviceMemory(RuntimeError):
    """One example's product does not fit the memory budget (the job's ``out-of-memory``)."""

    def __init__(
        self,
        budget: int | None,
        per_example_bytes: float | None,
        source: str | None,
        during: str = "planning",
    ) -> None:
        self.budget = budget
        self.per_example_bytes = per_example_bytes
        self.source = source
        self.during = during
        where = f"the budget of {format_bytes(budget)}" if budget else "the device's free memory"
        measured = (
            f"one product on one example needs about {format_bytes(per_example_bytes)} "
            f"(measured: {source})"
            if per_example_bytes is not None
            else "not measured"
        )
        if during == "planning":
            text = measured
        else:
            text = f"out of memory at micro-batch 1 in {during}, repeatedly (plan: {measured})"
        super().__init__(f"one example does not fit in {where}: {text}")


@dataclass(frozen=True)
class ProductMemory:
    """What one HVP on the probe micro-batch holds (bytes)."""

    probe_examples: int
    saved_bytes: int
    gradient_bytes: int
    cuda_peak_bytes: int | None

    @property
    def per_example_bytes(self) -> float:
        """Bytes of graph kept per example (a)."""
        return self.saved_bytes / max(self.probe_examples, 1)

    @property
    def factor(self) -> float:
        """The product's peak over its graph (f): measured on CUDA, assumed elsewhere."""
        graph = self.saved_bytes + self.gradient_bytes
        if self.cuda_peak_bytes is not None and graph > 0:
            return max(1.0, self.cuda_peak_bytes / graph)
        return CPU_PRODUCT_FACTOR

    @property
    def source(self) -> str:
        return "cuda-peak" if self.cuda_peak_bytes is not None else "saved-tensors"

    def uncached_peak(self, micro_batch: int) -> float:
        return self.factor * (micro_batch * self.per_example_bytes + self.gradient_bytes)

    def cached_peak(self, micro_batch: int, n_examples: int) -> float:
        n_batches = math.ceil(n_examples / micro_batch)
        graphs = n_examples * self.per_example_bytes + n_batches * self.gradient_bytes
        return graphs + (self.factor - 1.0) * (
            micro_batch * self.per_example_bytes + self.gradient_bytes
        )


def default_budget(device: torch.device, configured: int | None) -> tuple[int | None, str]:
    """The budget and where it comes from: the setting, else free CUDA memory × safety."""
    if configured is not None:
        return int(configured), "memory_budget"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # memory this process's allocator holds but does not use is free for it too
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int((free + cached) * CUDA_SAFETY), f"free CUDA memory × {CUDA_SAFETY:g}"
    return None, "unbounded (CPU without memory_budget)"


class OutOfMemoryRetry(TypedDict):
    """One retry of the operator after an out-of-memory error (``CurvatureEngine``): during
    which stage, the micro-batch that failed and the one it retried with."""

    during: str
    from_micro_batch: int
    to_micro_batch: int


class KilledRetry(TypedDict):
    """The retry of an attempt killed out of memory (``AttemptLimits.micro_batch_factor``):
    the micro-batch it runs with."""

    during: str
    micro_batch: int


class MemoryPlanJson(TypedDict):
    """:class:`MemoryPlan` as the result's ``memory_plan`` stores it, with the later stages'
    predicted peaks (:func:`later_stage_memory`) once the engine adds them."""

    budget_bytes: int | None
    budget_source: str
    source: str
    probe_examples: int
    per_example_bytes: float
    per_batch_bytes: float
    gradient_bytes: int
    product_factor: float
    saved_bytes_probe: int
    cuda_peak_bytes_probe: int | None
    n_examples: int
    configured_micro_batch: int
    micro_batch: int
    cache_graph: bool
    predicted_peak_bytes: float
    retries: list[OutOfMemoryRetry | KilledRetry]
    stages: NotRequired[dict[str, float]]


@dataclass
class MemoryPlan:
    """The plan recorded in the result as ``memory_plan``."""

    budget_bytes: int | None
    budget_source: str
    source: str
    probe_examples: int
    per_example_bytes: float
    per_batch_bytes: float
    gradient_bytes: int
    product_factor: float
    saved_bytes_probe: int
    cuda_peak_bytes_probe: int | None
    n_examples: int
    configured_micro_batch: int
    micro_batch: int
    cache_graph: bool
    predicted_peak_bytes: float
    retries: list[OutOfMemoryRetry | KilledRetry]

    def as_dict(self) -> MemoryPlanJson:
        # asdict writes exactly the fields above, in order, and copies each retry record
        return cast(MemoryPlanJson, asdict(self))


def choose(
    memory: ProductMemory,
    n_examples: int,
    max_micro_batch: int,
    allow_cache: bool,
    budget: int | None,
) -> tuple[int, bool, float]:
    """(micro-batch, cache, predicted peak): the largest micro-batch ≤ ``max_micro_batch``
    with the graphs cached that fits ``budget``, else the largest without; raises
    :class:`OutOfDeviceMemory` when not even one example fits uncached."""
    top = max(1, min(max_micro_batch, n_examples))
    if budget is None:
        peak = memory.cached_peak(top, n_examples) if allow_cache else memory.uncached_peak(top)
        return top, allow_cache, peak
    if allow_cache:
        for m in range(top, 0, -1):
            peak = memory.cached_peak(m, n_examples)
            if peak <= budget:
                return m, True, peak
    for m in range(top, 0, -1):
        peak = memory.uncached_peak(m)
        if peak <= budget:
            return m, False, peak
    raise OutOfDeviceMemory(budget, memory.uncached_peak(1), memory.source)


_PEAK_FLOOR: dict[str, int] = {}
"""CUDA peaks from before a measurement reset the device's peak statistics."""


def keep_peak(device: torch.device) -> None:
    """Remember the device's peak so far before a measurement resets its statistics."""
    key = str(device)
    _PEAK_FLOOR[key] = max(_PEAK_FLOOR.get(key, 0), int(torch.cuda.max_memory_allocated(device)))


def reset_peak(device: torch.device) -> None:
    """Start measuring the job's peak memory (CUDA; the process's max RSS cannot be reset)."""
    if device.type == "cuda":
        _PEAK_FLOOR.pop(str(device), None)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """The job's peak memory and what it is: CUDA peak allocated since :func:`reset_peak`,
    else the process's peak resident memory."""
    if device.type == "cuda":
        peak = max(_PEAK_FLOOR.get(str(device), 0), int(torch.cuda.max_memory_allocated(device)))
        return peak, "cuda-max-allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process-max-rss"


MAX_LOCKSTEP_VECTORS = 32
"""The most vectors one batched second backward of the lockstep spectra carries."""

CPU_BATCHED_VECTOR_BYTES = 1 << 20
"""On a CPU the lockstep batches its products only while one vector's working set
(``LockstepPlan.vector_bytes``) is at most this (1 MiB). Measured on the 2-core machine, one
thread, float32 (docs/numerics.md#lockstep): with 0.02–0.03 MiB a vector (the tests' tiny
models) one batched round took 0.3–0.6× the time of one product per block; with 2.8 MiB (the
example on 8 sequences) 1.4×, with 20–22 MiB (the example and the tiny GPT-2 on their 64
sequences) 4.4–4.7×: vmap's batched intermediates are memory-bound there, and every vector
computes every row of the union while a block product prunes to its own. On CUDA the batched
product is always used (it removes the per-product launch costs)."""


class LockstepPlanJson(TypedDict):
    """:class:`LockstepPlan` as the result's ``memory_plan.lockstep.plan`` stores it."""

    n_tasks: int
    basis_bytes_total: int
    basis_room_bytes: int | None
    concurrent: int
    vectors_per_product: int
    graph_bytes: float
    vector_bytes: float
    predicted_peak_bytes: float
    fits: bool
    batched: bool
    batched_reason: str


@dataclass(frozen=True)
class LockstepPlan:
    """How the lockstep spectra fit the budget (the result's ``memory_plan.lockstep``).

    ``graph_bytes`` is what the products walk (every micro-batch's graph when cached, one
    micro-batch's otherwise, built once per batched product); each vector of a batched product
    adds ``vector_bytes``: the second backward's own intermediates, (f − 1)·(m·a + g), batched
    once per vector, plus its block-masked input, its output and the gathered rows
    (3 · n_union · itemsize). The running coroutines' bases sum to at most
    ``basis_room_bytes``; ``basis_bytes_total`` is every block's and pair's together.
    """

    n_tasks: int
    basis_bytes_total: int
    basis_room_bytes: int | None
    concurrent: int
    vectors_per_product: int
    graph_bytes: float
    vector_bytes: float
    predicted_peak_bytes: float
    fits: bool
    batched: bool = True
    batched_reason: str = ""

    def as_dict(self) -> LockstepPlanJson:
        return {
            "n_tasks": self.n_tasks,
            "basis_bytes_total": self.basis_bytes_total,
            "basis_room_bytes": self.basis_room_bytes,
            "concurrent": self.concurrent,
            "vectors_per_product": self.vectors_per_product,
            "graph_bytes": self.graph_bytes,
            "vector_bytes": self.vector_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "fits": self.fits,
            "batched": self.batched,
            "batched_reason": self.batched_reason,
        }


def _batched_choice(device_type: str, vector: float) -> tuple[bool, str]:
    """Whether the lockstep batches its products (:data:`CPU_BATCHED_VECTOR_BYTES`): decided
    from the plan alone, so every process with the same model and data decides alike."""
    if device_type == "cuda":
        return True, "cuda: batched products remove the per-product launch costs"
    if vector <= CPU_BATCHED_VECTOR_BYTES:
        return True, (
            f"cpu: {format_bytes(vector)} a vector ≤ {format_bytes(CPU_BATCHED_VECTOR_BYTES)}"
        )
    return False, (
        f"cpu: {format_bytes(vector)} a vector > {format_bytes(CPU_BATCHED_VECTOR_BYTES)}: "
        "one product per block is faster there"
    )


def plan_lockstep(
    plan: MemoryPlan | None,
    basis_bytes: list[int],
    n_union: int,
    itemsize: int,
    budget: int | None,
    max_vectors: int = MAX_LOCKSTEP_VECTORS,
    device_type: str = "cpu",
) -> LockstepPlan:
    """Concurrency and vectors per batched product of the lockstep spectra within ``budget``.

    All tasks run at once when their bases and one vector each fit with the graph; else the
    largest number c such that the c largest bases plus c vectors fit (at least one: a run
    whose single largest task does not fit says ``fits`` False and runs one at a time).
    ``batched`` says whether the products are batched at all (:data:`CPU_BATCHED_VECTOR_BYTES`);
    without, one product per vector (``vectors_per_product`` 1).
    """
    n = len(basis_bytes)
    per_batch = plan.per_batch_bytes if plan is not None else 0.0
    factor = plan.product_factor if plan is not None else CPU_PRODUCT_FACTOR
    if plan is None:
        graph = 0.0
    elif plan.cache_graph:
        graph = plan.n_examples * plan.per_example_bytes + (
            math.ceil(plan.n_examples / max(plan.micro_batch, 1)) * plan.gradient_bytes
        )
    else:
        graph = per_batch
    vector = max(factor - 1.0, 1.0) * per_batch + 3.0 * n_union * itemsize
    total = int(sum(basis_bytes))
    cap = max(1, min(max_vectors, n)) if n else 1
    batched, why = _batched_choice(device_type, vector)
    if not batched:
        cap = 1
    if budget is None or n == 0:
        peak = graph + total + cap * vector
        return LockstepPlan(n, total, None, n, cap, graph, vector, peak, True, batched, why)
    available = budget - graph
    largest = sorted(basis_bytes, reverse=True)
    concurrent, room = 0, 0
    for c in range(1, n + 1):
        bases = sum(largest[:c])
        if bases + min(c, cap) * vector > available:
            break
        concurrent, room = c, bases
    fits = concurrent >= 1
    if not fits:
        concurrent, room = 1, largest[0]
    vectors = max(1, min(cap, concurrent, int((available - room) // vector) if fits else 1))
    peak = graph + room + vectors * vector
    room_or_none = None if concurrent == n else room
    return LockstepPlan(
        n, total, room_or_none, concurrent, vectors, graph, vector, peak, fits, batched, why
    )


def agree_lockstep(
    plan: LockstepPlan,
    basis_bytes: list[int],
    reduce: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
) -> LockstepPlan:
    """The smallest concurrency and vectors per product over the ranks of a data-parallel
    group (``reduce`` an all-reduce sum): every rank must make the same batched products, and
    so the same number of all-reduces, in the same order (docs/numerics.md#data-parallel).
    The minimum is read from the summed one-hot votes of the ranks."""
    n = max(plan.n_tasks, plan.vectors_per_product, 1)
    votes = torch.zeros(2, n + 1, dtype=torch.float64)
    votes[0, plan.concurrent] = 1.0
    votes[1, plan.vectors_per_product] = 1.0
    summed = reduce(votes.to(device))
    summed = summed.to("cpu")
    concurrent = int(torch.nonzero(summed[0] > 0)[0])
    vectors = int(torch.nonzero(summed[1] > 0)[0])
    largest = sorted(basis_bytes, reverse=True)
    room = None if concurrent >= plan.n_tasks else int(sum(largest[:concurrent]))
    return replace(plan, concurrent=concurrent, vectors_per_product=vectors, basis_room_bytes=room)


def later_stage_memory(
    plan: MemoryPlan | None,
    n_params: int,
    *,
    sample_batch: int,
    noise_batch: int,
    noise_groups: int,
    basis_budget: int | None,
) -> dict[str, float]:
    """Predicted peak bytes of the stages after the spectra (the result's
    ``memory_plan.stages``; a prediction recorded for the operator, not enforced):

    * ``per_sample``: the per-example Hessian norms' one-example product, f·(a + g), and its
      Lanczos basis over all ``n_params`` parameters (float64 on the CPU,
      ``spectra.basis_vectors`` of ``basis_budget``), plus the per-example gradient rows of one
      vmapped batch, ``sample_batch`` × n_params float64;
    * ``gradient_noise``: its ``noise_groups`` running gradient sums and one batch of
      per-example gradient rows (float64), and the vmapped batch's graph, ``noise_batch`` · a.
    """
    from curvplan_worker.curvature.spectra import basis_bytes, basis_vectors

    a = plan.per_example_bytes if plan is not None else 0.0
    g = plan.gradient_bytes if plan is not None else 0.0
    f = plan.product_factor if plan is not None else CPU_PRODUCT_FACTOR
    vectors = basis_vectors(n_params, basis_budget, 8, 2)
    per_sample = f * (a + g) + basis_bytes(n_params, vectors, 8) + sample_batch * n_params * 8.0
    noise = (noise_groups + noise_batch) * n_params * 8.0 + noise_batch * a + g
    return {"per_sample": per_sample, "gradient_noise": noise}
