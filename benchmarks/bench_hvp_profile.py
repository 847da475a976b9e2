"""Where one Hessian-vector product's time and memory go, against one gradient, on the HF GPT-2
of ``bench_hf_curvature.py`` (1.33 M parameters, batch 16 × 64, float32, CPU, 1 thread).

For each way of computing the product it prints the median CPU ms (process time, so other
load on a shared machine counts less) and the ratio to one gradient:

* ``gradient``: ``CurvatureEngine.gradient`` (forward + one backward);
* ``hvp cached``: the engine's default, the first backward's graph cached, so a product is
  the second backward only (reverse-over-reverse);
* ``hvp double backward``: ``cache_graph=False``: forward, first backward with
  ``create_graph=True``, second backward, per product;
* ``hvp forward-over-reverse``: ``torch.func.jvp`` of ``torch.func.grad`` (no cached graph;
  forward + backward carrying tangents per product), checked against the cached product.

Memory: the bytes autograd saves for backward during one gradient and during building the
double-backward graph (the graph the cache keeps), and the peak resident-set growth of each.
Then ``torch.profiler`` tables (self CPU time by operator) of one gradient and of one cached
product: where the product's time goes.

    .venv/bin/python benchmarks/bench_hvp_profile.py [--repeats 7] [--top 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hf_curvature import _SavedBytes, problem

from curvplan_worker.curvature.objective import CausalLMObjective
from curvplan_worker.curvature.operator import CurvatureEngine


def median_cpu_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1e3 * statistics.median(times)


def forward_over_reverse(eng: CurvatureEngine):
    """H v by ``jvp(grad(L))`` over all parameters (one batch: the benchmark's sample)."""
    from torch.func import functional_call, grad, jvp

    names = eng.names
    primals = {n: eng.params[n].detach() for n in names}
    x, y = eng.batches[0]
    total = eng.total_count

    def loss(params):
        out = functional_call(eng.model, params, (x,))
        losses, _ = eng.objective.output_losses(out, y)
        return losses.sum() / total

    def product(v_flat: torch.Tensor) -> torch.Tensor:
        tangents = dict(zip(names, eng.layout(names).split(v_flat), strict=True))
        tangents = {n: t.reshape(primals[n].shape) for n, t in tangents.items()}
        _, hv = jvp(grad(loss), (primals,), (tangents,))
        return torch.cat([hv[n].reshape(-1) for n in names])

    return product


ELEMENTWISE = ("aten::mul", "aten::add", "aten::add_", "aten::sub", "aten::exp", "aten::tanh")
GROUPS = {
    "matmul (mm/addmm/bmm)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "elementwise (mul/add/sub/exp/tanh)": ELEMENTWISE,
    "dtype casts (_to_copy)": ("aten::_to_copy",),
    "copies (copy_/clone/cat)": ("aten::copy_", "aten::clone", "aten::cat"),
    "fills (fill_/zero_)": ("aten::fill_", "aten::zero_"),
}


def _shares(events, total: float) -> str:
    """Self CPU ms, share and calls of each operator group of a profile."""
    by = {e.key: e for e in events}
    parts = []
    for label, keys in GROUPS.items():
        t = sum(by[k].self_cpu_time_total for k in keys if k in by)
        c = sum(by[k].count for k in keys if k in by)
        parts.append(f"{label} {t / 1e3:.1f} ms ({100 * t / max(total, 1):.0f} %, {c} calls)")
    return " | ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, x, y = problem(args.train_steps)
    module = model.module
    objective = CausalLMObjective()
    print(
        f"# GPT-2 (HF) {sum(p.numel() for p in module.parameters()) / 1e6:.2f} M parameters, "
        f"batch {x.shape[0]}×{x.shape[-1]}, {torch.get_num_threads()} thread(s), "
        f"torch {torch.__version__}, float32, CPU ms = process time"
    )
    with CurvatureEngine(module, objective, [(x, y)]) as eng:
        names = eng.names
        v = torch.randn(eng.layout(names).numel, generator=torch.Generator().manual_seed(0))
        g_ms = median_cpu_ms(eng.gradient, args.repeats)
        cached_ms = median_cpu_ms(lambda: eng.hvp(names, names, v), args.repeats)
        hv_cached = eng.hvp(names, names, v)
        fwd_rev = forward_over_reverse(eng)
        hv_fr = fwd_rev(v)
        fr_ms = median_cpu_ms(lambda: fwd_rev(v), args.repeats)
        rel = float((hv_fr - hv_cached).norm() / hv_cached.norm())
        with _SavedBytes() as grad_bytes:
            eng.gradient()
        eng.release_graph()
        with _SavedBytes() as graph_bytes:
            eng._graph_grads(0, names)
        if not args.no_profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p_grad:
                eng.gradient()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p_hvp:
                eng.hvp(names, names, v)
    with CurvatureEngine(module, objective, [(x, y)], cache_graph=False) as eng:
        double_ms = median_cpu_ms(lambda: eng.hvp(names, names, v), args.repeats)
    print(f"gradient                    {g_ms:8.1f} ms")
    print(f"hvp cached (2nd backward)   {cached_ms:8.1f} ms  {cached_ms / g_ms:.2f}× gradient")
    print(f"hvp double backward         {double_ms:8.1f} ms  {double_ms / g_ms:.2f}×")
    print(
        f"hvp forward-over-reverse    {fr_ms:8.1f} ms  {fr_ms / g_ms:.2f}×  "
        f"(rel. diff. to cached {rel:.1e})"
    )
    print(
        f"memory saved for backward: gradient {grad_bytes.total / 2**20:.1f} MiB, cached "
        f"double-backward graph {graph_bytes.total / 2**20:.1f} MiB "
        f"({graph_bytes.total / max(grad_bytes.total, 1):.2f}×)"
    )
    if args.no_profile:
        return
    for title, prof in (("gradient", p_grad), ("hvp cached (second backward)", p_hvp)):
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        alloc = sum(max(e.self_cpu_memory_usage, 0) for e in events)
        print(
            f"\n## {title}: {total / 1e3:.1f} ms self CPU (profiled), "
            f"{alloc / 2**20:.1f} MiB allocated"
        )
        print(_shares(events, total))
        print(
            events.table(
                sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=40
            )
        )


if __name__ == "__main__":
    main()
