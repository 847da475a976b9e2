"""GPU benchmark of the curvature operator on GPT-2 small, self-contained.

Runs on a machine that has only torch, transformers, numpy and safetensors (no pydantic, no
curvplan install; Python 3.12, torch ≥ 2.4): it carries its own copy of the operator's
method (double-backward Hessian-vector products over parameter blocks, the cross-entropy
computed from the logits in the model's dtype, micro-batched; Lanczos with full
reorthogonalisation and explicit-residual certification), the same as
``curvplan_worker.curvature.operator`` and ``spectra``.

    python benchmarks/bench_gpu.py --full              # the full GPT-2-small analysis, every block
    python benchmarks/bench_gpu.py                     # GPT-2 small, batch 8×1024, 420 s budget
    python benchmarks/bench_gpu.py --smoke             # tiny config, < 1 min (also on a CPU)
    python benchmarks/bench_gpu.py --budget-seconds 900 --micro-batch 2

Prints first the memory of one HVP on one micro-batch (bytes saved for backward, per example,
and on CUDA the measured peak: the engine's memory plan, docs/numerics.md#memory-plan), the ms
per gradient and per full-model HVP (and the peak memory of each), then λ_max/λ_min block by
block (uniform block ids; q/k/v are column slices of the fused c_attn) at relative tolerance
1e-3 with the peak GPU memory, and stops at ``--budget-seconds`` (``--full``: never) with the
number of blocks done. The summary gives wall time, products, ms per product and peak memory,
and extrapolates from the measured time per product to a 1 B-parameter model on 1 and 8 GPUs:

    T(1 GPU) = P · (B' / B) · t · (N' / N)      T(8 GPUs) = T(1 GPU) / 8  (block fan-out)

P products over B blocks took t seconds each on the N-parameter model; the target has N'
parameters in B' blocks (8 per layer + 2; ``--target-layers``), a product costs ∝ parameters at
the same tokens, and a block needs as many products as here. With fan-out over blocks the 8
GPUs run whole blocks independently, so the time divides by 8 while B' ≫ 8 (never below the
slowest block).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

GPT2_SMALL = {
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
}
BASIS_BUDGET_BYTES = 16 * 2**30
SMOKE = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 64}


def build(config: dict, device: torch.device, dtype: torch.dtype):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(**config, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"  # explicit matmul-softmax: second derivatives everywhere
    torch.manual_seed(0)
    # (transformers types its wrapped .to as an unbound method: a stub limit, not a bug)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=dtype)  # type: ignore[call-arg]
    model.eval()
    return model


def blocks_of(model, n_layer: int, d: int) -> dict[str, list[tuple[str, tuple[int, int] | None]]]:
    """Uniform block ids → [(parameter name, last-dim slice or None)]."""
    p = "transformer."
    out: dict[str, list] = {"embed": [(p + "wte.weight", None), (p + "wpe.weight", None)]}
    for i in range(n_layer):
        h = f"{p}h.{i}."
        out[f"layers.{i}.ln1"] = [(h + "ln_1.weight", None), (h + "ln_1.bias", None)]
        for j, s in enumerate("qkv"):
            span = (j * d, (j + 1) * d)
            out[f"layers.{i}.{s}"] = [
                (h + "attn.c_attn.weight", span),
                (h + "attn.c_attn.bias", span),
            ]
        out[f"layers.{i}.o"] = [(h + "attn.c_proj.weight", None), (h + "attn.c_proj.bias", None)]
        out[f"layers.{i}.ln2"] = [(h + "ln_2.weight", None), (h + "ln_2.bias", None)]
        out[f"layers.{i}.ffn_in"] = [(h + "mlp.c_fc.weight", None), (h + "mlp.c_fc.bias", None)]
        out[f"layers.{i}.ffn_out"] = [
            (h + "mlp.c_proj.weight", None),
            (h + "mlp.c_proj.bias", None),
        ]
    out["final_norm"] = [(p + "ln_f.weight", None), (p + "ln_f.bias", None)]
    return out  # tied embeddings: no head block


class Operator:
    """Mean token cross-entropy over fixed micro-batches; gradients and block HVPs."""

    def __init__(self, model, tokens: torch.Tensor, micro_batch: int, cache_graph: bool) -> None:
        self.model = model
        self.params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
        self.batches = [tokens[i : i + micro_batch] for i in range(0, tokens.shape[0], micro_batch)]
        self.count = sum(int(b[:, 1:].numel()) for b in self.batches)
        self.cache_graph = cache_graph
        self._cache: dict[int, dict[str, torch.Tensor]] = {}

    def batch_loss(self, b: int) -> torch.Tensor:
        x = self.batches[b]
        logits = functional_call(self.model, self.params, (x[:, :-1],)).logits
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
        )  # in the logits' dtype (the model's own labels= loss upcasts to float32)
        return loss / self.count

    def gradient(self) -> float:
        tensors = list(self.params.values())
        sq = 0.0
        for b in range(len(self.batches)):
            grads = torch.autograd.grad(self.batch_loss(b), tensors)
            sq += float(sum((g.double() ** 2).sum() for g in grads))
        return math.sqrt(sq)

    def _grads(self, b: int, names: list[str]) -> list[torch.Tensor]:
        if self.cache_graph:
            if b not in self._cache:
                tensors = list(self.params.values())
                grads = torch.autograd.grad(self.batch_loss(b), tensors, create_graph=True)
                self._cache[b] = dict(zip(self.params, grads, strict=True))
            return [self._cache[b][n] for n in names]
        return list(
            torch.autograd.grad(
                self.batch_loss(b), [self.params[n] for n in names], create_graph=True
            )
        )

    def block_hvp(self, block: list[tuple[str, tuple[int, int] | None]], v: torch.Tensor):
        names = list(dict.fromkeys(n for n, _ in block))
        full = {n: torch.zeros_like(self.params[n]) for n in names}
        offset = 0
        for name, span in block:
            target = full[name] if span is None else full[name][..., span[0] : span[1]]
            size = target.numel()
            target.copy_(v[offset : offset + size].view_as(target))
            offset += size
        out = {n: torch.zeros_like(self.params[n]) for n in names}
        for b in range(len(self.batches)):
            grads = self._grads(b, names)
            hv = torch.autograd.grad(
                grads,
                [self.params[n] for n in names],
                grad_outputs=[full[n] for n in names],
                retain_graph=self.cache_graph,
            )
            for n, h in zip(names, hv, strict=True):
                out[n] += h
        parts = [
            (out[n] if span is None else out[n][..., span[0] : span[1]]).reshape(-1)
            for n, span in block
        ]
        return torch.cat(parts)

    def block_size(self, block) -> int:
        total = 0
        for name, span in block:
            shape = self.params[name].shape
            total += math.prod(shape[:-1]) * (shape[-1] if span is None else span[1] - span[0])
        return total

    def release(self) -> None:
        self._cache.clear()


def lanczos_extremes(matvec, n: int, device, dtype, tol: float, max_iter: int, seed: int):
    """λ_max, λ_min by Lanczos with full reorthogonalisation (basis on the device),
    each certified by its explicit residual ‖Hy − θy‖ ≤ tol·max(|θ|, 1e-3·‖H‖)."""
    gen = torch.Generator().manual_seed(seed)
    m_max = min(n, max_iter)
    # the Krylov basis is (m+1) × n: float64 while it fits the budget, else float32 (enough
    # for a 1e-3 tolerance; the explicit residual check is what certifies), else fewer steps
    basis_dtype = torch.float64
    if (m_max + 1) * n * 8 > BASIS_BUDGET_BYTES:
        basis_dtype = torch.float32
        m_max = min(m_max, max(8, BASIS_BUDGET_BYTES // (4 * n) - 1))
    basis = torch.zeros(m_max + 1, n, dtype=basis_dtype, device=device)
    q = torch.randn(n, generator=gen, dtype=torch.float64).to(device)
    basis[0] = (q / q.norm()).to(basis_dtype)
    alphas: list[float] = []
    betas: list[float] = []
    products = 0
    next_check = 0
    result = None
    for j in range(m_max):
        w = matvec(basis[j].to(dtype)).to(basis_dtype)
        products += 1
        alpha = float(basis[j].double() @ w.double())
        w = w - alpha * basis[j] - (betas[-1] * basis[j - 1] if j > 0 else 0)
        for _ in range(2):
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        beta = float(w.norm())
        alphas.append(alpha)
        t = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
        theta, s = np.linalg.eigh(t)
        norm = max(abs(theta[0]), abs(theta[-1]), 1e-300)
        est_ok = all(beta * abs(s[-1, i]) <= tol * max(abs(theta[i]), 1e-3 * norm) for i in (0, -1))
        if (est_ok and j >= next_check) or j + 1 == m_max or beta < 1e-12 * norm:
            ends = []
            for i in (-1, 0):
                coef = torch.from_numpy(np.ascontiguousarray(s[:, i])).to(device, basis_dtype)
                y = (basis[: j + 1].T @ coef).double()
                y = y / y.norm()
                hy = matvec(y.to(dtype)).double()
                products += 1
                lam = float(y @ hy)
                res = float((hy - lam * y).norm())
                ends.append((lam, res, res <= tol * max(abs(lam), 1e-3 * norm)))
            result = {
                "lambda_max": ends[0][0],
                "lambda_min": ends[1][0],
                "converged": ends[0][2] and ends[1][2],
                "iterations": j + 1,
            }
            if result["converged"] or j + 1 == m_max or beta < 1e-12 * norm:
                break
            next_check = j + max(3, (j + 1) // 4)  # not certified yet: check again later
        betas.append(beta)
        basis[j + 1] = w / beta
    result["products"] = products
    return result


def measure_product_memory(op: Operator, device) -> dict:
    """Memory of one uncached full-model HVP on the first micro-batch: distinct storages saved
    for backward (forward + first backward with create_graph; parameters excluded), the
    first-gradient bytes, and on CUDA the max_memory_allocated increase (the engine's
    ``curvplan_worker.curvature.memory_fit.measure_product``)."""
    x = op.batches[0]
    resident = {p.untyped_storage().data_ptr() for p in op.params.values()}
    resident.add(x.untyped_storage().data_ptr())
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in resident and ptr not in saved:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    _sync(device)
    _peak_reset(device)
    before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    tensors = list(op.params.values())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = functional_call(op.model, op.params, (x[:, :-1],)).logits
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
        )
        grads = torch.autograd.grad(loss / op.count, tensors, create_graph=True)
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    torch.autograd.grad(grads, tensors, grad_outputs=[torch.ones_like(g) for g in grads])
    _sync(device)
    peak = torch.cuda.max_memory_allocated() - before if device.type == "cuda" else None
    del grads, logits, loss
    return {
        "examples": int(x.shape[0]),
        "saved": sum(saved.values()),
        "gradients": grad_bytes,
        "cuda_peak": peak,
    }


def extrapolate(
    products: int, blocks: int, seconds_per_product: float, n_params: int, args
) -> tuple[float, float, int]:
    """(T on 1 GPU, T on ``--target-gpus`` GPUs, target blocks): see the module docstring."""
    target_blocks = 8 * args.target_layers + 2
    one = (
        products * (target_blocks / blocks) * seconds_per_product * (args.target_params / n_params)
    )
    return one, one / args.target_gpus, target_blocks


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_reset(device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return None


def _fmt_mem(x: float | None) -> str:
    return "n/a (CPU)" if x is None else f"{x:.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny config, finishes in < 1 min")
    ap.add_argument(
        "--full", action="store_true", help="every block of GPT-2 small, no time budget"
    )
    ap.add_argument("--target-params", type=float, default=1e9, help="extrapolation: N'")
    ap.add_argument("--target-layers", type=int, default=24, help="extrapolation: its layers")
    ap.add_argument("--target-gpus", type=int, default=8, help="extrapolation: GPUs (fan-out)")
    ap.add_argument("--budget-seconds", type=float, default=420.0)
    ap.add_argument("--batch", type=int, default=None, help="sequences (default 8; smoke 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (1024; smoke 64)")
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--max-iter", type=int, default=100)
    ap.add_argument("--precision", choices=["float32", "float64"], default="float32")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-cache-graph", action="store_true", help="rebuild graph per product")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (3; smoke 1)")
    args = ap.parse_args()

    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # curvature needs full fp32 matmuls
        torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float64 if args.precision == "float64" else torch.float32
    args.repeats = args.repeats or (1 if args.smoke else 3)
    config = dict(SMOKE if args.smoke else GPT2_SMALL)
    batch = args.batch or (2 if args.smoke else 8)
    seq = args.seq or (64 if args.smoke else 1024)
    config["n_positions"] = max(config["n_positions"], seq)
    micro = args.micro_batch or (batch if args.smoke else 1)
    budget = 45.0 if args.smoke and args.budget_seconds == 420.0 else args.budget_seconds
    if args.full:
        budget = math.inf
    started = time.perf_counter()

    model = build(config, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config["vocab_size"], (batch, seq + 1), generator=gen).to(device)
    import transformers

    print(
        f"# bench_gpu: GPT-2 {'smoke' if args.smoke else 'small'} config, {n_params / 1e6:.1f} M "
        f"parameters, batch {batch}×{seq} tokens (micro-batch {micro}), {args.precision}, "
        f"device {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )
    op = Operator(model, tokens, micro, cache_graph=not args.no_cache_graph)
    mem = measure_product_memory(op, device)
    per_example = mem["saved"] / mem["examples"]
    graph = mem["saved"] + mem["gradients"]
    print(
        f"memory of one HVP on one micro-batch ({mem['examples']} sequences): saved for backward "
        f"{mem['saved'] / 2**30:.3f} GiB ({per_example / 2**30:.3f} GiB per sequence), "
        f"first gradients {mem['gradients'] / 2**30:.3f} GiB"
        + (
            f", CUDA peak {mem['cuda_peak'] / 2**30:.3f} GiB (peak/graph "
            f"{mem['cuda_peak'] / graph:.2f}; the planner assumes 2.00 without CUDA)"
            if mem["cuda_peak"] is not None
            else ", CUDA peak n/a (CPU)"
        )
    )

    # gradient and full-model HVP timings: first with the graph rebuilt for each product (a full
    # double backward), then with the first-backward graphs cached (the Lanczos loop's cost)
    _sync(device)
    _peak_reset(device)
    base_mem = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else None
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        op.gradient()
        _sync(device)
        times.append(time.perf_counter() - t0)
    grad_ms = 1000 * min(times)
    grad_peak = _peak_gib(device)
    all_params = [(n, None) for n in op.params]
    v = torch.randn(op.block_size(all_params), generator=gen, dtype=torch.float64)
    v = v.to(device, dtype)
    op.cache_graph, cache = False, op.cache_graph
    _peak_reset(device)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        op.block_hvp(all_params, v)
        _sync(device)
        times.append(time.perf_counter() - t0)
    op.cache_graph = cache
    hvp_ms = 1000 * min(times)
    hvp_peak = _peak_gib(device)
    cached_ms = cached_peak = None
    if cache:  # the engine's default: first-backward graphs kept, a product = 2nd backward
        _peak_reset(device)
        op.block_hvp(all_params, v)
        _sync(device)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            op.block_hvp(all_params, v)
            _sync(device)
            times.append(time.perf_counter() - t0)
        cached_ms = 1000 * min(times)
        cached_peak = _peak_gib(device)
    print(f"gradient: {grad_ms:9.1f} ms   peak memory {_fmt_mem(grad_peak)}")
    print(
        f"HVP (double backward): {hvp_ms:9.1f} ms   peak memory {_fmt_mem(hvp_peak)}   "
        f"HVP/gradient time {hvp_ms / grad_ms:.2f}"
        + (
            f", peak-memory ratio {(hvp_peak - base_mem) / (grad_peak - base_mem):.2f} "
            "(above the weights)"
            if hvp_peak is not None and grad_peak is not None and grad_peak > base_mem
            else ""
        )
    )

    if cached_ms is not None:
        print(
            f"HVP (first-backward graphs cached, per product): {cached_ms:9.1f} ms   "
            f"peak memory {_fmt_mem(cached_peak)}   HVP/gradient time {cached_ms / grad_ms:.2f}"
        )

    blocks = blocks_of(model, config["n_layer"], config["n_embd"])
    if args.smoke:
        blocks = dict(list(blocks.items())[:4])
    print(f"\nper-block λ_max/λ_min at tol {args.tol:g} ({len(blocks)} blocks):")
    print(
        f"{'block':<18}{'n':>10}{'λ_max':>14}{'λ_min':>14}{'products':>10}{'conv':>6}"
        f"{'s':>8}{'peak':>12}"
    )
    done, block_times, products = 0, [], 0
    _peak_reset(device)
    run_peak = 0.0
    for i, (name, members) in enumerate(blocks.items()):
        if done and time.perf_counter() - started > budget:  # at least one block is measured
            break
        run_peak = max(run_peak, _peak_gib(device) or 0.0)
        _peak_reset(device)
        t0 = time.perf_counter()
        res = lanczos_extremes(
            lambda x, m=members: op.block_hvp(m, x),
            op.block_size(members),
            device,
            dtype,
            args.tol,
            args.max_iter,
            seed=i,
        )
        _sync(device)
        dt = time.perf_counter() - t0
        block_times.append(dt)
        products += res["products"]
        done += 1
        conv = "yes" if res["converged"] else "no"
        print(
            f"{name:<18}{op.block_size(members):>10}{res['lambda_max']:>14.5g}"
            f"{res['lambda_min']:>14.5g}{res['products']:>10}{conv:>6}"
            f"{dt:>8.1f}{_fmt_mem(_peak_gib(device)):>12}",
            flush=True,
        )
    run_peak = max(run_peak, _peak_gib(device) or 0.0)
    op.release()
    elapsed = time.perf_counter() - started
    mean = sum(block_times) / max(len(block_times), 1)
    projected = (elapsed - sum(block_times)) + mean * len(blocks)
    print(
        f"\nblocks done: {done}/{len(blocks)} in {elapsed:.1f} s (budget {budget:.0f} s); "
        f"projected total for all blocks: {projected:.0f} s"
    )
    per_product = sum(block_times) / max(products, 1)
    print(
        f"spectra: wall {sum(block_times):.1f} s, {products} products, "
        f"{1000 * per_product:.1f} ms per product, peak memory "
        f"{_fmt_mem(run_peak if device.type == 'cuda' else None)}; whole run {elapsed:.1f} s"
    )
    all_products = products * len(blocks) / max(done, 1)  # the blocks not done: as the mean
    one, many, target_blocks = extrapolate(all_products, len(blocks), per_product, n_params, args)
    print(
        f"extrapolation to N' = {args.target_params:.3g} parameters ({args.target_layers} layers, "
        f"{target_blocks} blocks): T = P·(B'/B)·t·(N'/N) = {all_products:.0f}·({target_blocks}/"
        f"{len(blocks)})·{per_product:.4f} s·({args.target_params:.3g}/{n_params:.3g}) = "
        f"{one:.0f} s ({one / 3600:.2f} h) on 1 GPU, {many:.0f} s ({many / 3600:.2f} h) on "
        f"{args.target_gpus} GPUs with block fan-out (T/{args.target_gpus})"
    )


if __name__ == "__main__":
    main()
