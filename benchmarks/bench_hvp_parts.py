"""One Hessian-vector product split into its parts, and the engine's product before/after a
change side by side in one run (CPU, 1 thread, float32, process-CPU medians).

Models: the HF GPT-2 of ``bench_hf_curvature.py`` (1.33 M parameters, batch 16 × 64) and the
bundled example model (``curvplan example``'s Transformer, d_model 32, 2 layers, batch
12 × 32, freshly initialised from seed 0: the cost does not depend on the weights). Products:
the whole model, and one block as the spectra ask for it (GPT-2: the query slice
``c_attn[:, 0:128]`` of layer 1; the example: layer 1's attention block).

Parts of one cached product (``CurvatureEngine.hvp`` with the first backward's graph cached),
each timed on its own by calling the same steps the engine takes:

* ``layouts``: the two :meth:`CurvatureEngine.layout` calls (parsing the members);
* ``expand``: the flat vector → full-size tensors per parameter (zeros outside a slice);
* ``second backward``: ``torch.autograd.grad`` of the cached gradients with the vector;
* ``gather``: the row gradients → one flat vector, accumulated into the result;
* ``first backward (amortised)``: building the cached graph (forward + backward with
  ``create_graph=True``), paid once per batch, not per product.

Memory: ``torch.profiler`` memory events of one product (the CPU allocator's bytes), as the
peak of live bytes above the start and the total bytes allocated.

``--before REV`` imports the engine's operator and objective as they are at git revision REV
next to the working tree's ones and times both products alternately (ratios to the same
gradient).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_hvp_parts.py [--before main] [--repeats 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hf_curvature import problem

from curvplan_worker.curvature.example import EXAMPLE_SPEC
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import CausalLMObjective
from curvplan_worker.curvature.operator import CurvatureEngine

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = "workers/curvplan_worker/curvature/operator.py"
OBJECTIVE = "workers/curvplan_worker/curvature/objective.py"


def cpu_ms(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    """Median process-CPU ms of one call of ``fn`` (``inner`` calls per timing)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(inner):
            fn()
        times.append((time.process_time() - t0) / inner)
    return 1e3 * statistics.median(times)


def memory(fn: Callable[[], object]) -> tuple[float, float]:
    """(peak live MiB above the start, total MiB allocated) of one call, from the profiler's
    CPU memory events (each operator's own allocations net of its own frees, in start order)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        (e.time_range.start, e.self_cpu_memory_usage)
        for e in prof.events()
        if e.self_cpu_memory_usage
    ]
    live = peak = alloc = 0
    for _, b in sorted(events, key=lambda t: t[0]):
        live += b
        peak = max(peak, live)
        alloc += max(b, 0)
    return peak / 2**20, alloc / 2**20


MATMUL = {"aten::mm", "aten::addmm", "aten::bmm"}
FILLS = {"aten::fill_", "aten::zero_"}
COPIES = {"aten::copy_", "aten::clone", "aten::cat", "aten::_to_copy"}
ELEMENTWISE = {
    "aten::mul", "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::div", "aten::div_",
    "aten::exp", "aten::tanh", "aten::tanh_backward", "aten::pow", "aten::sum", "aten::where",
    "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::_softmax",
    "aten::_softmax_backward_data", "aten::neg", "aten::mean", "aten::rsqrt",
}  # fmt: skip


def op_groups(fn: Callable[[], object], vocab: int, d_ff: int) -> dict[str, float]:
    """Self CPU ms of one call of ``fn`` by operator group (``torch.profiler``): matmuls, the
    loss head's elementwise work (tensors with the vocabulary as last dimension), the MLP
    activation's (``d_ff`` last), other elementwise, fills, copies/casts, and the rest
    (autograd's node bookkeeping, views, dispatch)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    runs = []
    for _ in range(3):  # the median of three profiles per group (a loaded machine)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn()
        runs.append(_grouped(prof, vocab, d_ff))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _grouped(prof, vocab: int, d_ff: int) -> dict[str, float]:
    out = dict.fromkeys(
        [
            *("matmul", "loss head (…×vocab)", "MLP activation (…×d_ff)", "other elementwise"),
            *("fills", "copies/casts", "rest (autograd nodes, views)"),
        ],
        0.0,
    )
    for e in prof.key_averages(group_by_input_shape=True):
        last = {tuple(s)[-1] for s in e.input_shapes if isinstance(s, list | tuple) and s}
        if e.key in MATMUL:
            group = "matmul"
        elif e.key in FILLS:
            group = "fills"
        elif e.key in COPIES:
            group = "copies/casts"
        elif e.key in ELEMENTWISE and vocab in last:
            group = "loss head (…×vocab)"
        elif e.key in ELEMENTWISE and d_ff in last:
            group = "MLP activation (…×d_ff)"
        elif e.key in ELEMENTWISE:
            group = "other elementwise"
        else:
            group = "rest (autograd nodes, views)"
        out[group] += e.self_cpu_time_total / 1e3
    return out


class SavedStorages:
    """Distinct storages autograd saves while active, the parameters' own left out (what a
    graph keeps alive; counting every save would count a storage saved by several nodes
    several times)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.storages: dict[int, int] = {}

    def __enter__(self):
        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in self.skip:
                self.storages[st.data_ptr()] = st.nbytes()
            return t

        self._ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)

    @property
    def mib(self) -> float:
        return sum(self.storages.values()) / 2**20


def gpt2_case():
    model, x, y = problem(100)
    block = ["transformer.h.1.attn.c_attn.weight[:, 0:128]"]
    return "HF GPT-2 1.33M, batch 16x64", model.module, x, y, block, (4096, 512)


def example_case():
    model = build_model(EXAMPLE_SPEC, seed=0)
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, EXAMPLE_SPEC["task"]["vocab_size"], (12, 33), generator=gen)
    names = [n for n, _ in model.named_parameters() if n.startswith("layers.1.attn")]
    task = EXAMPLE_SPEC["task"]
    return (
        "example Transformer, batch 12x32",
        model,
        seq[:, :-1],
        seq[:, 1:],
        names,
        (
            task["vocab_size"],
            EXAMPLE_SPEC["d_ff"],
        ),
    )


def load_at(rev: str, path: str, name: str):
    """The module at ``path`` as it is at git revision ``rev``, imported as ``name``."""
    text = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def parts(
    eng: CurvatureEngine,
    names: list[str],
    v: torch.Tensor,
    repeats: int,
    vocab: int,
    d_ff: int,
    groups: bool,
) -> dict:
    """The cached product's steps, each timed alone (mirrors ``CurvatureEngine.hvp``)."""
    inner = 20 if v.numel() < 200_000 else 3
    lay = eng.layout(names)
    v_full = lay.expand(v)
    bases = list(v_full)
    row_tensors = [eng.params[n] for n in lay.bases]
    grads = eng._graph_grads(0, bases)
    pairs = [(g, v_full[n]) for g, n in zip(grads, bases, strict=True) if g is not None]

    def second():
        return torch.autograd.grad(
            [g for g, _ in pairs],
            row_tensors,
            grad_outputs=[w for _, w in pairs],
            retain_graph=True,
            allow_unused=True,
        )

    outs = second()

    def gather():
        total = torch.zeros(lay.numel, dtype=eng.dtype)
        total += lay.gather(dict(zip(lay.bases, outs, strict=True)))
        return total

    def first():
        eng.release_graph()
        eng._graph_grads(0, bases)

    out = {
        "layouts": cpu_ms(lambda: (eng.layout(names), eng.layout(names)), repeats, inner * 10),
        "expand": cpu_ms(lambda: lay.expand(v), repeats, inner * 10),
        "second backward": cpu_ms(second, repeats, inner),
        "gather": cpu_ms(gather, repeats, inner * 10),
        "first backward (amortised)": cpu_ms(first, repeats, max(1, inner // 3)),
    }
    out["groups"] = (
        None
        if not groups
        else {
            "gradient": op_groups(eng.gradient, vocab, d_ff),
            "second": op_groups(second, vocab, d_ff),
        }
    )
    mem = {
        "expand": memory(lambda: lay.expand(v)),
        "second backward": memory(second),
        "gather": memory(gather),
        "first backward (amortised)": memory(first),
    }
    return {"ms": out, "mem": mem}


def run_case(case, before, repeats: int) -> None:
    title, module, x, y, block, (vocab, d_ff) = case
    print(f"\n## {title}")
    engines = [("after", CurvatureEngine, CausalLMObjective)]
    if before:
        engines.append(("before", before[0].CurvatureEngine, before[1].CausalLMObjective))
    for label, eng_cls, objective_cls in engines:
        with eng_cls(module, objective_cls(), [(x, y)]) as eng:
            n_all = eng.layout(eng.names).numel
            eng.hvp(eng.names, eng.names, torch.zeros(n_all))  # build the cache
            for what, names in (("whole model", eng.names), ("block", block)):
                v = torch.randn(eng.layout(names).numel, generator=torch.Generator().manual_seed(0))
                p = parts(eng, list(names), v, repeats, vocab, d_ff, label.startswith("after"))
                print(f"### {label}: parts of one cached product, {what} ({v.numel()} params)")
                print(f"{'part':28s} {'CPU ms':>9s} {'peak MiB':>9s} {'alloc MiB':>10s}")
                groups = p["ms"].pop("groups")
                for k, ms in p["ms"].items():
                    pk, al = p["mem"].get(k, (float("nan"), float("nan")))
                    print(f"{k:28s} {ms:9.3f} {pk:9.2f} {al:10.2f}")
                if groups is None:  # the same autograd work before and after
                    continue
                print(
                    f"{'second backward by op (profiled)':34s} {'grad ms':>8s} "
                    f"{'2nd bw ms':>9s} ratio"
                )
                g_all, s_all = sum(groups["gradient"].values()), sum(groups["second"].values())
                for k in groups["gradient"]:
                    gm, sm = groups["gradient"][k], groups["second"][k]
                    print(f"  {k:32s} {gm:8.1f} {sm:9.1f} {sm / gm if gm else float('nan'):5.2f}")
                print(f"  {'total':32s} {g_all:8.1f} {s_all:9.1f} {s_all / g_all:5.2f}")
            if label.startswith("after"):
                params = list(eng.params.values())
                eng.release_graph()
                with SavedStorages(params) as grad_saved:
                    eng.gradient()
                with SavedStorages(params) as cache_saved:
                    eng._graph_grads(0, eng.names)
                print(
                    f"saved for backward (distinct storages, parameters excluded): gradient "
                    f"{grad_saved.mib:.1f} MiB, cached double-backward graph "
                    f"{cache_saved.mib:.1f} MiB ({cache_saved.mib / grad_saved.mib:.2f}x)"
                )
    # side by side: gradient, product (cached) before/after, alternating
    opened = [(lab, cls(module, obj(), [(x, y)])) for lab, cls, obj in engines]
    for _, e in opened:
        e.__enter__()
    try:
        eng0 = opened[0][1]
        for what, names in (("whole model", eng0.names), ("block", block)):
            v = torch.randn(eng0.layout(names).numel, generator=torch.Generator().manual_seed(0))
            inner = 20 if v.numel() < 200_000 and "GPT-2" not in title else 1
            results = {lab: [] for lab, _ in opened}
            grads = []
            for _ in range(3):  # alternate to share the machine's load fairly
                grads.append(cpu_ms(eng0.gradient, repeats, inner))
                for lab, e in opened:
                    results[lab].append(
                        cpu_ms(lambda e=e, n=names, v=v: e.hvp(n, n, v), repeats, inner)
                    )
            g = statistics.median(grads)
            hv = {lab: opened_e.hvp(names, names, v) for lab, opened_e in opened}
            same = all(torch.equal(hv["after"], t) for t in hv.values())
            mems = {lab: memory(lambda e=e, n=names, v=v: e.hvp(n, n, v)) for lab, e in opened}
            gm = memory(eng0.gradient)
            print(f"### {what}: gradient {g:.3f} ms, peak {gm[0]:.2f} MiB, alloc {gm[1]:.2f} MiB")
            for lab, _ in opened:
                ms = statistics.median(results[lab])
                pk, al = mems[lab]
                print(
                    f"hvp cached {lab:7s} {ms:9.3f} ms  {ms / g:.3f}x gradient  "
                    f"peak {pk:7.2f} MiB ({pk / max(gm[0], 1e-9):.2f}x)  alloc {al:7.2f} MiB"
                )
            print(f"products bit-identical before/after: {same}")
    finally:
        for _, e in opened:
            e.__exit__(None, None, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="git revision of the 'before' operator")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--only", choices=["gpt2", "example"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    before = None
    if args.before:  # the operator and the objective (the loss the products differentiate)
        before = (
            load_at(args.before, OPERATOR, "operator_before"),
            load_at(args.before, OBJECTIVE, "objective_before"),
        )
    print(
        f"# {torch.__version__}, {torch.get_num_threads()} thread, float32, CPU ms = median "
        f"process time; before = {args.before or '-'}"
    )
    cases = {"example": example_case, "gpt2": gpt2_case}
    for key, make in cases.items():
        if args.only in (None, key):
            run_case(make(), before, args.repeats)


if __name__ == "__main__":
    main()
