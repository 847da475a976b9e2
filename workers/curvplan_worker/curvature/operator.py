"""The curvature operator: model + objective + fixed batches → gradient, Hessian and
Gauss–Newton products over parameter blocks, per-example gradients.

Every second-order number of the engine (block spectra, traces, off-diagonal norms, the dense
Hessian, per-sample Hessian norms, the gradient-noise quadratic forms) is a product of this one
operator, for every model source (the reference Transformer and Hugging Face models).

The loss is the mean loss term over the whole evaluation sample,
L(w) = Σ_b Σ_i s_i(w) / Σ_b Σ_i c_i (docs/numerics.md#loss-normalisation; s_i the summed loss
of example i, c_i its number of loss terms): every batch contributes its summed loss divided by
the *total* count, so uneven batches are weighted by their token counts, and every product
walks the same batches in the same order.

Products are ``torch.autograd.grad`` of the first-order gradient (built with
``create_graph=True``) restricted to the requested parameter tensors
(docs/numerics.md#double-backward: never ``torch.func.hessian``/``jacrev`` inside ``jvp``). By
default the first backward's graph is built once per batch and reused by every product (each
product is then only the second backward); ``cache_graph=False`` rebuilds it per product to
bound memory (docs/numerics.md#graph-cache). Several vectors go through one
batched second backward (``is_grads_batched``).

Blocks are lists of *members*: a parameter name as ``named_parameters()`` gives it, or a slice
of one along its last dimension written ``name[:, a:b]`` (2-D) or ``name[a:b]`` (1-D) — GPT-2's
fused ``c_attn`` holds q, k and v side by side. A product over a slice is the product over the
whole tensor with the vector zero outside the slice, restricted to the slice on output: exactly
the sub-block H[slice, slice] of the Hessian.

Data parallel (docs/numerics.md#data-parallel): with a ``reducer`` (an in-place all-reduce sum
over the ranks of a process group, ``distributed.py``) each rank holds a contiguous shard of the
micro-batches; the loss sums and counts, and every gradient, Hessian and Gauss–Newton product are
this rank's partial sums passed once through ``_reduce``, so every rank gets the global L and
its products.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

from curvplan_core.blocks import parse_slice
from curvplan_worker.curvature.cancel import check_cancel
from curvplan_worker.curvature.device import eval_mode
from curvplan_worker.curvature.memory import MemoryPlan, OutOfDeviceMemory, OutOfMemoryRetry
from curvplan_worker.curvature.objective import Objective

# ---------------------------------------------------------------------------------------------
# Members and layouts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One entry of a block: a whole parameter tensor, or a slice of its last dimension."""

    text: str
    name: str
    start: int | None = None
    stop: int | None = None
    rank: int | None = None  # 2 for ``name[:, a:b]``, 1 for ``name[a:b]``

    @property
    def is_slice(self) -> bool:
        return self.start is not None

    def shape(self, full: torch.Size) -> torch.Size:
        if not self.is_slice:
            return full
        if len(full) != self.rank:
            raise KeyError(
                f"{self.text!r}: {self.name} has {len(full)} dimension(s), the slice is written "
                f"for {self.rank}"
            )
        if not 0 <= self.start < self.stop <= full[-1]:
            raise KeyError(f"{self.text!r}: slice outside the last dimension {full[-1]}")
        return torch.Size([*full[:-1], self.stop - self.start])

    def index(self, lead: int = 0) -> tuple:
        """Index of the slice in a tensor with ``lead`` extra leading dimensions."""
        if not self.is_slice:
            return (...,)
        return (..., slice(self.start, self.stop))

    def as_slice_dict(self) -> dict | None:
        """``{param, dim, start, stop}`` (the structured form of a slice) or None."""
        if not self.is_slice:
            return None
        return {"param": self.name, "dim": self.rank - 1, "start": self.start, "stop": self.stop}


def parse_member(text: str) -> Member:
    """``name`` or ``name[:, a:b]`` / ``name[a:b]`` → :class:`Member` (``curvplan_core.blocks``)."""
    spec = parse_slice(text)
    if spec is None:
        return Member(text, text)
    return Member(text, spec.name, spec.start, spec.stop, spec.rank)


def block_slices(members: Sequence[str]) -> list[dict]:
    """The structured ``slices`` of a block's members (empty when it holds whole tensors)."""
    out = []
    for text in members:
        d = parse_member(text).as_slice_dict()
        if d is not None:
            out.append(d)
    return out


@dataclass(frozen=True)
class Layout:
    """Flat layout of a list of members (row-major ``reshape(-1)``, i.e. vec_r)."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    members: tuple[Member, ...] = ()
    full_shapes: tuple[torch.Size, ...] = ()

    # computed once per layout (the engine hands out one Layout per list of members, so a
    # product's per-call bookkeeping does not redo them)
    @functools.cached_property
    def sizes(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]

    @functools.cached_property
    def numel(self) -> int:
        return sum(self.sizes)

    def offsets(self) -> dict[str, tuple[int, int]]:
        out, start = {}, 0
        for name, size in zip(self.names, self.sizes, strict=True):
            out[name] = (start, start + size)
            start += size
        return out

    def split(self, flat: Tensor) -> list[Tensor]:
        """(k, n) or (n,) → per-member views with shapes (k, *shape) or shape."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.sizes, dim=-1)
        return [p.reshape(*lead, *s) for p, s in zip(parts, self.shapes, strict=True)]

    @functools.cached_property
    def bases(self) -> list[str]:
        """The distinct parameter tensors the members live in, in first-use order."""
        return list(dict.fromkeys(m.name for m in self.members))

    def expand(self, flat: Tensor) -> dict[str, Tensor]:
        """Flat member vector (…, n) → full-size tensors per base parameter, zero outside the
        members (a parameter with several slices gets them all)."""
        lead = flat.shape[:-1]
        out: dict[str, Tensor] = {}
        full_shape = dict(zip((m.name for m in self.members), self.full_shapes, strict=True))
        for member, part in zip(self.members, self.split(flat), strict=True):
            if not member.is_slice:
                out[member.name] = part if member.name not in out else out[member.name] + part
                continue
            if member.name not in out:
                out[member.name] = flat.new_zeros(*lead, *full_shape[member.name])
            else:  # may be a view of ``flat`` (a whole member): never write into the caller's
                out[member.name] = out[member.name].clone()
            out[member.name][member.index()] += part
        return out

    def gather(self, full: dict[str, Tensor | None], lead: tuple[int, ...] = ()) -> Tensor:
        """Full-size tensors per base parameter (None = zero) → flat member vector."""
        parts = []
        for member, shape in zip(self.members, self.shapes, strict=True):
            t = full.get(member.name)
            if t is None:
                ref_dtype = next((x.dtype for x in full.values() if x is not None), None)
                ref_dev = next((x.device for x in full.values() if x is not None), None)
                parts.append(torch.zeros(*lead, math.prod(shape), dtype=ref_dtype, device=ref_dev))
            else:
                parts.append(t[member.index()].reshape(*lead, math.prod(shape)))
        return torch.cat(parts, dim=-1)


# ---------------------------------------------------------------------------------------------
# Out-of-memory retry (docs/numerics.md#oom-retry)
# ---------------------------------------------------------------------------------------------

OOM_TRIES_AT_ONE = 2
"""Out-of-memory errors tolerated at micro-batch 1 before a product gives up."""

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _retry_on_oom(method: _Method) -> _Method:
    """Redo a product after a CUDA out-of-memory with the graph cache dropped and the
    micro-batch halved (the same examples, re-split in the same order; the loss is still
    divided by the total count, so the product is the same up to summation order)."""

    @functools.wraps(method)
    def retrying(self: CurvatureEngine, *args: Any, **kwargs: Any) -> Any:
        while True:
            try:
                result = method(self, *args, **kwargs)
            except torch.cuda.OutOfMemoryError as exc:
                self._shrink_after_oom(exc, method.__name__)
                continue
            self._oom_at_one = 0
            return result

    return retrying  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# The operator
# ---------------------------------------------------------------------------------------------


class CurvatureEngine:
    """Gradient and Hessian products of the evaluation loss of ``model`` at its weights w*.

    Use as a context manager: it puts the model in eval mode (the one guard of the engine:
    active dropout refused, attention on the MATH backend), and restores every submodule's mode
    on exit. The model's weights are never modified: the operator differentiates detached
    aliases through ``functional_call``.

    A CUDA out-of-memory inside a product (or the count) drops the graph cache, halves the
    micro-batch (:meth:`rebatch`) and redoes the product; after :data:`OOM_TRIES_AT_ONE` at
    micro-batch 1 it raises :class:`~curvplan_worker.curvature.memory.OutOfDeviceMemory`.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        batches: Sequence[tuple[Tensor, Tensor]] = (),
        *,
        cache_graph: bool = True,
        param_names: Sequence[str] | None = None,
        reducer: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """``batches`` are the fixed evaluation micro-batches of L (none: only the
        per-example methods, which take their own inputs, are available). ``reducer`` sums a
        tensor over the ranks of a data-parallel group in place (``batches`` is then this
        rank's shard; None: one process)."""
        self.model = model
        self.objective = objective
        self.batches = list(batches)
        self.cache_graph = cache_graph
        self.reducer = reducer
        named = dict(model.named_parameters())
        if param_names is not None:
            missing = [n for n in param_names if n not in named]
            if missing:
                raise ValueError(f"param_names: not parameters of the model: {missing}")
        self.params = {n: p.detach().requires_grad_(True) for n, p in named.items()}
        self.names = list(param_names) if param_names is not None else list(self.params)
        first = next(iter(self.params.values()))
        self.dtype, self.device = first.dtype, first.device
        self._cache: dict[int, dict[str, Tensor | None]] = {}
        self._layouts: dict[tuple[str, ...], Layout] = {}
        self._mode_ctx = None
        self.n_hvp = 0
        self.total_count = 0.0
        self.loss_value = float("nan")
        # memory: the plan's budget and measurement (named by the out-of-memory error) and
        # one record per out-of-memory retry (docs/numerics.md#memory-plan)
        self.memory_budget: int | None = None
        self.memory_plan: MemoryPlan | None = None  # set by memory_fit.fit_to_memory
        self.per_example_bytes: float | None = None
        self.memory_source: str | None = None
        self.oom_retries: list[OutOfMemoryRetry] = []
        self._oom_at_one = 0

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

    def _require_session(self, batches: bool = True) -> None:
        if self._mode_ctx is None:
            raise RuntimeError("use the CurvatureEngine inside a `with` block")
        if batches and not self.batches and self.reducer is None:
            raise ValueError("the evaluation sample has no batches")

    def _reduce(self, partial: Tensor) -> Tensor:
        """This rank's partial sum → the sum over all ranks (itself without a reducer)."""
        return partial if self.reducer is None else self.reducer(partial)

    @_retry_on_oom
    def _count(self) -> None:
        if not self.batches and self.reducer is None:
            return
        total, loss = 0.0, 0.0
        with torch.no_grad():
            for x, y in self.batches:
                out = functional_call(self.model, self.params, (x,))
                losses, counts = self.objective.output_losses(out, y)
                total += float(counts.sum(dtype=torch.float64))
                loss += float(losses.sum(dtype=torch.float64))
        sums = self._reduce(torch.tensor([total, loss], dtype=torch.float64, device=self.device))
        total, loss = float(sums[0]), float(sums[1])
        if total <= 0:
            raise ValueError("the evaluation sample has no loss terms")
        self.total_count = total
        self.loss_value = loss / total

    # -- micro-batches -----------------------------------------------------------------
    @property
    def n_examples(self) -> int:
        return sum(int(x.shape[0]) for x, _ in self.batches)

    @property
    def micro_batch(self) -> int:
        """Examples per micro-batch (the first batch's; the last one may be shorter)."""
        return int(self.batches[0][0].shape[0]) if self.batches else 0

    def rebatch(self, size: int) -> None:
        """Re-split the same examples, in the same order, into micro-batches of ``size``.

        The graph cache is dropped; the total count (the loss's denominator) is unchanged, so
        every product is the same up to the order of its sums
        (docs/numerics.md#loss-normalisation).
        """
        if not self.batches:
            return
        self.release_graph()
        inputs = torch.cat([x for x, _ in self.batches])
        targets = torch.cat([y for _, y in self.batches])
        self.batches = batches_of(inputs, targets, max(1, int(size)))

    def _shrink_after_oom(self, exc: BaseException, during: str) -> None:
        """After an out-of-memory: no graph cache, half the micro-batch (or give up at 1)."""
        size = self.micro_batch
        self.release_graph()
        self.cache_graph = False
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if size <= 1:
            self._oom_at_one += 1
            if self._oom_at_one >= OOM_TRIES_AT_ONE:
                raise OutOfDeviceMemory(
                    self.memory_budget, self.per_example_bytes, self.memory_source, during
                ) from exc
        else:
            self.rebatch(size // 2)
        self.oom_retries.append(
            {"during": during, "from_micro_batch": size, "to_micro_batch": self.micro_batch}
        )

    # -- layouts ------------------------------------------------------------------------
    def layout(self, names: Sequence[str]) -> Layout:
        """The flat layout of ``names`` (made once per list of names: every product over the
        same block reuses it)."""
        key = tuple(names)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = self._make_layout(key)
        return layout

    def _make_layout(self, names: tuple[str, ...]) -> Layout:
        members = [parse_member(n) for n in names]
        unknown = [m.text for m in members if m.name not in self.params]
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown}")
        full = tuple(self.params[m.name].shape for m in members)
        shapes = tuple(m.shape(f) for m, f in zip(members, full, strict=True))
        return Layout(tuple(names), shapes, tuple(members), full)

    def flat_params(self, names: Sequence[str]) -> Tensor:
        layout = self.layout(names)
        return layout.gather({n: self.params[n].detach() for n in layout.bases})

    # -- loss and first-order ------------------------------------------------------------
    def batch_loss(self, index: int, params: dict[str, Tensor] | None = None) -> Tensor:
        """Batch ``index``'s summed loss divided by the total count (its share of L)."""
        x, y = self.batches[index]
        out = functional_call(self.model, params or self.params, (x,))
        losses, _ = self.objective.output_losses(out, y)
        return losses.sum() / self.total_count

    @_retry_on_oom
    def gradient(self, names: Sequence[str] | None = None) -> Tensor:
        """∇L over ``names`` (all parameters by default), flat, without a second-order graph."""
        self._require_session()
        layout = self.layout(list(names or self.names))
        bases = layout.bases
        tensors = [self.params[n] for n in bases]
        total = torch.zeros(layout.numel, dtype=self.dtype, device=self.device)
        for b in range(len(self.batches)):
            grads = torch.autograd.grad(self.batch_loss(b), tensors, allow_unused=True)
            total += layout.gather(dict(zip(bases, grads, strict=True)))
        return self._reduce(total)

    def _graph_grads(self, b: int, names: Sequence[str]) -> list[Tensor | None]:
        """First-order gradients of batch b with their graph (create_graph=True)."""
        if self.cache_graph:
            if b not in self._cache:
                tensors = [self.params[n] for n in self.params]
                grads = torch.autograd.grad(
                    self.batch_loss(b), tensors, create_graph=True, allow_unused=True
                )
                self._cache[b] = dict(zip(self.params, grads, strict=True))
            return [self._cache[b][n] for n in names]
        tensors = [self.params[n] for n in names]
        return list(
            torch.autograd.grad(self.batch_loss(b), tensors, create_graph=True, allow_unused=True)
        )

    def release_graph(self) -> None:
        """Drop the cached first-backward graphs (they are rebuilt on demand)."""
        self._cache.clear()

    # -- second-order ------------------------------------------------------------------
    @_retry_on_oom
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
        v_full = col_layout.expand(vectors)
        col_bases = list(v_full)
        row_bases = row_layout.bases
        row_tensors = [self.params[n] for n in row_bases]
        lead = (k,) if batched else ()
        out_shape = (k, row_layout.numel) if batched else (row_layout.numel,)
        total = torch.zeros(out_shape, dtype=self.dtype, device=self.device)
        retain = self.cache_graph
        for b in range(len(self.batches)):
            grads = self._graph_grads(b, col_bases)
            pairs = [
                (g, v_full[n])
                for g, n in zip(grads, col_bases, strict=True)
                if g is not None and g.requires_grad
            ]
            if not pairs:
                continue
            if batched and k == 1:
                pairs = [(g, v[0]) for g, v in pairs]
            outs = torch.autograd.grad(
                [g for g, _ in pairs],
                row_tensors,
                grad_outputs=[v for _, v in pairs],
                retain_graph=retain,
                allow_unused=True,
                is_grads_batched=batched and k > 1,
            )
            if batched and k == 1:
                outs = [o.unsqueeze(0) if o is not None else None for o in outs]
            total += row_layout.gather(dict(zip(row_bases, outs, strict=True)), lead)
        self.n_hvp += k
        return self._reduce(total)

    def block_hvp(self, names: Sequence[str], vectors: Tensor) -> Tensor:
        """Diagonal-block product H_BB · v (vectors (n_B,) or (k, n_B))."""
        return self.hvp(names, names, vectors)

    def multi_block_hvp(
        self, blocks: Sequence[Sequence[str]], vectors: Sequence[Tensor]
    ) -> list[Tensor]:
        """H_{B_j B_j} v_j for several blocks in one batched second backward
        (:meth:`multi_hvp` with rows = cols = B_j)."""
        return self.multi_hvp([(block, block, v) for block, v in zip(blocks, vectors, strict=True)])

    @_retry_on_oom
    def multi_hvp(
        self, requests: Sequence[tuple[Sequence[str], Sequence[str], Tensor]]
    ) -> list[Tensor]:
        """H[rows_j, cols_j] · v_j for several (rows, cols, v) in ONE batched second backward.

        Entry j of the batch carries v_j on the parameters of cols_j and zeros elsewhere
        (``is_grads_batched``); its product over the union of every request's rows, restricted
        to rows_j, is H[rows_j, cols_j] v_j (the other rows are computed and discarded). Each
        entry is the product :meth:`hvp` computes, up to the order of its sums; a single
        request goes through the batched backward too, so that an entry does not depend on
        how many others share its batch (docs/numerics.md#lockstep). Blocks may share
        parameter tensors (slices of one tensor) or overlap. An operation without a batching
        rule raises here (RuntimeError); ``lockstep.py`` then falls back to one :meth:`hvp`
        per request.
        """
        self._require_session()
        k = len(requests)
        if k == 0:
            return []
        col_layouts = [self.layout(list(c)) for _, c, _ in requests]
        row_layouts = [self.layout(list(r)) for r, _, _ in requests]
        col_bases = list(dict.fromkeys(n for lay in col_layouts for n in lay.bases))
        row_bases = list(dict.fromkeys(n for lay in row_layouts for n in lay.bases))
        stacked = {
            n: torch.zeros(k, *self.params[n].shape, dtype=self.dtype, device=self.device)
            for n in col_bases
        }
        for j, ((_, _, v), lay) in enumerate(zip(requests, col_layouts, strict=True)):
            if v.shape[-1] != lay.numel:
                raise ValueError(f"request {j}: vector length {v.shape[-1]} != {lay.numel}")
            for n, part in lay.expand(v.reshape(-1).to(self.device, self.dtype)).items():
                stacked[n][j] += part
        row_tensors = [self.params[n] for n in row_bases]
        totals: list[Tensor | None] = [None] * len(row_bases)
        retain = self.cache_graph
        for b in range(len(self.batches)):
            check_cancel("batched Hessian product")
            grads = self._graph_grads(b, col_bases)
            pairs = [
                (g, stacked[n])
                for g, n in zip(grads, col_bases, strict=True)
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
                is_grads_batched=True,
            )
            for i, o in enumerate(outs):
                if o is not None:
                    totals[i] = o if totals[i] is None else totals[i] + o
        full = {
            n: (
                t
                if t is not None
                else torch.zeros(k, *self.params[n].shape, dtype=self.dtype, device=self.device)
            )
            for n, t in zip(row_bases, totals, strict=True)
        }
        flat_rows = [
            lay.gather({n: full[n][j] for n in lay.bases}) for j, lay in enumerate(row_layouts)
        ]
        lengths = [f.numel() for f in flat_rows]
        reduced = self._reduce(torch.cat(flat_rows))
        self.n_hvp += k
        return list(torch.split(reduced, lengths))

    # -- Gauss–Newton ----------------------------------------------------------------------
    @_retry_on_oom
    def ggn_vector(self, names: Sequence[str], v: Tensor) -> Tensor:
        """G_BB v = Σ_b J_bᵀ H_out,b J_b v for the block ``names`` (flat (n_B,) vector).

        Petrov et al. 2025, eq. "gauss_decomposition": H = Jᵀ(∂²ℓ/∂f²)J + (∂ℓ/∂f ⊗ I)∂²f/∂w²
        = H_o (GGN) + H_f (functional). J v by forward mode (``jvp``) through the model, the
        loss's output Hessian by double backward on the outputs, Jᵀ · by a vjp.
        """
        self._require_session()
        layout = self.layout(list(names))
        bases = layout.bases
        tangents_full = layout.expand(v.to(self.device, self.dtype))
        frozen = {n: p.detach() for n, p in self.params.items()}
        primals = tuple(frozen[n] for n in bases)
        tangents = tuple(tangents_full[n] for n in bases)
        total = torch.zeros(layout.numel, dtype=self.dtype, device=self.device)
        for x, y in self.batches:

            def forward(*block: Tensor, x: Tensor = x) -> Tensor:
                params = dict(frozen)
                params.update(zip(bases, block, strict=True))
                return functional_call(self.model, params, (x,))

            out, j_v = jvp(forward, primals, tangents)
            out_d = out.detach().requires_grad_(True)
            losses, _ = self.objective.output_losses(out_d, y)
            g_out = torch.autograd.grad(losses.sum() / self.total_count, out_d, create_graph=True)[
                0
            ]
            h_jv = torch.autograd.grad(g_out, out_d, grad_outputs=j_v.detach())[0]
            block = [t.clone().requires_grad_(True) for t in primals]
            out2 = forward(*block)
            grads = torch.autograd.grad(out2, block, grad_outputs=h_jv, allow_unused=True)
            total += layout.gather(dict(zip(bases, grads, strict=True)))
        self.n_hvp += 1
        return self._reduce(total)

    def functional_vector(self, names: Sequence[str], v: Tensor) -> Tensor:
        """(H − G)_BB v: the functional part of the block (Petrov et al. 2025, H_f)."""
        return self.block_hvp(names, v) - self.ggn_vector(names, v)

    # -- per-example -------------------------------------------------------------------
    def example_losses(
        self, inputs: Tensor, targets: Tensor, params: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Per-example summed loss s_i and count c_i of one tensor batch (no graph)."""
        with torch.no_grad():
            out = functional_call(self.model, params or self.params, (inputs,))
            return self.objective.output_losses(out, targets)

    def per_example_gradients(
        self,
        inputs: Tensor,
        targets: Tensor,
        names: Sequence[str] | None = None,
        *,
        method: str = "auto",
    ) -> tuple[Tensor, Tensor, str]:
        """∇s_i (rows, fp64 on the CPU) over ``names`` for every example of one batch, with
        the counts c_i and the method used ("vmap", or "loop" where an operation has no
        batching rule). McCandlish et al. 2018 §2.2: the per-example gradients g_i."""
        self._require_session(batches=False)
        layout = self.layout(list(names or self.names))
        bases = layout.bases
        if method in ("vmap", "auto"):
            try:
                return (*self._vmap_gradients(layout, bases, inputs, targets), "vmap")
            except (RuntimeError, NotImplementedError):
                if method == "vmap":
                    raise
        rows, counts = [], []
        tensors = [self.params[n] for n in bases]
        for i in range(inputs.shape[0]):
            check_cancel("per-example gradients")
            out = functional_call(self.model, self.params, (inputs[i : i + 1],))
            s, c = self.objective.output_losses(out, targets[i : i + 1])
            g = torch.autograd.grad(s.sum(), tensors, allow_unused=True)
            rows.append(layout.gather(dict(zip(bases, g, strict=True))).detach())
            counts.append(c.sum().detach())
        return (
            torch.stack(rows).to("cpu", torch.float64),
            torch.stack(counts).to("cpu", torch.float64),
            "loop",
        )

    def _vmap_gradients(self, layout, bases, x, y) -> tuple[Tensor, Tensor]:
        frozen = {n: p.detach() for n, p in self.params.items()}

        def example_sum(block: dict[str, Tensor], xi: Tensor, yi: Tensor):
            params = dict(frozen)
            params.update(block)
            out = functional_call(self.model, params, (xi.unsqueeze(0),))
            s, c = self.objective.output_losses(out, yi.unsqueeze(0))
            return s.sum(), c.sum()

        per_example = torch.func.vmap(
            torch.func.grad(example_sum, has_aux=True), in_dims=(None, 0, 0)
        )
        grads, counts = per_example({n: frozen[n] for n in bases}, x, y)
        flat = layout.gather(grads, (x.shape[0],))
        return flat.detach().to("cpu", torch.float64), counts.detach().to("cpu", torch.float64)


def batches_of(inputs: Tensor, targets: Tensor, batch_size: int | None) -> list[tuple]:
    """Consecutive micro-batches in order (the last one kept even if short)."""
    n = int(inputs.shape[0])
    size = n if not batch_size or batch_size >= n else int(batch_size)
    return [(inputs[i : i + size], targets[i : i + size]) for i in range(0, n, size)]


def iter_chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))
