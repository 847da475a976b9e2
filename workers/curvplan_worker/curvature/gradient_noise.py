"""Gradient-noise statistics at w*: |G|², tr Σ, GᵀHG, tr(HΣ), B_simple, B_noise.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", §2.2 and App. A; paper
docs/formulas.md#batch-size) define, for the true gradient G, the per-example gradient covariance Σ
and the
Hessian H,  B_simple = tr Σ / |G|²  and  B_noise = tr(HΣ) / GᵀHG.

Estimators (all unbiased; U-statistics over the per-example gradients g_i of a sample A):

* |G|²      ≈ (1/(n(n−1))) Σ_{i≠j} g_iᵀg_j  =  |ḡ|² − tr Σ̂/n
* tr Σ      ≈ (1/(n−1)) Σ_i |g_i − ḡ|²
* GᵀHG      ≈ (1/(n(n−1))) Σ_{i≠j} g_iᵀH_B g_j  =  ḡᵀH_Bḡ − tr(H_BΣ̂)/n
* tr(HΣ)    ≈ (1/(n−1)) Σ_i (g_i − ḡ)ᵀH_B(g_i − ḡ)

with H_B the Hessian on an INDEPENDENT batch B (disjoint from A), so that E[H_B] = H is
independent of the gradients (docs/formulas.md#batch-size: otherwise the quadratic forms are
biased).
All four are functions of the Gram matrices K = [g_iᵀg_j] and M = [g_iᵀH_B g_j]; M needs one
Hessian-vector product per gradient example. Standard errors: a jackknife over the gradient
examples, plus for the H terms the spread over disjoint groups of B.

Examples are sequences, not tokens (docs/numerics.md#negative-estimates): the per-example gradient
is
g_i = ∇s_i / c̄ with s_i the example's summed loss and c̄ the mean count over A, so that
ḡ = Σ∇s_i / Σc_i is exactly the gradient of the mean token loss — the normalisation of the
engine's Hessian. (With unequal counts the estimators are ratio estimators: consistent, and
exactly unbiased when every example has the same count.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import torch
from torch import Tensor, nn

from curvplan_core.cost_model import NOISE_HESSIAN_GROUPS, NOISE_MAX_EXAMPLES
from curvplan_worker.curvature.cancel import check_cancel
from curvplan_worker.curvature.device import eval_mode
from curvplan_worker.curvature.noise_stream import (
    GroupedGradientSums,
    selection_bias,
    stream_estimates,
)
from curvplan_worker.curvature.objective import Objective
from curvplan_worker.curvature.operator import CurvatureEngine, iter_chunks
from curvplan_worker.curvature.samples import (
    check_batch_size,
    check_sample,
    device_dtype,
    numel,
    select_parameters,
    to_device,
)

ExampleLossObjective = Objective

__all__ = [
    "DEFAULT_MAX_GRAD_EXAMPLES",
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_MAX_HESSIAN_EXAMPLES",
    "DEFAULT_NOISE_BUDGET",
    "NOISE_TARGET_FACTOR",
    "HessianForms",
    "NoiseEstimates",
    "PerExampleGradients",
    "default_series_sizes",
    "gradient_noise_from_sample",
    "gradient_noise_statistics",
    "hessian_quadratic_forms",
    "noise_estimates_from_gram",
    "per_example_gradients",
    "two_batch_series",
]

GradientMethod = Literal["vmap", "loop", "auto"]

# the split's defaults are the cost model's, which prices this stage before it runs
# (``cost_model.noise_split``): one rule for both
DEFAULT_MAX_GRAD_EXAMPLES = NOISE_MAX_EXAMPLES
DEFAULT_MAX_HESSIAN_EXAMPLES = NOISE_MAX_EXAMPLES
DEFAULT_MAX_GROUPS = 64
DEFAULT_NOISE_BUDGET = 1024


# ---------------------------------------------------------------------------------------------
# Per-example gradients
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PerExampleGradients:
    """g_i = ∇s_i / c̄ (rows, fp64) over ``param_names``; mean(g) = ∇(Σs/Σc)."""

    grads: Tensor
    counts: Tensor
    mean_count: float
    param_names: list[str]
    method: str


def per_example_gradients(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    *,
    param_names: Sequence[str] | None = None,
    chunk_size: int = 32,
    method: GradientMethod = "auto",
) -> PerExampleGradients:
    """Per-example gradients g_i = ∇s_i(w*) / c̄ by ``torch.func.vmap(torch.func.grad(...))``.

    The per-example gradients of McCandlish et al. 2018 §2.2 (G = E[g_i], Σ = Cov(g_i)), with
    examples = sequences and the engine's loss normalisation (module docstring). Chunks of
    ``chunk_size`` examples bound the memory (chunk_size × D activations-gradients); the result
    is (n, D) fp64. ``method`` "loop" uses one ``autograd.grad`` per example (the reference);
    "auto" uses vmap and falls back to the loop if an operation has no batching rule.
    """
    n = check_sample(inputs, targets)
    check_batch_size(chunk_size)
    if method not in ("vmap", "loop", "auto"):
        raise ValueError(f"method: must be 'vmap', 'loop' or 'auto', got {method!r}")
    base = select_parameters(model, param_names)
    device, _ = device_dtype(base)
    dim = numel(base)
    grads = torch.empty(n, dim, dtype=torch.float64)
    counts = torch.empty(n, dtype=torch.float64)
    used = method
    names = list(base)
    with CurvatureEngine(model, objective, param_names=names) as engine:
        for sl in iter_chunks(n, chunk_size):
            check_cancel("per-example gradients")
            x = to_device(inputs[sl], device)
            y = to_device(targets[sl], device)
            g, c, used = engine.per_example_gradients(
                x, y, names, method="loop" if used == "loop" else method
            )
            grads[sl] = g
            counts[sl] = c
    if bool((counts <= 0).any()):
        bad = torch.nonzero(counts <= 0).flatten()[:10].tolist()
        raise ValueError(f"targets: examples {bad} have no loss terms (count 0, e.g. all ignored)")
    mean_count = float(counts.mean())
    return PerExampleGradients(
        grads=grads / mean_count,
        counts=counts,
        mean_count=mean_count,
        param_names=list(base),
        method=used,
    )


# ---------------------------------------------------------------------------------------------
# Hessian quadratic forms on an independent batch
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HessianForms:
    """Q_b = V S_b Vᵀ per group b, S_b the Hessian of the group's SUMMED loss Σ_{j∈b} s_j.

    H_B = Σ_b S_b / Σ_b C_b (the Hessian of the batch's mean token loss), H_b = S_b / C_b.
    """

    forms: Tensor  # (m, k, k) fp64
    counts: Tensor  # (m,) fp64: C_b, loss terms per group
    n_products: int

    @property
    def total(self) -> Tensor:
        """V H_B Vᵀ."""
        return self.forms.sum(dim=0) / self.counts.sum()


def hessian_quadratic_forms(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    vectors: Tensor,
    *,
    param_names: Sequence[str] | None = None,
    batch_size: int = 32,
    n_groups: int = 4,
) -> HessianForms:
    """V H_b Vᵀ for k vectors (rows of V, (k, D)) on ``n_groups`` disjoint groups of the batch.

    HVPs by double backward (never ``torch.func.hessian`` / ``jacrev``-in-``jvp``:
    docs/numerics.md#double-backward),
    one forward graph per micro-batch reused for all k vectors (k second backwards). This is
    the H_B of McCandlish et al. 2018 §2.2 evaluated on a batch independent of the gradients
    (docs/formulas.md#batch-size); the group split gives the batch-to-batch variability of H.
    """
    n = check_sample(inputs, targets)
    check_batch_size(batch_size)
    if n_groups < 1:
        raise ValueError(f"n_groups: must be ≥ 1, got {n_groups}")
    base = select_parameters(model, param_names)
    dim = numel(base)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"vectors: expected shape (k, {dim}), got {tuple(vectors.shape)}")
    device, dtype = device_dtype(base)
    v64 = vectors.to(torch.float64).cpu()
    v_model = vectors.to(device, dtype)
    k = vectors.shape[0]
    names = list(base)
    groups = [g for g in torch.tensor_split(torch.arange(n), min(n_groups, n)) if g.numel() > 0]
    forms = torch.zeros(len(groups), k, k, dtype=torch.float64)
    counts = torch.zeros(len(groups), dtype=torch.float64)
    n_products = 0
    for b, group in enumerate(groups):
        for sl in iter_chunks(group.numel(), batch_size):
            idx = group[sl]
            x = to_device(inputs[idx], device)
            y = to_device(targets[idx], device)
            # the operator on this micro-batch differentiates s/c (its summed loss over its
            # count c); the group's form needs the SUMMED loss: S v = c · H v
            with CurvatureEngine(model, objective, [(x, y)], param_names=names) as engine:
                c = engine.total_count
                rows = []
                for j in range(k):
                    check_cancel("Hessian quadratic forms")
                    rows.append(engine.hvp(names, names, v_model[j]))
                hv = torch.stack(rows).to("cpu", torch.float64)
            n_products += k
            forms[b] += c * (v64 @ hv.T)
            counts[b] += c
    forms = 0.5 * (forms + forms.transpose(1, 2))
    return HessianForms(forms=forms, counts=counts, n_products=n_products)


# ---------------------------------------------------------------------------------------------
# Estimators from Gram matrices
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseEstimates:
    """Unbiased estimates with standard errors (None where they cannot be formed)."""

    grad_sq_norm: float
    grad_sq_norm_se: float | None
    trace_sigma: float
    trace_sigma_se: float | None
    gHg: float | None
    gHg_se: float | None
    trace_h_sigma: float | None
    trace_h_sigma_se: float | None
    raw_grad_sq_norm: float
    hessian_se_includes_batch: bool


def _offdiag_mean(q: Tensor) -> Tensor:
    """(1/(n(n−1))) Σ_{i≠j} Q_ij over the leading (…, n, n) matrices."""
    n = q.shape[-1]
    total = q.sum(dim=(-2, -1))
    diag = torch.diagonal(q, dim1=-2, dim2=-1).sum(dim=-1)
    return (total - diag) / (n * (n - 1))


def _centered_trace(q: Tensor) -> Tensor:
    """(1/(n−1)) (tr Q − sum(Q)/n): the sample-covariance trace of the quadratic form."""
    n = q.shape[-1]
    total = q.sum(dim=(-2, -1))
    diag = torch.diagonal(q, dim1=-2, dim2=-1).sum(dim=-1)
    return (diag - total / n) / (n - 1)


def _jackknife_se(q: Tensor) -> tuple[float, float] | None:
    """Leave-one-example-out jackknife standard errors of (_offdiag_mean, _centered_trace)."""
    n = q.shape[0]
    if n < 3:
        return None
    total = q.sum()
    diag = torch.diagonal(q)
    rows = q.sum(dim=1)
    total_loo = total - 2 * rows + diag
    diag_loo = diag.sum() - diag
    m = n - 1
    offdiag = (total_loo - diag_loo) / (m * (m - 1))
    centered = (diag_loo - total_loo / m) / (m - 1)

    def se(values: Tensor) -> float:
        return float(torch.sqrt((n - 1) / n * ((values - values.mean()) ** 2).sum()))

    return se(offdiag), se(centered)


def noise_estimates_from_gram(
    gram: Tensor, hessian_forms: HessianForms | None = None
) -> NoiseEstimates:
    """|G|², tr Σ, GᵀHG, tr(HΣ) from K = [g_iᵀg_j] and M = [g_iᵀH_B g_j] (module docstring).

    McCandlish et al. 2018 §2.2 quantities by U-statistics (docs/formulas.md#batch-size). Standard
    errors: the
    jackknife over gradient examples; for the H terms combined (in quadrature) with the
    weighted between-group spread of the estimate over the groups of B when there are ≥ 2.
    """
    k = gram.to(torch.float64)
    n = k.shape[0]
    if k.ndim != 2 or k.shape[1] != n:
        raise ValueError(f"gram: expected a square (n, n) matrix, got {tuple(k.shape)}")
    if n < 2:
        raise ValueError("gram: the unbiased estimators need at least 2 gradient examples")
    jk = _jackknife_se(k)
    gHg = trace_h_sigma = gHg_se = th_se = None
    with_batch = False
    if hessian_forms is not None:
        forms = hessian_forms.forms
        if forms.shape[-1] != n:
            raise ValueError(
                f"hessian_forms: built for {forms.shape[-1]} vectors but the Gram matrix has {n}"
            )
        m_total = hessian_forms.total
        gHg = float(_offdiag_mean(m_total))
        trace_h_sigma = float(_centered_trace(m_total))
        jm = _jackknife_se(m_total)
        var_a = (jm[0] ** 2, jm[1] ** 2) if jm is not None else None
        groups = forms.shape[0]
        if groups >= 2:
            weights = hessian_forms.counts / hessian_forms.counts.sum()
            per_group = forms / hessian_forms.counts.view(-1, 1, 1)
            spread = []
            for stat, total in ((_offdiag_mean, gHg), (_centered_trace, trace_h_sigma)):
                values = stat(per_group)
                spread.append(
                    float(groups / (groups - 1) * (weights**2 * (values - total) ** 2).sum())
                )
            with_batch = True
        else:
            spread = [0.0, 0.0]
        if var_a is not None:
            gHg_se = math.sqrt(var_a[0] + spread[0])
            th_se = math.sqrt(var_a[1] + spread[1])
    return NoiseEstimates(
        grad_sq_norm=float(_offdiag_mean(k)),
        grad_sq_norm_se=jk[0] if jk is not None else None,
        trace_sigma=float(_centered_trace(k)),
        trace_sigma_se=jk[1] if jk is not None else None,
        gHg=gHg,
        gHg_se=gHg_se,
        trace_h_sigma=trace_h_sigma,
        trace_h_sigma_se=th_se,
        raw_grad_sq_norm=float(k.sum()) / n**2,
        hessian_se_includes_batch=with_batch,
    )


# ---------------------------------------------------------------------------------------------
# Two-batch-size series (McCandlish App. A)
# ---------------------------------------------------------------------------------------------


class TwoBatchSeries(TypedDict):
    """McCandlish App. A's two-batch series (:func:`two_batch_series`): per disjoint big batch,
    |G_B|² (and G_BᵀH G_B with the Hessian) at both sizes, and the App. A estimates."""

    b_small: int
    b_big: int
    grad_sq_norm_small: list[float]
    grad_sq_norm_big: list[float]
    gHg_small: NotRequired[list[float]]
    gHg_big: NotRequired[list[float]]
    app_a_grad_sq_norm: float
    app_a_trace_sigma: float


class GradientNoiseStats(TypedDict):
    """The gradient-noise statistics (:func:`gradient_noise_statistics`): |G|², tr Σ, GᵀHG,
    tr(HΣ) with standard errors, B_simple, B_noise and their selection bias, |ḡ|, how the
    sample was used; :func:`gradient_noise_from_sample` adds the split (seed and indices)."""

    grad_sq_norm: float
    grad_sq_norm_se: float | None
    trace_sigma: float
    trace_sigma_se: float | None
    gHg: float | None
    gHg_se: float | None
    trace_h_sigma: float | None
    trace_h_sigma_se: float | None
    log_b_simple_se: float | None
    log_b_noise_se: float | None
    jackknife_groups: int | None
    group_size: int
    b_simple_p_defined: float | None
    b_simple_median_ratio: float | None
    b_noise_p_defined: float | None
    b_noise_median_ratio: float | None
    n_samples: int
    n_available: int
    stop_reason: str
    n_hessian_samples: int
    n_hessian_groups: int
    hessian_se_includes_batch: bool
    b_simple: float | None
    b_noise: float | None
    gradient_norm: float
    raw_grad_sq_norm: float
    rms_deviation: float
    mean_count: float
    n_parameters: int
    n_hvp_products: int
    gradient_method: str
    series: TwoBatchSeries | None
    seed: NotRequired[int]
    grad_indices: NotRequired[list[int]]
    hessian_indices: NotRequired[list[int]]


def _batch_series(q: Tensor, n: int, b_small: int, b_big: int) -> tuple[list[float], list[float]]:
    """(small, big) series of the quadratic form ``q`` over the disjoint big batches."""
    per_big = b_big // b_small
    small_series: list[float] = []
    big_series: list[float] = []
    for t in range(n // b_big):
        start = t * b_big
        big = slice(start, start + b_big)
        big_series.append(float(q[big, big].sum()) / b_big**2)
        smalls = [
            float(q[s, s].sum()) / b_small**2
            for s in (slice(start + j * b_small, start + (j + 1) * b_small) for j in range(per_big))
        ]
        small_series.append(sum(smalls) / len(smalls))
    return small_series, big_series


def two_batch_series(
    gram: Tensor, b_small: int, b_big: int, hessian_gram: Tensor | None = None
) -> TwoBatchSeries:
    """The App. A series from disjoint micro-batches of the gradient sample (McCandlish 2018).

    Entry t uses the t-th disjoint big batch (b_big consecutive examples):
    ``grad_sq_norm_big[t]`` = |G_{B_big}|² and ``grad_sq_norm_small[t]`` = the mean over its
    ⌊b_big/b_small⌋ disjoint micro-batches of |G_{B_small}|², with G_B the mean of the batch's
    g_i. With ``hessian_gram`` (M = [g_iᵀH_B g_j]) also ``gHg_small``/``gHg_big`` = G_BᵀH G_B
    (docs/formulas.md#batch-size h(B)). Plus the App. A estimates computed from the series means.
    """
    n = gram.shape[0]
    if not isinstance(b_small, int) or b_small < 1:
        raise ValueError(f"b_small: must be a positive integer, got {b_small!r}")
    if not isinstance(b_big, int) or b_big < 1:
        raise ValueError(f"b_big: must be a positive integer, got {b_big!r}")
    if b_small == b_big:
        raise ValueError("b_big: must differ from b_small (App. A divides by B_big − B_small)")
    if b_small > b_big:
        raise ValueError(f"b_small: must be smaller than b_big ({b_small} ≥ {b_big})")
    if b_big > n:
        raise ValueError(f"b_big: {b_big} exceeds the {n} gradient examples")
    grad_small, grad_big = _batch_series(gram.to(torch.float64), n, b_small, b_big)
    small = sum(grad_small) / len(grad_small)
    big = sum(grad_big) / len(grad_big)
    app_a_grad_sq_norm = (b_big * big - b_small * small) / (b_big - b_small)
    app_a_trace_sigma = (small - big) / (1.0 / b_small - 1.0 / b_big)
    if hessian_gram is None:
        return {
            "b_small": b_small,
            "b_big": b_big,
            "grad_sq_norm_small": grad_small,
            "grad_sq_norm_big": grad_big,
            "app_a_grad_sq_norm": app_a_grad_sq_norm,
            "app_a_trace_sigma": app_a_trace_sigma,
        }
    hessian_small, hessian_big = _batch_series(hessian_gram.to(torch.float64), n, b_small, b_big)
    return {
        "b_small": b_small,
        "b_big": b_big,
        "grad_sq_norm_small": grad_small,
        "grad_sq_norm_big": grad_big,
        "gHg_small": hessian_small,
        "gHg_big": hessian_big,
        "app_a_grad_sq_norm": app_a_grad_sq_norm,
        "app_a_trace_sigma": app_a_trace_sigma,
    }


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------


def _raw_gradient_chunks(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    order: Tensor,
    base: Mapping[str, Tensor],
    chunk_size: int,
    method: GradientMethod,
) -> Iterator[tuple[Tensor, Tensor, str]]:
    """(∇s_i rows fp64 on CPU, counts, method used) per chunk of ``order`` (unnormalised)."""
    device, _ = device_dtype(base)
    names = list(base)
    used = method
    with CurvatureEngine(model, objective, param_names=names) as engine:
        for start in range(0, order.numel(), chunk_size):
            check_cancel("per-example gradients")
            idx = order[start : start + chunk_size]
            x = to_device(inputs[idx], device)
            y = to_device(targets[idx], device)
            g, c, used = engine.per_example_gradients(
                x, y, names, method="loop" if used == "loop" else method
            )
            if bool((c <= 0).any()):
                bad = idx[torch.nonzero(c <= 0).flatten()[:10]].tolist()
                raise ValueError(
                    f"targets: examples {bad} have no loss terms (count 0, e.g. all ignored)"
                )
            yield g, c, used


#: The adaptive sampler stops once the log-ratio interval of the noise scale lies within this
#: factor of the estimate (both ends): exp(t·se(log B)) ≤ NOISE_TARGET_FACTOR.
NOISE_TARGET_FACTOR = 2.0


def _half_width_factor(se_log: float | None, groups: int, confidence: float) -> float:
    """exp(t_{groups−1}·se(log B)): how far (as a factor) the interval's ends lie from B."""
    from scipy import stats as sps

    if se_log is None or groups < 3:
        return math.inf
    return math.exp(min(float(sps.t.ppf((1 + confidence) / 2, groups - 1)) * se_log, 700.0))


PrecisionCheck = Callable[[GroupedGradientSums], bool]


def simple_precise(confidence: float, factor: float = NOISE_TARGET_FACTOR) -> PrecisionCheck:
    """The stopping test on B_simple alone: its log-ratio interval (delete-a-group jackknife,
    Student-t with groups − 1 dof; McCandlish et al. 2018 §2.2, B_simple = tr Σ/|G|²) lies
    within ``factor`` of the estimate. Undefined B_simple (|G|² ≤ 0 in a replicate) fails."""

    def check(acc: GroupedGradientSums) -> bool:
        _, n_b, q_b = acc.active()
        if n_b.numel() < 3:
            return False
        est = stream_estimates(acc.gram(), n_b, q_b)
        return _half_width_factor(est.log_b_simple_se, est.groups, confidence) <= factor

    return check


def stream_gradient_sums(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    *,
    param_names: Sequence[str] | None = None,
    chunk_size: int = 32,
    method: GradientMethod = "auto",
    max_groups: int = DEFAULT_MAX_GROUPS,
    adaptive: bool = False,
    min_examples: int = DEFAULT_MAX_GRAD_EXAMPLES,
    confidence: float = 0.95,
    precise: PrecisionCheck | None = None,
) -> tuple[GroupedGradientSums, list[str], str, str]:
    """Per-example gradients streamed into ``GroupedGradientSums`` (O(max_groups · D) memory).

    Non-adaptive: every example. Adaptive: examples in order, looking at n = min_examples,
    2·min_examples, 4·min_examples, … (few looks) and stopping once ``precise(sums)`` holds
    (default :func:`simple_precise`: the interval of B_simple within a factor
    ``NOISE_TARGET_FACTOR`` of it) or the examples are spent. A significant |G|² alone is not
    enough: at the first look where it is, B_simple's interval still spans decades.
    Returns (sums, parameter names, gradient method, stop reason: "precise" | "budget" |
    "fixed").
    """
    n = check_sample(inputs, targets)
    check_batch_size(chunk_size)
    if method not in ("vmap", "loop", "auto"):
        raise ValueError(f"method: must be 'vmap', 'loop' or 'auto', got {method!r}")
    base = select_parameters(model, param_names)
    acc = GroupedGradientSums(numel(base), max_groups=max_groups, expected=n)
    look = max(2, min(min_examples, n))
    used = method
    stop = "fixed" if not adaptive else "budget"
    check = precise if precise is not None else simple_precise(confidence)
    with eval_mode(model):
        for g, c, chunk_method in _raw_gradient_chunks(
            model, objective, inputs, targets, torch.arange(n), base, chunk_size, method
        ):
            used = chunk_method
            acc.add(g, c)
            if adaptive and acc.n >= look:
                if check(acc):
                    stop = "precise"
                    break
                while look <= acc.n:
                    look *= 2
    return acc, list(base), used, stop


def gradient_noise_statistics(
    model: nn.Module,
    objective: ExampleLossObjective,
    grad_inputs: Tensor,
    grad_targets: Tensor,
    hessian_inputs: Tensor | None = None,
    hessian_targets: Tensor | None = None,
    *,
    param_names: Sequence[str] | None = None,
    batch_size: int = 32,
    n_hessian_groups: int = NOISE_HESSIAN_GROUPS,
    b_small: int | None = None,
    b_big: int | None = None,
    method: GradientMethod = "auto",
    max_groups: int = DEFAULT_MAX_GROUPS,
    adaptive: bool = False,
    min_examples: int = DEFAULT_MAX_GRAD_EXAMPLES,
    confidence: float = 0.95,
    bias_draws: int = 1000,
    seed: int = 0,
) -> GradientNoiseStats:
    """|G|², tr Σ, GᵀHG, tr(HΣ) with standard errors, B_simple, B_noise, |ḡ| (JSON-able).

    McCandlish et al. 2018 §2.2 (B_simple = tr Σ/|G|², B_noise = tr(HΣ)/GᵀHG) and App. A (the
    two-batch series), with the Hessian on the independent batch (``hessian_inputs``,
    ``hessian_targets``; must be different examples from the gradient batch — the caller's
    responsibility; ``gradient_noise_from_sample`` draws a disjoint split). Without a Hessian
    batch only |G|² and tr Σ are estimated. ``gradient_norm`` is the raw |ḡ| at w* (Petrov et
    al. 2025, Assumption 1 says it is 0); ``rms_deviation`` is √(mean_i |g_i − ḡ|²), what the
    Assumption 1 check needs (every per-example gradient must vanish, not only the mean).

    The gradients are streamed (``noise_stream``): memory is ``max_groups`` × D fp64 whatever
    the number of examples; with at most ``max_groups`` examples every statistic equals the
    Gram-matrix form (``noise_estimates_from_gram``) and its leave-one-out jackknife. The
    Hessian terms use one Hessian-vector product per group (micro-batch gradients). Also:
    ``log_b_simple_se``/``log_b_noise_se`` (jackknife of the log-ratio on the same gradients),
    ``jackknife_groups``, and the selection bias of the ratios (``b_*_p_defined``,
    ``b_*_median_ratio``, ``noise_stream.selection_bias``). ``adaptive`` adds examples until the
    log-ratio intervals of B_simple and (with a Hessian batch) B_noise both lie within a factor
    ``NOISE_TARGET_FACTOR`` of their estimates, or the examples run out
    (``stream_gradient_sums``). Σ is the covariance of
    PER-EXAMPLE (per-sequence) gradients. B ratios are None where the denominator is ≤ 0 (e.g.
    |G|² at w*, docs/numerics.md#negative-estimates: never clamped).
    """
    n_total = check_sample(grad_inputs, grad_targets)
    if n_total < 2:
        raise ValueError("grad_inputs: the unbiased estimators need at least 2 examples")
    if (hessian_inputs is None) != (hessian_targets is None):
        raise ValueError("hessian_inputs/hessian_targets: give both or neither")
    simple_ok = simple_precise(confidence)
    cached: dict[tuple[int, int], HessianForms] = {}  # the forms at the latest (n, groups)

    def forms_for(acc: GroupedGradientSums) -> HessianForms:
        key = (acc.n, acc.n_groups)
        if key not in cached:
            assert hessian_inputs is not None and hessian_targets is not None
            cached.clear()
            cached[key] = hessian_quadratic_forms(
                model,
                objective,
                hessian_inputs,
                hessian_targets,
                acc.active()[0] / acc.mean_count,
                param_names=param_names,
                batch_size=batch_size,
                n_groups=n_hessian_groups,
            )
        return cached[key]

    def both_precise(acc: GroupedGradientSums) -> bool:
        """B_simple's interval within the factor first (cheap); then B_noise's, whose
        Hessian forms cost one HVP per group and Hessian micro-batch at this look."""
        if not simple_ok(acc):
            return False
        if hessian_inputs is None:
            return True
        scale = 1.0 / acc.mean_count
        forms = forms_for(acc)
        _, n_b, q_b = acc.active()
        est = stream_estimates(
            acc.gram() * scale**2,
            n_b,
            q_b * scale**2,
            hessian_forms=forms.forms,
            hessian_counts=forms.counts,
        )
        return _half_width_factor(est.log_b_noise_se, est.groups, confidence) <= NOISE_TARGET_FACTOR

    acc, _, used, stop = stream_gradient_sums(
        model,
        objective,
        grad_inputs,
        grad_targets,
        param_names=param_names,
        chunk_size=batch_size,
        method=method,
        max_groups=max_groups,
        adaptive=adaptive,
        min_examples=min_examples,
        confidence=confidence,
        precise=both_precise,
    )
    n = acc.n
    scale = 1.0 / acc.mean_count
    _, n_b, q_b = acc.active()
    w = acc.gram() * scale**2
    q_s = q_b * scale**2
    forms: HessianForms | None = None
    n_hessian = 0
    if hessian_inputs is not None and hessian_targets is not None:
        n_hessian = check_sample(hessian_inputs, hessian_targets)
        forms = forms_for(acc)
    est = stream_estimates(
        w,
        n_b,
        q_s,
        hessian_forms=forms.forms if forms is not None else None,
        hessian_counts=forms.counts if forms is not None else None,
    )
    bias_simple = bias_noise = None
    if bias_draws > 0:
        bias_simple, bias_noise = selection_bias(
            w,
            n_b,
            q_s,
            confidence=confidence,
            draws=bias_draws,
            seed=seed,
            hessian_total=forms.total if forms is not None else None,
        )
    series = None
    if b_small is not None or b_big is not None:
        if b_small is None or b_big is None:
            raise ValueError("b_small/b_big: give both or neither")
        if acc.group_size == 1:
            series = two_batch_series(w, b_small, b_big, forms.total if forms else None)
    return {
        "grad_sq_norm": est.grad_sq_norm,
        "grad_sq_norm_se": est.grad_sq_norm_se,
        "trace_sigma": est.trace_sigma,
        "trace_sigma_se": est.trace_sigma_se,
        "gHg": est.gHg,
        "gHg_se": est.gHg_se,
        "trace_h_sigma": est.trace_h_sigma,
        "trace_h_sigma_se": est.trace_h_sigma_se,
        "log_b_simple_se": est.log_b_simple_se,
        "log_b_noise_se": est.log_b_noise_se,
        "jackknife_groups": est.groups if est.groups >= 3 else None,
        "group_size": acc.group_size,
        "b_simple_p_defined": None if bias_simple is None else bias_simple.p_defined,
        "b_simple_median_ratio": None if bias_simple is None else bias_simple.median_ratio,
        "b_noise_p_defined": None if bias_noise is None else bias_noise.p_defined,
        "b_noise_median_ratio": None if bias_noise is None else bias_noise.median_ratio,
        "n_samples": n,
        "n_available": n_total,
        "stop_reason": stop,
        "n_hessian_samples": n_hessian,
        "n_hessian_groups": int(forms.forms.shape[0]) if forms is not None else 0,
        "hessian_se_includes_batch": est.hessian_se_includes_batch,
        "b_simple": _ratio(est.trace_sigma, est.grad_sq_norm),
        "b_noise": _ratio(est.trace_h_sigma, est.gHg),
        "gradient_norm": math.sqrt(max(est.raw_grad_sq_norm, 0.0)),
        "raw_grad_sq_norm": est.raw_grad_sq_norm,
        "rms_deviation": est.rms_deviation,
        "mean_count": acc.mean_count,
        "n_parameters": acc.dim,
        "n_hvp_products": forms.n_products if forms is not None else 0,
        "gradient_method": used,
        "series": series,
    }


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not den > 0:
        return None
    return num / den


def default_series_sizes(n_grad: int) -> tuple[int, int] | None:
    """(b_small, b_big) = (n/8, n/2) rounded down, or None when they cannot differ (n < 4)."""
    b_small, b_big = max(1, n_grad // 8), n_grad // 2
    return (b_small, b_big) if b_big > b_small else None


def gradient_noise_from_sample(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    *,
    n_grad: int | None = None,
    n_hessian: int | None = None,
    seed: int = 0,
    b_small: int | None = None,
    b_big: int | None = None,
    adaptive: bool = False,
    max_examples: int | None = None,
    **kwargs: Any,
) -> GradientNoiseStats:
    """``gradient_noise_statistics`` on a seeded disjoint split of one sample into A and B.

    Fixed size (default): A (gradients) gets ``n_grad`` examples, B (Hessian) the next
    ``n_hessian`` of a ``torch.Generator().manual_seed(seed)`` permutation. Defaults:
    n_grad = min(n/2, 64), n_hessian = min(rest, 64). The App. A series uses
    ``b_small``/``b_big`` (default ``default_series_sizes(n_grad)``).

    ``adaptive``: B is the LAST ``n_hessian`` (default min(n/4, 64), at least 1) examples of the
    permutation and A grows through the rest, from ``n_grad`` (default 64) examples up to
    ``max_examples`` (default 1024), until the intervals of B_simple and B_noise are within a
    factor ``NOISE_TARGET_FACTOR`` (``stream_gradient_sums``); memory stays O(max_groups · D).
    The split's indices are returned under ``grad_indices``/``hessian_indices``.
    """
    n = check_sample(inputs, targets)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if adaptive:
        if n_hessian is None:
            n_hessian = max(1, min(n // 4, DEFAULT_MAX_HESSIAN_EXAMPLES))
        if not 1 <= n_hessian <= n - 2:
            raise ValueError(f"n_hessian: need 1 ≤ n_hessian ≤ {n - 2}")
        budget = DEFAULT_NOISE_BUDGET if max_examples is None else max_examples
        if budget < 2:
            raise ValueError(f"max_examples: need ≥ 2, got {budget}")
        a = perm[: min(n - n_hessian, budget)]
        b = perm[n - n_hessian :].sort().values
        start = DEFAULT_MAX_GRAD_EXAMPLES if n_grad is None else n_grad
        kwargs.setdefault("min_examples", max(2, start))
        out = gradient_noise_statistics(
            model,
            objective,
            inputs[a],
            targets[a],
            inputs[b],
            targets[b],
            adaptive=True,
            seed=seed,
            **kwargs,
        )
        used = a[: out["n_samples"]]
        out["seed"] = int(seed)
        out["grad_indices"] = used.sort().values.tolist()
        out["hessian_indices"] = b.tolist()
        return out
    n_grad = min(n // 2, DEFAULT_MAX_GRAD_EXAMPLES) if n_grad is None else n_grad
    if not 2 <= n_grad < n:
        raise ValueError(f"n_grad: need 2 ≤ n_grad < {n} (the Hessian batch needs examples)")
    if n_hessian is None:
        n_hessian = min(n - n_grad, DEFAULT_MAX_HESSIAN_EXAMPLES)
    if not 1 <= n_hessian <= n - n_grad:
        raise ValueError(f"n_hessian: need 1 ≤ n_hessian ≤ {n - n_grad}")
    if b_small is None and b_big is None:
        sizes = default_series_sizes(n_grad)
        if sizes is not None:
            b_small, b_big = sizes
    a = perm[:n_grad].sort().values
    b = perm[n_grad : n_grad + n_hessian].sort().values
    out = gradient_noise_statistics(
        model,
        objective,
        inputs[a],
        targets[a],
        inputs[b],
        targets[b],
        b_small=b_small,
        b_big=b_big,
        seed=seed,
        **kwargs,
    )
    out["seed"] = int(seed)
    out["grad_indices"] = a.tolist()
    out["hessian_indices"] = b.tolist()
    return out
