"""The memory plan applied to an engine: measure one product on it, then choose and set its
micro-batch and graph caching (the model and the choice: :mod:`curvplan_worker.curvature.memory`).

Above both the engine (:mod:`~curvplan_worker.curvature.operator`) and the memory model, so that
the engine imports the plan's types without the plan importing the engine.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from curvplan_worker.curvature.memory import (
    PROBE_EXAMPLES,
    MemoryPlan,
    OutOfDeviceMemory,
    ProductMemory,
    choose,
    keep_peak,
)
from curvplan_worker.curvature.operator import CurvatureEngine


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse/nested/functional wrappers
        return None
    return (str(t.device), storage.data_ptr())


def measure_product(engine: CurvatureEngine, probe_examples: int = PROBE_EXAMPLES) -> ProductMemory:
    """The memory of one uncached HVP over all parameters on the first ``probe_examples``
    examples of the engine's sample (the engine's products and counters are not touched)."""
    x, y = engine.batches[0]
    p = max(1, min(probe_examples, int(x.shape[0])))
    x, y = x[:p], y[:p]
    resident = {_storage_key(t) for t in engine.params.values()}
    resident |= {_storage_key(x), _storage_key(y)}
    saved: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key is not None and key not in resident and key not in saved:
            saved[key] = t.untyped_storage().nbytes()
        return t

    cuda = engine.device.type == "cuda"
    before = 0
    if cuda:
        torch.cuda.synchronize(engine.device)
        keep_peak(engine.device)  # the job's peak so far survives the reset
        torch.cuda.reset_peak_memory_stats(engine.device)
        before = torch.cuda.memory_allocated(engine.device)
    tensors = [engine.params[n] for n in engine.params]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = functional_call(engine.model, engine.params, (x,))
        losses, _ = engine.objective.output_losses(out, y)
        grads = torch.autograd.grad(
            losses.sum() / engine.total_count, tensors, create_graph=True, allow_unused=True
        )
    gradient_bytes = sum(g.numel() * g.element_size() for g in grads if g is not None)
    pairs = [
        (g, t) for g, t in zip(grads, tensors, strict=True) if g is not None and g.requires_grad
    ]
    if pairs:
        torch.autograd.grad(
            [g for g, _ in pairs],
            [t for _, t in pairs],
            grad_outputs=[torch.ones_like(g) for g, _ in pairs],
            allow_unused=True,
        )
    cuda_peak = None
    if cuda:
        torch.cuda.synchronize(engine.device)
        cuda_peak = int(torch.cuda.max_memory_allocated(engine.device) - before)
    del grads, pairs, out, losses
    return ProductMemory(p, int(sum(saved.values())), int(gradient_bytes), cuda_peak)


def fit_to_memory(
    engine: CurvatureEngine, budget: int | None, budget_source: str, allow_cache: bool
) -> MemoryPlan:
    """Measure one product, choose micro-batch and caching, apply them to ``engine``."""
    engine._require_session()
    try:
        memory = measure_product(engine)
    except torch.cuda.OutOfMemoryError:
        engine.release_graph()
        if engine.device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            memory = measure_product(engine, 1)
        except torch.cuda.OutOfMemoryError as exc:
            raise OutOfDeviceMemory(budget, None, None, "measuring one product") from exc
    n = engine.n_examples
    configured = engine.micro_batch
    engine.memory_budget = budget
    engine.per_example_bytes = memory.uncached_peak(1)
    engine.memory_source = memory.source
    micro, cache, peak = choose(memory, n, configured, allow_cache, budget)
    if micro != configured:
        engine.rebatch(micro)
    engine.cache_graph = cache
    engine.memory_plan = MemoryPlan(
        budget_bytes=budget,
        budget_source=budget_source,
        source=memory.source,
        probe_examples=memory.probe_examples,
        per_example_bytes=memory.per_example_bytes,
        per_batch_bytes=micro * memory.per_example_bytes + memory.gradient_bytes,
        gradient_bytes=memory.gradient_bytes,
        product_factor=memory.factor,
        saved_bytes_probe=memory.saved_bytes,
        cuda_peak_bytes_probe=memory.cuda_peak_bytes,
        n_examples=n,
        configured_micro_batch=configured,
        micro_batch=micro,
        cache_graph=cache,
        predicted_peak_bytes=peak,
        retries=list(engine.oom_retries),
    )
    return engine.memory_plan
