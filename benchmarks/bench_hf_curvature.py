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
    """Median process-CPU ms of ``fn`` (CPU time: other load on a shared machine counts less;
    with ``--threads 1`` it is the work of the one thread)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
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


def _ends_of(tridiag) -> tuple[float, float]:
    """λ_max and λ_min of a Lanczos tridiagonal (its extreme Ritz values)."""
    m = tridiag.alphas.shape[0]
    t = torch.diag(tridiag.alphas.double())
    if m > 1:
        off = tridiag.betas[: m - 1].double()
        t += torch.diag(off, 1) + torch.diag(off, -1)
    theta = torch.linalg.eigvalsh(t)
    return float(theta[-1]), float(theta[0])


def _end_error(value: float, ref: float, norm: float) -> float:
    return abs(value - ref) / max(abs(ref), 1e-3 * norm)


def peer_one_run(module, x, y, blocks, reference, tol, method, cap, global_count) -> dict:
    """hessian-eigenthings 1.0.0a5 at its best: BOTH ends from ONE Lanczos run
    (``lanczos_tridiagonal``, public, then the extreme Ritz values: what ``lanczos(k=m)``
    returns without accumulating m Ritz vectors), products by ``method`` ("autograd" or
    "finite_difference", its own ``fd_eps``), at the EXACT fewest steps that reach ``tol``
    on both ends of every block.

    The step count is found per block by an oracle (the peer has no stop test): search runs
    of 16, 32, 64, … (at most ``cap``) steps with full reorthogonalisation, whose every
    prefix m is exactly the m-step run's tridiagonal; the fewest m with both ends within
    ``tol`` of the float64 reference. Then a fresh timed run at that m with the library's
    defaults (reorthogonalised up to 50 steps); if it misses (no reorthogonalisation above
    50), m grows by 5 % until it reaches. Only the timed run's process CPU seconds count.
    With ``global_count`` the same peer also runs ONE step count for every block (the largest
    per-block count: how a user runs it), timed the same way."""
    import hessian_eigenthings as he
    from bench_curvature import _FlatLM

    flat = _FlatLM(module).eval()
    loader = [(x, y.reshape(-1))]
    loss_fn = he.supervised_loss(torch.nn.functional.cross_entropy)
    rows, ops = {}, {}
    for name, members in blocks.items():
        wanted = [f"model.{m}" for m in members]
        op = he.HessianOperator(
            flat, loader, loss_fn, param_filter=he.match_names(*wanted), method=method
        )
        ref_hi, ref_lo = reference[name]
        norm = max(abs(ref_hi), abs(ref_lo))
        gen = torch.Generator().manual_seed(0)
        v0 = torch.randn(op.size, dtype=op.dtype, generator=gen)
        limit = min(cap, op.size - 1)
        fewest, cap_try = None, min(16, limit)
        while fewest is None:  # search runs of 16, 32, 64, … steps until both ends reach
            search = he.lanczos_tridiagonal(op, v0, cap_try, reorthogonalize=True)
            for m in range(1, search.iterations + 1):
                sub = type(search)(
                    alphas=search.alphas[:m],
                    betas=search.betas[: m - 1],
                    basis=[],
                    last_beta=0.0,
                    iterations=m,
                )
                hi, lo = _ends_of(sub)
                if max(_end_error(hi, ref_hi, norm), _end_error(lo, ref_lo, norm)) <= tol:
                    fewest = m
                    break
            if cap_try >= limit:
                break
            cap_try = min(limit, 2 * cap_try)
        m = fewest or limit
        while True:
            c0 = time.process_time()
            td = he.lanczos_tridiagonal(op, v0, m, reorthogonalize=m <= 50)
            hi, lo = _ends_of(td)
            cpu = time.process_time() - c0
            err = max(_end_error(hi, ref_hi, norm), _end_error(lo, ref_lo, norm))
            if err <= tol or m >= limit:
                break
            m = min(limit, max(m + 1, math.ceil(m * 1.05)))
        rows[name] = {
            "fewest_search": fewest,
            "steps": m,
            "cpu_seconds": cpu,
            "values": (hi, lo),
            "error": err,
            "reached": err <= tol,
        }
        ops[name] = (op, v0, limit, norm)
    out = {
        "seconds": sum(r["cpu_seconds"] for r in rows.values()),
        "cpu_seconds": sum(r["cpu_seconds"] for r in rows.values()),
        "products": sum(r["steps"] for r in rows.values()),
        "values": {k: r["values"] for k, r in rows.items()},
        "block_seconds": {k: r["cpu_seconds"] for k, r in rows.items()},
        "converged": f"{sum(r['reached'] for r in rows.values())}/{len(rows)} blocks reached",
        "rows": rows,
        "fewest_products": sum((r["fewest_search"] or 0) for r in rows.values()),
        "all_reached": all(r["reached"] for r in rows.values()),
    }
    if global_count:
        steps = max(r["steps"] for r in rows.values())
        cpu_total, products, worst = 0.0, 0, 0.0
        for name, (op, v0, limit, norm) in ops.items():
            m = min(steps, limit)
            if m == rows[name]["steps"]:
                cpu_total += rows[name]["cpu_seconds"]
                worst = max(worst, rows[name]["error"])
            else:
                c0 = time.process_time()
                td = he.lanczos_tridiagonal(op, v0, m, reorthogonalize=m <= 50)
                hi, lo = _ends_of(td)
                cpu_total += time.process_time() - c0
                ref_hi, ref_lo = reference[name]
                worst = max(worst, _end_error(hi, ref_hi, norm), _end_error(lo, ref_lo, norm))
            products += m
        out["global"] = {
            "steps": steps,
            "cpu_seconds": cpu_total,
            "products": products,
            "worst_error": worst,
        }
    return out


def peer_curvlinops_both_ends(module, x, y, blocks, tol) -> dict:
    """curvlinops 3.0.1 ``HessianLinearOperator`` (the block's parameters, the same batch) as
    a scipy operator, and ONE ARPACK run for both ends: ``eigsh(k=2, which="BE")`` (scipy's
    documented "half from each end"), ARPACK ``tol`` = ``tol`` (relative accuracy of the
    Ritz values), a seeded start vector, only the BLAS pools pinned to one thread. Products
    counted by a wrapper; process CPU seconds."""
    import numpy as np
    from bench_curvature import _FlatLM, _peer_blas_pinned
    from curvlinops import HessianLinearOperator
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    flat = _FlatLM(module).eval()
    data = [(x, y.reshape(-1))]
    loss = torch.nn.CrossEntropyLoss(reduction="mean")
    named = dict(flat.named_parameters())
    values, secs, prods = {}, {}, {}
    counter = [0]
    converged = 0
    cpu0 = time.process_time()
    for name, members in blocks.items():
        c0 = time.process_time()
        before = counter[0]
        params = [named[f"model.{m}"] for m in members]
        lin = HessianLinearOperator(
            flat, loss, params, data, progressbar=False, check_deterministic=False
        ).to_scipy()

        def counted(v, lin=lin):
            counter[0] += 1 if v.ndim == 1 or v.shape[1] == 1 else v.shape[1]
            return lin.matvec(v)

        op = LinearOperator(lin.shape, matvec=counted, dtype=lin.dtype)
        v0 = np.random.default_rng(0).standard_normal(lin.shape[0])
        with _peer_blas_pinned():
            try:
                got = eigsh(op, k=2, which="BE", tol=tol, v0=v0, return_eigenvectors=False)
                converged += 1
            except ArpackNoConvergence as exc:
                got = exc.eigenvalues if len(exc.eigenvalues) else [float("nan")]
        values[name] = (float(max(got)), float(min(got)))
        secs[name] = time.process_time() - c0
        prods[name] = counter[0] - before
    cpu = time.process_time() - cpu0
    return {
        "seconds": cpu,
        "cpu_seconds": cpu,
        "products": counter[0],
        "values": values,
        "block_seconds": secs,
        "block_products": prods,
        "converged": f"{converged}/{len(blocks)} blocks",
    }


def worst_error(values: dict, reference: dict) -> float:
    worst = 0.0
    for name, (lmax, lmin) in values.items():
        rmax, rmin = reference[name]
        scale = max(abs(rmax), abs(rmin))
        for got, want in ((lmax, rmax), (lmin, rmin)):
            err = abs(got - want) / max(abs(want), 1e-3 * scale, 1e-300)
            worst = max(worst, err if math.isfinite(got) else math.inf)
    return worst


def fair_peers(module, x, y, blocks, tol, reference, results, args) -> None:
    """The fair protocol: every peer setting at its best, process CPU seconds (same process,
    same thread count) against ours; the printed ratio is against the fastest setting whose
    worst error meets ``tol``."""
    ours_res = results["ours"]
    ours_cpu = ours_res["cpu_seconds"]
    ours_err = worst_error(ours_res["values"], reference)
    rows = []
    try:
        import hessian_eigenthings  # noqa: F401

        for method in ("autograd", "finite_difference"):
            res = peer_one_run(module, x, y, blocks, reference, tol, method, args.peer_cap, True)
            results[f"eigenthings-{method}"] = res
            rows.append((f"eigenthings one run, {method}, exact steps per block", res))
            print(f"# {method} done: {res['cpu_seconds']:.1f} CPU s, {res['products']} products")
            g = res["global"]
            rows.append(
                (
                    f"eigenthings one run, {method}, one count ({g['steps']}) for all",
                    {
                        "cpu_seconds": g["cpu_seconds"],
                        "products": g["products"],
                        "error": g["worst_error"],
                    },
                )
            )
    except ImportError:
        print("# hessian-eigenthings absent")
    if not args.no_curvlinops:
        try:
            res = peer_curvlinops_both_ends(module, x, y, blocks, tol)
            results["curvlinops"] = res
            rows.append(("curvlinops eigsh(k=2, which='BE'), one run", res))
        except ImportError:
            print("# curvlinops absent")
    print(f"{'method':<58}{'CPU s':>8}{'products':>9}{'worst err':>11}{'peer/ours':>10}")
    print(
        f"{'ours (block_spectrum, tol ' + format(tol, 'g') + ')':<58}{ours_cpu:8.1f}"
        f"{ours_res['products']:9d}{ours_err:11.1e}{1.0:9.2f}x"
    )
    fastest = None
    for label, res in rows:
        err = res.get("error")
        if err is None:
            err = worst_error(res["values"], reference)
        cpu = res["cpu_seconds"]
        ok = err <= tol
        print(
            f"{label:<58}{cpu:8.1f}{res['products']:9d}{err:11.1e}{cpu / ours_cpu:9.2f}x"
            + ("" if ok else "  (misses tol)")
        )
        if ok and (fastest is None or cpu < fastest[1]):
            fastest = (label, cpu)
    if fastest is not None:
        print(
            f"FAIR RATIO (fastest peer setting meeting tol {tol:g}: {fastest[0]}): "
            f"{fastest[1] / ours_cpu:.2f}x (CPU s {fastest[1]:.1f} / ours {ours_cpu:.1f})"
        )
    auto = results.get("eigenthings-autograd")
    if auto is not None and auto["fewest_products"]:
        print(
            f"products: ours {ours_res['products']} vs {auto['fewest_products']} the fewest "
            f"one Krylov run (fully reorthogonalised, exact prefix) needs to reach tol on both "
            f"ends of every block ({ours_res['products'] / auto['fewest_products']:.2f}x)"
        )
        print(
            "steps per block (search fewest / timed autograd / timed finite-difference): "
            + ", ".join(
                f"{b} {r['fewest_search']}/{r['steps']}/"
                f"{results['eigenthings-finite_difference']['rows'][b]['steps']}"
                for b, r in auto["rows"].items()
            )
        )


def legacy_peer(module, x, y, blocks, tol, reference, results, args, steps) -> None:
    """The protocols before the fair one (--peer-protocol equal-accuracy / fixed)."""
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
                + ", ".join(f"{b} {e[0]['steps']}/{e[1]['steps']}" for b, e in peer["ends"].items())
            )


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
        choices=["fair", "equal-accuracy", "fixed"],
        default="fair",
        help="fair: every peer setting at its best (hessian-eigenthings both ends "
        "from one run, autograd and finite-difference products, exact fewest steps per block; "
        "curvlinops eigsh both ends in one run), process CPU seconds against ours, the ratio "
        "against the fastest setting reaching the tolerance; equal-accuracy: the older "
        "bench_lockstep.peer_ladder (separate LA/SA runs on a 10/20/40 ladder); fixed: "
        "--peer-steps32/64 steps for every end",
    )
    ap.add_argument("--peer-cap", type=int, default=300, help="the fair search's step cap")
    ap.add_argument("--no-curvlinops", action="store_true", help="fair: skip curvlinops")
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
        if args.peer_protocol == "fair":
            fair_peers(module, x, y, blocks, tol, reference, results, args)
        else:
            legacy_peer(module, x, y, blocks, tol, reference, results, args, steps)
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
