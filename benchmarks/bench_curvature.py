"""Curvature-engine benchmark on the reference GPT.

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
(docs/numerics.md#benchmarks), e.g. ``.bench-venv``. A timing is never an assertion here.

    python benchmarks/bench_curvature.py [--device cpu|cuda] [--precision float32|float64]
        [--tol 1e-6] [--threads N] [--no-reference] [--peers eigenthings,curvlinops]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curvplan_worker.curvature.blocks import default_blocks
from curvplan_worker.curvature.device import configure_cuda_for_curvature
from curvplan_worker.curvature.example import markov_chain, sample_sequences
from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import dataset_loss, objective_for
from curvplan_worker.curvature.spectra import block_spectrum

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
    """Our engine: one Lanczos run per block (both ends, explicit residual certification)."""
    gen = torch.Generator().manual_seed(0)
    values = {}
    block_seconds = {}
    block_products = {}
    converged = 0
    start = time.perf_counter()
    with CurvatureEngine(model, objective, [(x, y)]) as eng:
        for name, members in blocks.items():
            t0 = time.perf_counter()
            s = block_spectrum(eng, members, generator=gen, tol=tol, max_iter=max_iter)
            sync()
            block_seconds[name] = time.perf_counter() - t0
            values[name] = (s.lambda_max, s.lambda_min)
            block_products[name] = s.n_products
            converged += int(s.converged)
    sync()
    return {
        "seconds": time.perf_counter() - start,
        "products": sum(block_products.values()),
        "converged": f"{converged}/{len(blocks)} blocks",
        "values": values,
        "block_seconds": block_seconds,
        "block_products": block_products,
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


def _peer_blas_pinned():
    """Pin only the BLAS pools (scipy/numpy OpenBLAS) to one thread around a peer's scipy
    calls (docs/numerics.md#threads). ``pinned_blas_threads`` limits every pool threadpoolctl sees,
    including torch's libgomp, which would run the peer's HVPs inside ``eigsh`` on one
    thread and slow them unfairly."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def peer_eigenthings(model, x, y, blocks, tol, max_iter, sync) -> dict:
    """hessian-eigenthings 1.0.0a5: ``HessianOperator`` restricted to the block by its
    ``param_filter`` (``match_names`` on the exact parameter names), exact double-backward HVPs
    (``method="autograd"``), on the single evaluation batch (so its unweighted batch mean is
    the mean token loss); then its ``lanczos(k=1)`` once with ``which="LA"`` and once with
    ``which="SA"``. Its Lanczos has no early stop: it always runs ``max_iter`` steps (its
    default is min(2k, n-1) = 2, far too few, docs/numerics.md#lanczos), so ``max_iter`` is set to
    min(``max_iter``, n-1); full reorthogonalisation keeps its own default (off above 50 steps).
    ``converged`` is its own residual test |β_m s_m| < tol·|λ|."""
    import hessian_eigenthings as he

    flat = _FlatLM(model).eval()
    loader = [(x, y.reshape(-1))]
    loss_fn = he.supervised_loss(torch.nn.functional.cross_entropy)
    values = {}
    block_seconds = {}
    block_products = {}
    converged = 0
    start = time.perf_counter()
    for name, members in blocks.items():
        t0 = time.perf_counter()
        block_products[name] = 0
        wanted = [f"model.{m}" for m in members]
        op = he.HessianOperator(
            flat, loader, loss_fn, param_filter=he.match_names(*wanted), method="autograd"
        )
        selected = list(op._params)
        if sorted(selected) != sorted(wanted):  # the restriction must be exactly the block
            raise RuntimeError(f"block {name}: param_filter selected {selected}, not {wanted}")
        steps = min(max_iter, op.size - 1)
        ends = []
        for which in ("LA", "SA"):
            res = he.lanczos(op, k=1, which=which, max_iter=steps, tol=tol, seed=0)
            ends.append(float(res.eigenvalues[0]))
            block_products[name] += res.iterations
            converged += int(bool(res.converged[0]))
        sync()
        block_seconds[name] = time.perf_counter() - t0
        values[name] = (ends[0], ends[1])
    sync()
    return {
        "seconds": time.perf_counter() - start,
        "values": values,
        "products": sum(block_products.values()),
        "block_seconds": block_seconds,
        "block_products": block_products,
        "converged": f"{converged}/{2 * len(blocks)} ends",
    }


def peer_curvlinops(model, x, y, blocks, tol, max_iter, sync) -> dict:
    """curvlinops 3.0.1: ``HessianLinearOperator`` on the block's parameters only, on the same
    single batch (its batch weighting N_batch/N_data is then 1), ``to_scipy()``, and scipy
    ``eigsh(k=1, which="LA")`` and ``which="SA"`` with ARPACK's ``tol`` (relative accuracy of
    the Ritz value) and a seeded start vector; only the BLAS pools pinned to one thread.
    ``maxiter`` is ARPACK's restart count (``max_iter``); an ``ArpackNoConvergence`` keeps
    the end as not converged (nan if no Ritz value came back). Products are counted by a
    wrapper around the scipy operator's matvec."""
    import numpy as np
    from curvlinops import HessianLinearOperator
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    flat = _FlatLM(model).eval()
    data = [(x, y.reshape(-1))]
    loss = torch.nn.CrossEntropyLoss(reduction="mean")
    named = dict(flat.named_parameters())
    values = {}
    block_seconds = {}
    block_products = {}
    counter = [0]
    converged = 0
    start = time.perf_counter()
    for name, members in blocks.items():
        t0 = time.perf_counter()
        before = counter[0]
        params = [named[f"model.{m}"] for m in members]
        op = HessianLinearOperator(
            flat, loss, params, data, progressbar=False, check_deterministic=False
        )
        lin = op.to_scipy()

        def counted(v, lin=lin):
            counter[0] += 1 if v.ndim == 1 or v.shape[1] == 1 else v.shape[1]
            return lin.matvec(v)

        counted_op = LinearOperator(lin.shape, matvec=counted, dtype=lin.dtype)
        v0 = np.random.default_rng(0).standard_normal(lin.shape[0])
        ends = []
        with _peer_blas_pinned():
            for which in ("LA", "SA"):
                try:
                    val = eigsh(
                        counted_op,
                        k=1,
                        which=which,
                        tol=tol,
                        maxiter=max_iter,
                        v0=v0,
                        return_eigenvectors=False,
                    )
                    ends.append(float(val[0]))
                    converged += 1
                except ArpackNoConvergence as exc:
                    got = exc.eigenvalues
                    ends.append(float(got[0]) if len(got) else float("nan"))
        sync()
        block_seconds[name] = time.perf_counter() - t0
        block_products[name] = counter[0] - before
        values[name] = (ends[0], ends[1])
    sync()
    return {
        "seconds": time.perf_counter() - start,
        "values": values,
        "products": counter[0],
        "block_seconds": block_seconds,
        "block_products": block_products,
        "converged": f"{converged}/{2 * len(blocks)} ends",
    }


def curvlinops_ratio(model, x, y, repeats, sync) -> float | None:
    """Median ms of one curvlinops ``HessianLinearOperator @ v`` over all parameters."""
    try:
        from curvlinops import HessianLinearOperator
    except ImportError:
        return None
    flat = _FlatLM(model).eval()
    params = list(flat.parameters())
    op = HessianLinearOperator(
        flat,
        torch.nn.CrossEntropyLoss(),
        params,
        [(x, y.reshape(-1))],
        progressbar=False,
        check_deterministic=False,
    )
    v = torch.randn(sum(p.numel() for p in params), device=x.device, dtype=params[0].dtype)
    return median_ms(lambda: op @ v, repeats, sync)


def eigenthings_ratio(model, x, y, repeats, sync) -> float | None:
    """Median ms of one hessian-eigenthings ``HessianOperator.matvec`` over all parameters."""
    try:
        import hessian_eigenthings as he
    except ImportError:
        return None
    flat = _FlatLM(model).eval()
    op = he.HessianOperator(
        flat, [(x, y.reshape(-1))], he.supervised_loss(torch.nn.functional.cross_entropy)
    )
    v = torch.randn(op.size, device=x.device, dtype=op.dtype)
    return median_ms(lambda: op.matvec(v), repeats, sync)


def _fingerprint(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> str:
    """sha256 of the weights and the evaluation batch, so a cached reference is only reused
    for exactly the same problem."""
    import hashlib

    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float64).numpy().tobytes())
    for t in (x, y):
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = [f"torch {torch.__version__}"]
    for dist in ("hessian-eigenthings", "curvlinops-for-pytorch", "scipy", "numpy"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist} absent")
    return ", ".join(out)


def _errors(results: dict, reference: dict | None, tol: float) -> dict | None:
    """Per method and block, the relative errors of (λ_max, λ_min) against the reference,
    on the certified scale max(|λ_ref|, 1e-3·‖H_B‖); a missing value (nan) counts as inf.
    Misses above ``tol`` are printed."""
    if reference is None:
        return None
    out: dict = {}
    for method, res in results.items():
        out[method] = {}
        for name, (lmax, lmin) in res["values"].items():
            rmax, rmin = reference[name]
            norm = max(abs(rmax), abs(rmin))
            pair = tuple(
                rel_err(got, want, norm) if math.isfinite(got) else math.inf
                for got, want in ((lmax, rmax), (lmin, rmin))
            )
            out[method][name] = pair
            for end, err, got, want in zip(
                ("max", "min"), pair, (lmax, lmin), (rmax, rmin), strict=True
            ):
                if err > tol:
                    print(
                        f"  miss: {method} {name} lambda_{end}: {got:.9g} vs {want:.9g} ({err:.1e})"
                    )
    return out


def _print_block_table(
    blocks: dict, numel: dict[str, int], results: dict, errors: dict | None
) -> None:
    """Per block: size, reference-free λ ends (ours), and per method seconds / products /
    worst relative error of the two ends."""
    methods = list(results)
    head = f"{'block':<16}{'n':>7}{'lambda_max':>13}{'lambda_min':>13}"
    for m in methods:
        head += f" | {m[:11]:>11} s {'prod':>5} {'err':>7}"
    print(head)
    ours = results.get("ours", {}).get("values", {})
    for name, members in blocks.items():
        lmax, lmin = ours.get(name, (float("nan"), float("nan")))
        n = sum(numel[mem] for mem in members)
        line = f"{name:<16}{n:>7}{lmax:13.6g}{lmin:13.6g}"
        for m in methods:
            res = results[m]
            sec = res.get("block_seconds", {}).get(name, float("nan"))
            prod = res.get("block_products", {}).get(name, "-")
            err = max(errors[m][name]) if errors is not None else float("nan")
            line += f" | {sec:13.2f} {prod:>5} {err:7.1e}"
        print(line)


PEERS = {"eigenthings": peer_eigenthings, "curvlinops": peer_curvlinops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="float32", choices=["float32", "float64"])
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--max-iter", type=int, default=400, help="our Lanczos step cap")
    parser.add_argument(
        "--peer-max-iter",
        type=int,
        default=400,
        help="hessian-eigenthings Lanczos steps (it never stops early) and ARPACK restarts",
    )
    parser.add_argument(
        "--max-blocks", type=int, default=0, help="only the first N blocks (0: all; printed)"
    )
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
    sys.stdout.reconfigure(line_buffering=True)  # progress visible when piped to a file
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
    numel = {k: p.numel() for k, p in model.named_parameters()}
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"reference GPT: {n_params} parameters, {len(blocks)} blocks, batch {tuple(x.shape)}, "
        f"{device} {args.precision}, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    print(f"versions: {_versions()}")
    if args.max_blocks and args.max_blocks < len(blocks):
        print(f"REDUCED: only the first {args.max_blocks} of {len(blocks)} blocks (--max-blocks)")
        blocks = dict(list(blocks.items())[: args.max_blocks])
    print(
        f"peers: hessian-eigenthings lanczos max_iter = min({args.peer_max_iter}, n-1) steps per "
        f"end (fixed, no early stop); curvlinops eigsh maxiter = {args.peer_max_iter} restarts"
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
    he_ms = None
    if "eigenthings" in args.peers:
        try:
            he_ms = eigenthings_ratio(model, x, y, args.repeats, sync)
        except Exception as exc:
            print(f"hessian-eigenthings matvec: failed ({type(exc).__name__}: {exc})")
    if he_ms is not None:
        print(f"hessian-eigenthings HessianOperator   {he_ms:8.1f} ms   {he_ms / g:.2f}")
    report["ratio"] = {**ratio, "curvlinops_ms": cl, "eigenthings_ms": he_ms}

    reference = None
    fingerprint = _fingerprint(model, x, y)
    if args.reference_cache is not None and args.reference_cache.is_file():
        cached = json.loads(args.reference_cache.read_text())
        if cached.get("fingerprint") == fingerprint:
            reference = {k: tuple(v) for k, v in cached["values"].items()}
        else:  # training on CPU threads is not bitwise reproducible: w* differs between runs
            print("(reference cache is for other weights or data: recomputing it)")
    if reference is None and not args.no_reference:
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
            args.reference_cache.write_text(
                json.dumps({"fingerprint": fingerprint, "values": reference})
            )

    print(f"\n== lambda_max and lambda_min of all {len(blocks)} blocks to tol {args.tol:g} ==")
    results = {"ours": ours_spectra(model, objective, x, y, blocks, args.tol, args.max_iter, sync)}
    for peer in [p for p in args.peers.split(",") if p]:
        try:
            results[peer] = PEERS[peer](model, x, y, blocks, args.tol, args.peer_max_iter, sync)
        except ImportError:
            print(f"{peer}: not importable here (install it in the benchmark venv)")
        except Exception as exc:
            print(f"{peer}: failed ({type(exc).__name__}: {exc})")
    errors = _errors(results, reference, args.tol)
    _print_block_table(blocks, numel, results, errors)
    print(
        f"\n{'method':<13}{'seconds':>9}{'products':>10}{'ms/product':>11}{'converged':>16}"
        f"{'max rel err':>13}{'within tol':>11}"
    )
    for method, res in results.items():
        worst, ok = float("nan"), "-"
        if errors is not None:
            errs = [e for pair in errors[method].values() for e in pair]
            worst = max(errs)
            ok = f"{sum(e <= args.tol for e in errs)}/{len(errs)}"
        prods = res.get("products")
        per = 1e3 * res["seconds"] / prods if prods else float("nan")
        print(
            f"{method:<13}{res['seconds']:9.2f}{prods if prods is not None else '-':>10}"
            f"{per:11.1f}{res.get('converged', '-'):>16}{worst:13.2e}{ok:>11}"
        )
        res["max_rel_err"] = worst if math.isfinite(worst) else None
    peers = {m: r["seconds"] for m, r in results.items() if m != "ours"}
    for m, sec in peers.items():
        print(f"speed-up vs {m}: {sec / results['ours']['seconds']:.2f}x")
    if peers:
        speedup = min(peers.values()) / results["ours"]["seconds"]
        print(f"speed-up vs the faster peer: {speedup:.2f}x (goal >= 3)")
    report["spectra"] = {
        m: {k: v for k, v in r.items() if k != "values"} for m, r in results.items()
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
