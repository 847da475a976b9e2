"""Curvature-engine benchmark on the reference GPT (issue 4, "Performance").

Reference model: 2 pre-LN layers, d_model 64, 4 heads, d_ff 256, seq 32, vocab 100 (~115k
parameters), briefly trained on a Markov-chain language so the weights are a realistic w*;
evaluation batch 64 × 32 tokens. Prints, side by side:

1. one HVP / one gradient (median wall times): our cached-graph product (second backward only),
   a full double backward per product, and curvlinops' matvec when it is importable;
2. time to λ_max and λ_min of every default block to ``--tol`` relative accuracy: our Lanczos,
   hessian-eigenthings' Lanczos per block and curvlinops + scipy ``eigsh`` per block (when
   importable), with each method's worst relative error against a float64 reference computed
   by our engine at tolerance 1e-9 (``--reference-tol``); error scale max(|λ|, 1e-3·‖H_B‖),
   as certified.

The peers are optional: install them in a separate venv with a constraints file pinning torch
(curvature-pitfalls §12), e.g. ``.bench-venv``. A timing is never an assertion here.

    python benchmarks/bench_curvature.py [--device cpu|cuda] [--precision float32|float64]
        [--tol 1e-6] [--threads N] [--no-reference] [--peers eigenthings,curvlinops]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.curvature.blocks import default_blocks
from workers.curvature.device import configure_cuda_for_curvature, pinned_blas_threads
from workers.curvature.example import markov_chain, sample_sequences
from workers.curvature.hvp import CurvatureEngine
from workers.curvature.model import build_model
from workers.curvature.objective import dataset_loss, objective_for
from workers.curvature.spectra import block_spectrum

REFERENCE_SPEC = {
    "d_model": 64,
    "n_heads": 4,
    "d_ff": 256,
    "n_layers": 2,
    "norm": "layernorm",
    "norm_position": "pre",
    "activation": "gelu",
    "positional": "learned",
    "task": {"type": "causal_lm", "vocab_size": 100, "seq_len": 32},
}


def reference_problem(train_steps: int, seed: int = 0):
    """The reference GPT trained ``train_steps`` Adam steps, and a 64 × 32 evaluation batch."""
    gen = torch.Generator().manual_seed(seed)
    trans, pi = markov_chain(100, gen)
    model = build_model(REFERENCE_SPEC, seed=seed)
    model.train()
    objective = objective_for(REFERENCE_SPEC)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(train_steps):
        seq = sample_sequences(trans, pi, 32, 32, gen)
        loss = dataset_loss(objective, model, seq[:, :-1], seq[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    seq = sample_sequences(trans, pi, 64, 32, gen)
    return model, objective, seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def median_ms(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def rel_err(value: float, ref: float, norm: float) -> float:
    return abs(value - ref) / max(abs(ref), 1e-3 * norm, 1e-300)


# -- ours ------------------------------------------------------------------------------------
def ours_ratio(model, objective, x, y, repeats, sync) -> dict:
    out = {}
    with CurvatureEngine(model, objective, [(x, y)]) as eng:
        names = eng.names
        v = torch.randn(eng.layout(names).numel, device=x.device, dtype=eng.dtype)
        out["gradient_ms"] = median_ms(eng.gradient, repeats, sync)
        out["hvp_cached_ms"] = median_ms(lambda: eng.hvp(names, names, v), repeats, sync)
    with CurvatureEngine(model, objective, [(x, y)], cache_graph=False) as eng:
        out["hvp_double_backward_ms"] = median_ms(lambda: eng.hvp(names, names, v), repeats, sync)
    return out


def ours_spectra(model, objective, x, y, blocks, tol, max_iter, sync) -> dict:
    gen = torch.Generator().manual_seed(0)
    values = {}
    products = 0
    converged = 0
    start = time.perf_counter()
    with CurvatureEngine(model, objective, [(x, y)]) as eng:
        for name, members in blocks.items():
            s = block_spectrum(eng, members, generator=gen, tol=tol, max_iter=max_iter)
            values[name] = (s.lambda_max, s.lambda_min)
            products += s.n_products
            converged += int(s.converged)
    sync()
    return {
        "seconds": time.perf_counter() - start,
        "products": products,
        "converged": f"{converged}/{len(blocks)}",
        "values": values,
    }


# -- peers -----------------------------------------------------------------------------------
class _FlatLM(torch.nn.Module):
    """The model with (N·T, V) logits, for libraries that expect a classification-shaped loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        return logits.reshape(-1, logits.shape[-1])


def _call(fn, *args, **kwargs):
    """Call with only the keyword arguments ``fn`` accepts (peer APIs differ by version)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


def peer_eigenthings(model, x, y, blocks, tol, max_iter, sync) -> dict:
    import hessian_eigenthings as he

    flat = _FlatLM(model).eval()
    loader = [(x, y.reshape(-1))]
    loss_fn = torch.nn.functional.cross_entropy
    values = {}
    start = time.perf_counter()
    for name, members in blocks.items():
        patterns = [f"model.{m}" for m in members]
        op = _call(he.HessianOperator, flat, loader, loss_fn, param_filter=patterns)
        ends = []
        for which in ("LA", "SA"):
            res = _call(
                he.lanczos,
                op,
                k=1,
                which=which,
                max_iter=max_iter,
                max_steps=max_iter,
                tol=tol,
                seed=0,
            )
            vals = getattr(res, "eigenvalues", res[0] if isinstance(res, tuple) else res)
            ends.append(float(torch.as_tensor(vals).reshape(-1)[0]))
        values[name] = (ends[0], ends[1])
    sync()
    return {"seconds": time.perf_counter() - start, "values": values, "products": None}


def peer_curvlinops(model, x, y, blocks, tol, max_iter, sync) -> dict:
    from curvlinops import HessianLinearOperator
    from scipy.sparse.linalg import eigsh

    flat = _FlatLM(model).eval()
    data = [(x, y.reshape(-1))]
    loss = torch.nn.CrossEntropyLoss(reduction="mean")
    named = dict(flat.named_parameters())
    values = {}
    start = time.perf_counter()
    for name, members in blocks.items():
        params = [named[f"model.{m}"] for m in members]
        op = _call(
            HessianLinearOperator,
            flat,
            loss,
            params,
            data,
            progressbar=False,
            check_deterministic=False,
        )
        lin = op.to_scipy() if hasattr(op, "to_scipy") else op
        with pinned_blas_threads(1):
            la = eigsh(lin, k=1, which="LA", tol=tol, maxiter=max_iter, return_eigenvectors=False)
            sa = eigsh(lin, k=1, which="SA", tol=tol, maxiter=max_iter, return_eigenvectors=False)
        values[name] = (float(la[0]), float(sa[0]))
    sync()
    return {"seconds": time.perf_counter() - start, "values": values, "products": None}


def curvlinops_ratio(model, x, y, repeats, sync) -> float | None:
    try:
        from curvlinops import HessianLinearOperator
    except ImportError:
        return None
    flat = _FlatLM(model).eval()
    params = [p for p in flat.parameters()]
    op = _call(
        HessianLinearOperator,
        flat,
        torch.nn.CrossEntropyLoss(),
        params,
        [(x, y.reshape(-1))],
        progressbar=False,
        check_deterministic=False,
    )
    v = torch.randn(sum(p.numel() for p in params), device=x.device)
    return median_ms(lambda: op @ v, repeats, sync)


PEERS = {"eigenthings": peer_eigenthings, "curvlinops": peer_curvlinops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="float32", choices=["float32", "float64"])
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--max-iter", type=int, default=400)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: keep)")
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--reference-tol", type=float, default=1e-9)
    parser.add_argument(
        "--reference-cache", type=Path, default=None, help="reuse/store the float64 reference"
    )
    parser.add_argument("--peers", default="eigenthings,curvlinops")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.float64 if args.precision == "float64" else torch.float32
    if device.type == "cuda":
        configure_cuda_for_curvature()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    model, objective, x, y = reference_problem(args.train_steps)
    model = model.to(device, dtype)
    x, y = x.to(device), y.to(device)
    blocks = default_blocks(model)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"reference GPT: {n_params} parameters, {len(blocks)} blocks, batch {tuple(x.shape)}, "
        f"{device} {args.precision}, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    report: dict = {"n_parameters": n_params, "device": str(device), "precision": args.precision}

    ratio = ours_ratio(model, objective, x, y, args.repeats, sync)
    g = ratio["gradient_ms"]
    print("\n== one HVP / one gradient (median ms) ==")
    print(f"gradient                              {g:8.1f} ms   1.00")
    print(
        f"ours: HVP on the cached graph         {ratio['hvp_cached_ms']:8.1f} ms   "
        f"{ratio['hvp_cached_ms'] / g:.2f}  (goal <= 2.5)"
    )
    print(
        f"ours: full double backward per HVP    {ratio['hvp_double_backward_ms']:8.1f} ms   "
        f"{ratio['hvp_double_backward_ms'] / g:.2f}"
    )
    cl = None
    if "curvlinops" in args.peers:
        try:
            cl = curvlinops_ratio(model, x, y, args.repeats, sync)
        except Exception as exc:  # a peer's API drift must not hide our figures
            print(f"curvlinops matvec: failed ({type(exc).__name__}: {exc})")
    if cl is not None:
        print(f"curvlinops HessianLinearOperator @ v  {cl:8.1f} ms   {cl / g:.2f}")
    report["ratio"] = {**ratio, "curvlinops_ms": cl}

    reference = None
    if args.reference_cache is not None and args.reference_cache.is_file():
        reference = {k: tuple(v) for k, v in json.loads(args.reference_cache.read_text()).items()}
    elif not args.no_reference:
        t0 = time.perf_counter()
        ref_model = model.to(torch.float64)
        reference = ours_spectra(
            ref_model, objective, x, y, blocks, args.reference_tol, 1000, sync
        )["values"]
        model = model.to(dtype)
        print(
            f"\n(float64 reference spectra at tol {args.reference_tol:g}: "
            f"{time.perf_counter() - t0:.1f} s)"
        )
        if args.reference_cache is not None:
            args.reference_cache.write_text(json.dumps(reference))

    print(f"\n== lambda_max and lambda_min of all {len(blocks)} blocks to tol {args.tol:g} ==")
    results = {"ours": ours_spectra(model, objective, x, y, blocks, args.tol, args.max_iter, sync)}
    for peer in [p for p in args.peers.split(",") if p]:
        try:
            results[peer] = PEERS[peer](model, x, y, blocks, args.tol, args.max_iter, sync)
        except ImportError:
            print(f"{peer}: not importable here (install it in the benchmark venv)")
        except Exception as exc:
            print(f"{peer}: failed ({type(exc).__name__}: {exc})")
    print(f"{'method':<14}{'seconds':>10}{'products':>10}{'max rel err':>14}{'within tol':>12}")
    for method, res in results.items():
        worst, ok = float("nan"), "-"
        if reference is not None:
            errs = []
            for name, (lmax, lmin) in res["values"].items():
                rmax, rmin = reference[name]
                norm = max(abs(rmax), abs(rmin))
                pair = [rel_err(lmax, rmax, norm), rel_err(lmin, rmin, norm)]
                errs += pair
                ends = zip(("max", "min"), pair, (lmax, lmin), (rmax, rmin), strict=True)
                for end, err, got, want in ends:
                    if err > args.tol:
                        print(
                            f"  {method} {name} lambda_{end}: {got:.9g} vs {want:.9g} ({err:.1e})"
                        )
            worst = max(errs)
            ok = f"{sum(e <= args.tol for e in errs)}/{len(errs)}"
        prods = res.get("products")
        print(
            f"{method:<14}{res['seconds']:10.2f}{prods if prods is not None else '-':>10}"
            f"{worst:14.2e}{ok:>12}"
        )
        res["max_rel_err"] = worst if math.isfinite(worst) else None
    peers = [r["seconds"] for m, r in results.items() if m != "ours"]
    if peers:
        speedup = min(peers) / results["ours"]["seconds"]
        print(f"speed-up vs the faster peer: {speedup:.2f}x (goal >= 3)")
    report["spectra"] = {
        m: {k: v for k, v in r.items() if k != "values"} for m, r in results.items()
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
