"""Exact Hessian-vector products of the evaluation loss by double backward.

The loss is the mean loss term over the whole evaluation sample,
L(w) = Σ_b Σ_i l_i(w) / Σ_b Σ_i c_i (curvature-pitfalls §9): every batch contributes its summed
loss divided by the *total* count, so uneven batches are weighted by their token counts, and
every product walks the same batches in the same order.

Products are ``torch.autograd.grad`` of the first-order gradient (built with
``create_graph=True``) restricted to the requested parameter tensors (pitfalls §2: never
``torch.func.hessian``/``jacrev`` inside ``jvp``). By default the first backward's graph is built
once per batch and reused by every product (each product is then only the second backward);
``cache_graph=False`` rebuilds it per product to bound memory (pitfalls §6). Several vectors go
through one batched second backward (``is_grads_batched``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from curvplan_worker.curvature.device import eval_mode
from curvplan_worker.curvature.objective import Objective


@dataclass(frozen=True)
class Layout:
    """Flat layout of a list of parameter tensors (row-major ``reshape(-1)``, i.e. vec_r)."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @property
    def sizes(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def offsets(self) -> dict[str, tuple[int, int]]:
        out, start = {}, 0
        for name, size in zip(self.names, self.sizes, strict=True):
            out[name] = (start, start + size)
            start += size
        return out

    def split(self, flat: Tensor) -> list[Tensor]:
        """(k, n) or (n,) → per-tensor views with shapes (k, *shape) or shape."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.sizes, dim=-1)
        return [p.reshape(*lead, *s) for p, s in zip(parts, self.shapes, strict=True)]


class CurvatureEngine:
    """Gradient and Hessian products of the evaluation loss of ``model`` at its weights w*.

    Use as a context manager: it puts the model in eval mode, checks that no dropout is active,
    and restores every submodule's mode on exit. The model's weights are never modified: the
    engine differentiates detached aliases through ``functional_call``.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        batches: Sequence[tuple[Tensor, Tensor]],
        *,
        cache_graph: bool = True,
    ) -> None:
        if not batches:
            raise ValueError("the evaluation sample has no batches")
        self.model = model
        self.objective = objective
        self.batches = list(batches)
        self.cache_graph = cache_graph
        self.params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
        self.names = list(self.params)
        first = next(iter(self.params.values()))
        self.dtype, self.device = first.dtype, first.device
        self._cache: dict[int, dict[str, Tensor | None]] = {}
        self._mode_ctx = None
        self.n_hvp = 0
        self.total_count = 0.0
        self.loss_value = float("nan")

    # -- session ------------------------------------------------------------------------
    def __enter__(self) -> CurvatureEngine:
        self._mode_ctx = eval_mode(self.model)
        self._mode_ctx.__enter__()
        try:
            self._count()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._cache.clear()
        if self._mode_ctx is not None:
            ctx, self._mode_ctx = self._mode_ctx, None
            ctx.__exit__(None, None, None)

    def _require_session(self) -> None:
        if self._mode_ctx is None:
            raise RuntimeError("use the CurvatureEngine inside a `with` block")

    def _count(self) -> None:
        total, loss = 0.0, 0.0
        with torch.no_grad():
            for x, y in self.batches:
                out = functional_call(self.model, self.params, (x,))
                losses, counts = self.objective.output_losses(out, y)
                total += float(counts.sum(dtype=torch.float64))
                loss += float(losses.sum(dtype=torch.float64))
        if total <= 0:
            raise ValueError("the evaluation sample has no loss terms")
        self.total_count = total
        self.loss_value = loss / total

    # -- layouts ------------------------------------------------------------------------
    def layout(self, names: Sequence[str]) -> Layout:
        unknown = [n for n in names if n not in self.params]
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown}")
        return Layout(tuple(names), tuple(self.params[n].shape for n in names))

    def flat_params(self, names: Sequence[str]) -> Tensor:
        return torch.cat([self.params[n].detach().reshape(-1) for n in names])

    # -- loss and first-order ------------------------------------------------------------
    def batch_loss(self, index: int, params: dict[str, Tensor] | None = None) -> Tensor:
        """Batch ``index``'s summed loss divided by the total count (its share of L)."""
        x, y = self.batches[index]
        out = functional_call(self.model, params or self.params, (x,))
        losses, _ = self.objective.output_losses(out, y)
        return losses.sum() / self.total_count

    def gradient(self, names: Sequence[str] | None = None) -> Tensor:
        """∇L over ``names`` (all parameters by default), flat, without a second-order graph."""
        self._require_session()
        names = list(names or self.names)
        tensors = [self.params[n] for n in names]
        total = torch.zeros(self.layout(names).numel, dtype=self.dtype, device=self.device)
        for b in range(len(self.batches)):
            grads = torch.autograd.grad(self.batch_loss(b), tensors, allow_unused=True)
            total += _flat(grads, tensors)
        return total

    def _graph_grads(self, b: int, names: Sequence[str]) -> list[Tensor | None]:
        """First-order gradients of batch b with their graph (create_graph=True)."""
        if self.cache_graph:
            if b not in self._cache:
                tensors = [self.params[n] for n in self.names]
                grads = torch.autograd.grad(
                    self.batch_loss(b), tensors, create_graph=True, allow_unused=True
                )
                self._cache[b] = dict(zip(self.names, grads, strict=True))
            return [self._cache[b][n] for n in names]
        tensors = [self.params[n] for n in names]
        return list(
            torch.autograd.grad(self.batch_loss(b), tensors, create_graph=True, allow_unused=True)
        )

    def release_graph(self) -> None:
        """Drop the cached first-backward graphs (they are rebuilt on demand)."""
        self._cache.clear()

    # -- second-order ------------------------------------------------------------------
    def hvp(self, rows: Sequence[str], cols: Sequence[str], vectors: Tensor) -> Tensor:
        """H[rows, cols] · v for flat ``vectors`` of shape (n_cols,) or (k, n_cols).

        H[rows, cols] is the sub-block of the Hessian of L with the other parameters held at
        w*. Uses grad(∇_cols L, w_rows, v) = (∂²L/∂w_cols∂w_rows)ᵀ v = H[rows, cols] v.
        """
        self._require_session()
        rows, cols = list(rows), list(cols)
        col_layout, row_layout = self.layout(cols), self.layout(rows)
        batched = vectors.dim() == 2
        k = vectors.shape[0] if batched else 1
        if vectors.shape[-1] != col_layout.numel:
            raise ValueError(f"vector length {vectors.shape[-1]} != {col_layout.numel}")
        vectors = vectors.to(self.device, self.dtype)
        v_parts = col_layout.split(vectors)
        row_tensors = [self.params[n] for n in rows]
        out_shape = (k, row_layout.numel) if batched else (row_layout.numel,)
        total = torch.zeros(out_shape, dtype=self.dtype, device=self.device)
        retain = self.cache_graph
        for b in range(len(self.batches)):
            grads = self._graph_grads(b, cols)
            pairs = [
                (g, v)
                for g, v in zip(grads, v_parts, strict=True)
                if g is not None and g.requires_grad
            ]
            if not pairs:
                continue
            outs = torch.autograd.grad(
                [g for g, _ in pairs],
                row_tensors,
                grad_outputs=[v for _, v in pairs],
                retain_graph=retain,
                allow_unused=True,
                is_grads_batched=batched and k > 1,
            )
            if batched and k == 1:
                total += _flat(outs, row_tensors, lead=(1,))
            else:
                total += _flat(outs, row_tensors, lead=(k,) if batched else ())
        self.n_hvp += k
        return total

    def block_hvp(self, names: Sequence[str], vectors: Tensor) -> Tensor:
        """Diagonal-block product H_BB · v (vectors (n_B,) or (k, n_B))."""
        return self.hvp(names, names, vectors)

    def multi_block_hvp(
        self, blocks: Sequence[Sequence[str]], vectors: Sequence[Tensor]
    ) -> list[Tensor]:
        """H_{B_j B_j} v_j for several blocks in one batched second backward.

        The j-th batch entry carries v_j on block j and zeros elsewhere; entry j of the result,
        restricted to block j, is H_jj v_j. The cross terms are computed and discarded.
        """
        union = [n for block in blocks for n in block]
        layout = self.layout(union)
        spans, start = [], 0
        for block in blocks:
            size = self.layout(block).numel
            spans.append((start, start + size))
            start += size
        stacked = torch.zeros(len(blocks), layout.numel, dtype=self.dtype, device=self.device)
        for j, ((a, e), v) in enumerate(zip(spans, vectors, strict=True)):
            stacked[j, a:e] = v
        result = self.hvp(union, union, stacked if len(blocks) > 1 else stacked[0])
        if len(blocks) == 1:
            return [result]
        return [result[j, a:e] for j, (a, e) in enumerate(spans)]


def _flat(
    grads: Sequence[Tensor | None], like: Sequence[Tensor], lead: tuple[int, ...] = ()
) -> Tensor:
    parts = []
    for g, p in zip(grads, like, strict=True):
        if g is None:
            parts.append(torch.zeros(*lead, p.numel(), dtype=p.dtype, device=p.device))
        else:
            parts.append(g.reshape(*lead, p.numel()))
    return torch.cat(parts, dim=-1)


def finite_difference_hvp(
    engine: CurvatureEngine,
    rows: Sequence[str],
    cols: Sequence[str],
    v: Tensor,
    eps: float = 1e-3,
) -> Tensor:
    """Central difference D(h) = (∇_rows L(w + hv) − ∇_rows L(w − hv)) / 2h, Richardson-
    extrapolated (4 D(h/2) − D(h)) / 3 to O(h⁴) error, on a private copy of the weights
    (pitfalls §8: never perturb live weights). An independent oracle for tests and the
    start-up self-test."""
    offsets = engine.layout(cols).offsets()
    v = v.to(engine.device, engine.dtype)
    scale = float(torch.linalg.vector_norm(v))
    if scale == 0.0:
        return torch.zeros(engine.layout(rows).numel, dtype=engine.dtype, device=engine.device)
    v = v / scale  # the step is eps in parameter space whatever ‖v‖ is

    def grad_at(step: float) -> Tensor:
        shifted = {n: p.detach().clone() for n, p in engine.params.items()}
        for n in cols:
            a, e = offsets[n]
            shifted[n] = shifted[n] + step * v[a:e].reshape(shifted[n].shape)
        for n in rows:
            shifted[n].requires_grad_(True)
        tensors = [shifted[n] for n in rows]
        total = torch.zeros(engine.layout(rows).numel, dtype=engine.dtype, device=engine.device)
        for b in range(len(engine.batches)):
            grads = torch.autograd.grad(engine.batch_loss(b, shifted), tensors, allow_unused=True)
            total += _flat(grads, tensors)
        return total

    def central(h: float) -> Tensor:
        return (grad_at(h) - grad_at(-h)) / (2 * h)

    return scale * (4 * central(eps / 2) - central(eps)) / 3


class SelfTestError(RuntimeError):
    """The start-up HVP self-test disagreed with finite differences (pitfalls §1–2)."""


def self_test(device: torch.device | str = "cpu", tol: float = 1e-7) -> float:
    """Start-up check: on a tiny fp64 Transformer (LayerNorm, attention, GELU) on ``device``,
    double-backward block products must match Richardson-extrapolated central differences.
    Returns the worst relative error; raises :class:`SelfTestError` above ``tol``."""
    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.curvature.objective import objective_for

    spec = {
        "d_model": 4,
        "n_heads": 2,
        "d_ff": 6,
        "n_layers": 1,
        "task": {"type": "causal_lm", "vocab_size": 5, "seq_len": 4},
    }
    gen = torch.Generator().manual_seed(0)
    model = build_model(spec, seed=0, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    model = model.to(device)
    x = torch.randint(0, 5, (3, 4), generator=gen).to(device)
    worst = 0.0
    with CurvatureEngine(model, objective_for(spec), [(x[:, :-1], x[:, 1:])]) as eng:
        for names in (["layers.0.ln1.weight", "layers.0.ln1.bias"], ["layers.0.attn.q.weight"]):
            v = torch.randn(eng.layout(names).numel, generator=gen, dtype=torch.float64)
            exact = eng.block_hvp(names, v)
            approx = finite_difference_hvp(eng, names, names, v)
            err = float((exact - approx).norm() / max(float(approx.norm()), 1e-300))
            worst = max(worst, err)
    if not worst <= tol:
        raise SelfTestError(f"HVP self-test failed: relative error {worst:.3e} > {tol:.1e}")
    return worst
