"""Curvature operator on a Hugging Face GPT-2 of about 1.4 M parameters, against
hessian-eigenthings, side by side in one run (CPU by default).

Model: ``GPT2LMHeadModel`` (n_embd 128, 4 layers, 4 heads, vocabulary 4096, 64 positions,
eager attention), briefly trained on the Markov-chain language of ``curvplan example``;
evaluation batch 16 × 64 tokens. Both sides differentiate the SAME loss: the mean token
cross-entropy computed from the logits in the model's dtype (the model's own ``labels=`` loss
upcasts the logits to float32, which would cap a float64 run at float32 accuracy).

For float32 at ``--tol32`` (1e-3) and float64 at ``--tol64`` (1e-6) it prints:

1. one gradient, one HVP (ours: graph cached = second backward only, and a full double
   backward), one hessian-eigenthings matvec: median ms, and the HVP/gradient ratios;
2. the memory of one HVP relative to one gradient: peak CUDA memory on a GPU; on a CPU the
   bytes autograd saves for the backward passes (the graph, which dominates the peak);
3. time and products to λ_max and λ_min of every block — ours (uniform blocks; GPT-2's q/k/v
   are column slices of c_attn) and hessian-eigenthings (whole tensors only, so q/k/v are
   measured as one fused ``qkv`` block by both sides for the head-to-head) — with each side's
   worst relative error against a float64 reference of ours at ``--reference-tol``.

    .bench-venv/bin/python benchmarks/bench_hf_curvature.py [--max-blocks N] [--threads N]

The peer is optional (``benchmarks/setup_peers.sh``); without it only our figures print.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch


def _hide_broken_torchvision() -> None:
    """The peer venv's torchvision (pulled in by curvlinops' backpack) may not match the pinned
    torch; transformers would then fail to import GPT-2. Nothing here uses torchvision."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules["torchvision"] = None  # find_spec → None: transformers skips it


_hide_broken_torchvision()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_curvature import peer_eigenthings  # noqa: E402

from curvplan_worker.curvature import hf  # noqa: E402
from curvplan_worker.curvature.example import markov_chain, sample_sequences  # noqa: E402
from curvplan_worker.curvature.objective import CausalLMObjective  # noqa: E402
from curvplan_worker.curvature.operator import CurvatureEngine  # noqa: E402
from curvplan_worker.curvature.spectra import block_spectrum  # noqa: E402

CONFIG = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "vocab_size": 4096,
    "n_positions": 64,
    "n_embd": 128,
    "n_layer": 4,
    "n_head": 4,
    "activation_function": "gelu_new",
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def problem(train_steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    trans, pi = markov_chain(CONFIG["vocab_size"], gen, concentration=0.02)
    model = hf.build_hf_model(CONFIG, seed=seed)
    module = model.module
    module.train()
    objective = CausalLMObjective()
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    for _ in range(train_steps):
        x, y = hf.pack_causal_lm(sample_sequences(trans, pi, 16, 63, gen))
        sums, counts = objective.example_losses(module, x, y)
        opt.zero_grad(set_to_none=True)
        (sums.sum() / counts.sum()).backward()
        opt.step()
    module.eval()
    x, y = hf.pack_causal_lm(sample_sequences(trans, pi, 16, 63, gen))
    return model, x, y


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


class _SavedBytes:
    """Bytes autograd saves for backward while active (CPU stand-in for peak memory)."""

    def __init__(self) -> None:
        self.total = 0

    def __enter__(self):
        def pack(t):
            self.total += t.numel() * t.element_size()
            return t

        self._ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def ratios(module, x, y, repeats: int) -> dict:
    out = {}
    objective = CausalLMObjective()
    with CurvatureEngine(module, objective, [(x, y)]) as eng:
        names = eng.names
        v = torch.randn(eng.layout(names).numel, dtype=eng.dtype)
        out["gradient_ms"] = median_ms(eng.gradient, repeats)
        out["hvp_cached_ms"] = median_ms(lambda: eng.hvp(names, names, v), repeats)
    with CurvatureEngine(module, objective, [(x, y)], cache_graph=False) as eng:
        out["hvp_double_backward_ms"] = median_ms(lambda: eng.hvp(names, names, v), repeats)
        with _SavedBytes() as grad_bytes:
            eng.gradient()
        with _SavedBytes() as hvp_bytes:
            eng.hvp(names, names, v)
        out["memory_ratio"] = hvp_bytes.total / max(grad_bytes.total, 1)
        out["gradient_saved_mib"] = grad_bytes.total / 2**20
        out["hvp_saved_mib"] = hvp_bytes.total / 2**20
    try:
        import hessian_eigenthings as he
        from bench_curvature import _FlatLM

        flat = _FlatLM(module).eval()
        op = he.HessianOperator(
            flat, [(x, y.reshape(-1))], he.supervised_loss(torch.nn.functional.cross_entropy)
        )
        w = torch.randn(op.size, dtype=op.dtype)
        out["eigenthings_matvec_ms"] = median_ms(lambda: op.matvec(w), repeats)
    except ImportError:
        out["eigenthings_matvec_ms"] = None
    return out


def head_to_head_blocks(module) -> dict[str, list[str]]:
    """Uniform blocks with q, k, v merged into the whole c_attn (the peer's granularity)."""
    blocks = hf.uniform_blocks(module, "gpt2")
    out: dict[str, list[str]] = {}
    for name, members in blocks.items():
        if name.endswith((".k", ".v")):
            continue
        if name.endswith(".q"):
            layer = name[: -len(".q")]
            out[f"{layer}.qkv"] = list(dict.fromkeys(m.split("[")[0] for m in members))
            continue
        out[name] = members
    return out


def ours(module, x, y, blocks, tol, max_iter) -> dict:
    gen = torch.Generator().manual_seed(0)
    values, secs, prods = {}, {}, {}
    converged = 0
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    with CurvatureEngine(module, CausalLMObjective(), [(x, y)]) as eng:
        for name, members in blocks.items():
            t0 = time.perf_counter()
            s = block_spectrum(eng, members, generator=gen, tol=tol, max_iter=max_iter)
            secs[name] = time.perf_counter() - t0
            values[name] = (s.lambda_max, s.lambda_min)
            prods[name] = s.n_products
            converged += int(s.converged)
    return {
        "seconds": time.perf_counter() - t_start,
        "cpu_seconds": time.process_time() - cpu_start,
        "values": values,
        "block_seconds": secs,
        "block_products": prods,
        "products": sum(prods.values()),
        "converged": f"{converged}/{len(blocks)} blocks",
    }


def equal_accuracy_peer(module, x, y, blocks, tol, ours_result, reference) -> dict:
    """hessian-eigenthings at equal accuracy (``bench_lockstep.peer_ladder``): per block and
    end, the fewest ladder steps within our error of the reference, or within ``tol``."""
    from bench_lockstep import peer_ladder, peer_targets

    targets = peer_targets(ours_result["values"], {"values": reference}, tol)
    return peer_ladder(module, x, y, blocks, targets, tol, 320)


def worst_error(values: dict, reference: dict) -> float:
    worst = 0.0
    for name, (lmax, lmin) in values.items():
        rmax, rmin = reference[name]
        scale = max(abs(rmax), abs(rmin))
        for got, want in ((lmax, rmax), (lmin, rmin)):
            err = abs(got - want) / max(abs(want), 1e-3 * scale, 1e-300)
            worst = max(worst, err if math.isfinite(got) else math.inf)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tol32", type=float, default=1e-3)
    ap.add_argument("--tol64", type=float, default=1e-6)
    ap.add_argument("--reference-tol", type=float, default=1e-8)
    ap.add_argument("--max-iter", type=int, default=300)
    ap.add_argument("--peer-steps32", type=int, default=40, help="peer Lanczos steps (fixed)")
    ap.add_argument("--peer-steps64", type=int, default=80)
    ap.add_argument(
        "--peer-protocol",
        choices=["equal-accuracy", "fixed"],
        default="equal-accuracy",
        help="equal-accuracy: bench_lockstep.peer_ladder (per block and end, the fewest ladder "
        "steps reaching our error or the tolerance; and one step count for all); fixed: "
        "--peer-steps32/64 steps for every end",
    )
    ap.add_argument("--skip-float64", action="store_true", help="only the float32 part")
    ap.add_argument("--max-blocks", type=int, default=0, help="first N head-to-head blocks")
    ap.add_argument("--blocks", default="", help="comma-separated fnmatch patterns of blocks")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, x, y = problem(args.train_steps)
    n_params = sum(p.numel() for p in model.module.parameters())
    print(
        f"# GPT-2 (HF) {n_params / 1e6:.2f} M parameters, batch {x.shape[0]}×{x.shape[-1]}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    try:
        from importlib.metadata import version

        print(f"# hessian-eigenthings {version('hessian-eigenthings')}")
    except Exception:
        print("# hessian-eigenthings absent: only our figures")
    blocks = head_to_head_blocks(model.module)
    if args.blocks:
        import fnmatch

        pats = args.blocks.split(",")
        blocks = {b: m for b, m in blocks.items() if any(fnmatch.fnmatch(b, p) for p in pats)}
    if args.max_blocks:
        blocks = dict(list(blocks.items())[: args.max_blocks])
    print(f"# {len(blocks)} head-to-head blocks: {', '.join(blocks)}")
    module64 = model.module.double()
    x64, y64 = x, y
    t0 = time.perf_counter()
    reference = ours(module64, x64, y64, blocks, args.reference_tol, 1000)["values"]
    print(f"# float64 reference at tol {args.reference_tol:g}: {time.perf_counter() - t0:.0f} s")
    parts = [(torch.float32, args.tol32, args.peer_steps32)]
    if not args.skip_float64:
        parts.append((torch.float64, args.tol64, args.peer_steps64))
    for dtype, tol, steps in parts:
        module = model.module.to(dtype)
        r = ratios(module, x, y, args.repeats)
        name = str(dtype).replace("torch.", "")
        print(f"\n## {name}, tol {tol:g}")
        print(
            f"gradient {r['gradient_ms']:.1f} ms | HVP cached {r['hvp_cached_ms']:.1f} ms "
            f"({r['hvp_cached_ms'] / r['gradient_ms']:.2f}× gradient) | HVP double backward "
            f"{r['hvp_double_backward_ms']:.1f} ms "
            f"({r['hvp_double_backward_ms'] / r['gradient_ms']:.2f}×)"
            + (
                f" | eigenthings matvec {r['eigenthings_matvec_ms']:.1f} ms "
                f"({r['eigenthings_matvec_ms'] / r['gradient_ms']:.2f}×)"
                if r["eigenthings_matvec_ms"]
                else ""
            )
        )
        print(
            f"memory: one HVP saves {r['hvp_saved_mib']:.1f} MiB for backward vs "
            f"{r['gradient_saved_mib']:.1f} MiB for one gradient ({r['memory_ratio']:.2f}×)"
        )
        results = {"ours": ours(module, x, y, blocks, tol, args.max_iter)}
        try:
            import hessian_eigenthings  # noqa: F401

            if args.peer_protocol == "fixed":
                results["eigenthings"] = peer_eigenthings(
                    module, x, y, blocks, tol, steps, lambda: None
                )
            else:
                results["eigenthings"] = equal_accuracy_peer(
                    module, x, y, blocks, tol, results["ours"], reference
                )
        except ImportError:
            pass
        for method, res in results.items():
            err = worst_error(res["values"], reference)
            print(
                f"{method:<12} {res['seconds']:8.1f} s  {res['products']:6d} products  "
                f"worst rel. error {err:.1e}  converged {res['converged']}"
            )
        if "eigenthings" in results:
            peer = results["eigenthings"]
            print(
                f"speed-up over hessian-eigenthings: "
                f"{peer['seconds'] / results['ours']['seconds']:.2f}×"
            )
            if "global_cpu_seconds" in peer:
                ours_cpu = results["ours"]["cpu_seconds"]
                bound = "" if peer["all_reached"] else " (an end not reached at 320: lower bound)"
                print(
                    f"CPU seconds: ours {ours_cpu:.1f}; peer tuned per block by an oracle "
                    f"{peer['cpu_seconds']:.1f} ({peer['cpu_seconds'] / ours_cpu:.2f}×); peer "
                    f"with one step count ({peer['global_steps']}) for every block "
                    f"{peer['global_cpu_seconds']:.1f} "
                    f"({peer['global_cpu_seconds'] / ours_cpu:.2f}×){bound}"
                )
                print(
                    "peer steps (LA, SA) per block: "
                    + ", ".join(
                        f"{b} {e[0]['steps']}/{e[1]['steps']}" for b, e in peer["ends"].items()
                    )
                )
        print(f"{'block':<18}{'n':>9}{'lambda_max':>13}{'lambda_min':>13}  s (ours / peer)")
        for bname in blocks:
            lmax, lmin = results["ours"]["values"][bname]
            peer = results.get("eigenthings", {}).get("block_seconds", {}).get(bname)
            n = sum(
                p.numel()
                for n_, p in module.named_parameters()
                if n_ in {m.split("[")[0] for m in blocks[bname]}
            )
            print(
                f"{bname:<18}{n:>9}{lmax:13.5g}{lmin:13.5g}  "
                f"{results['ours']['block_seconds'][bname]:.1f} / "
                + (f"{peer:.1f}" if peer is not None else "-")
            )


if __name__ == "__main__":
    main()
