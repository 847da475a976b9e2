"""Streaming gradient-noise statistics in O(D) memory per jackknife group.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", §2.2, App. A) define, for
the true gradient G, the per-example gradient covariance Σ and the Hessian H,
B_simple = tr Σ / |G|² and B_noise = tr(HΣ) / GᵀHG.

The unbiased U-statistics over n per-example gradients g_i need only running sums:

* |G|²   = (|S|² − Q) / (n(n−1)),       S = Σ_i g_i,  Q = Σ_i |g_i|²
* tr Σ   = (Q − |S|²/n) / (n−1)

so the point estimates never need the n × D matrix of gradients. For standard errors (and the
Hessian terms) the examples are kept in at most ``max_groups`` consecutive groups, each held as
its gradient sum T_b (D numbers), its count n_b and its Q_b. With the m × m group Gram matrix
W = [T_bᵀT_c] and M = [T_bᵀ H T_c] (one Hessian-vector product per GROUP, i.e. on micro-batch
gradients):

* |S|² = Σ_bc W_bc, so |G|² and tr Σ are exactly the per-example U-statistics above;
* GᵀHG   = (Σ_bc M_bc − Σ_b M_bb) / (n² − Σ_b n_b²)       (cross-group pairs, unbiased)
* tr(HΣ) = (Σ_b M_bb − Σ_b n_b² · GᵀHG) / n                  (E[M_bb] = n_b tr(HΣ) + n_b² GᵀHG)

and the delete-a-group jackknife recomputes every statistic (and log B_simple, log B_noise) with
one group left out, from W, M, n_b and Q_b alone. With one example per group (n ≤ max_groups)
these are exactly the Gram-matrix estimators and the leave-one-out jackknife of
``gradient_noise.noise_estimates_from_gram``. When a new example arrives and all groups are full,
adjacent groups are merged pairwise (group size doubles), so memory stays max_groups × D. The
sums are allocated as groups open (their rows double, up to max_groups), so n < max_groups
examples hold n × D, not max_groups × D (a 4-example sample of a 19.5 M-parameter model held
10 GB of zeros before, and a distilgpt2-sized one would not have fitted in 24 GiB).

The jackknife of the LOG-RATIO (rather than combining the numerator's and denominator's errors as
independent) uses that both come from the same gradients (Efron & Tibshirani 1993, ch. 11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "GroupedGradientSums",
    "SelectionBias",
    "StreamEstimates",
    "selection_bias",
    "stream_estimates",
]


class GroupedGradientSums:
    """Running per-group gradient sums (O(max_groups · D) fp64 memory, independent of n)."""

    def __init__(self, dim: int, max_groups: int = 64, expected: int | None = None) -> None:
        """``expected``: the examples the caller will add at most, when it knows: their rows
        are allocated at once (:meth:`rows_for`), so the sums never grow (a growth holds the
        old rows and the new ones together)."""
        if max_groups < 4 or max_groups % 2:
            raise ValueError(f"max_groups: must be an even number ≥ 4, got {max_groups}")
        self.dim = int(dim)
        self.max_groups = int(max_groups)
        rows = 0 if expected is None else self.rows_for(expected, self.max_groups)
        self.sums = torch.zeros(rows, self.dim, dtype=torch.float64)  # grows as groups open
        self.counts = torch.zeros(max_groups, dtype=torch.float64)
        self.sq = torch.zeros(max_groups, dtype=torch.float64)
        self.loss_terms = 0.0
        self.group_size = 1
        self.n_groups = 0  # groups holding at least one example
        self.n = 0

    def add(self, grads: Tensor, loss_terms: Tensor | None = None) -> None:
        """Add rows of per-example gradients (k, D), in order; ``loss_terms`` their counts."""
        g = grads.detach().to("cpu", torch.float64)
        if g.ndim != 2 or g.shape[1] != self.dim:
            raise ValueError(f"grads: expected shape (k, {self.dim}), got {tuple(g.shape)}")
        if loss_terms is not None:
            self.loss_terms += float(loss_terms.to(torch.float64).sum())
        norms = (g * g).sum(dim=1)
        for i in range(g.shape[0]):
            b = self._slot()
            self.sums[b] += g[i]
            self.counts[b] += 1.0
            self.sq[b] += norms[i]
            self.n += 1

    def _slot(self) -> int:
        if self.n_groups > 0 and self.counts[self.n_groups - 1] < self.group_size:
            return self.n_groups - 1
        if self.n_groups == self.max_groups:
            self._merge_pairs()
            if self.counts[self.n_groups - 1] < self.group_size:
                return self.n_groups - 1
        self.n_groups += 1
        if self.n_groups > self.sums.shape[0]:
            self._grow()
        return self.n_groups - 1

    @staticmethod
    def rows_for(n_examples: int, max_groups: int = 64) -> int:
        """Rows of group sums that ``n_examples`` examples allocate (what the memory plan
        counts): the doubling from 4 up to the first that holds them, at most ``max_groups``."""
        rows = 0
        while rows < min(max(int(n_examples), 1), max_groups):
            rows = min(max_groups, max(4, 2 * rows))
        return rows

    def _grow(self) -> None:
        """Room for the groups open: the next of :meth:`rows_for`'s doublings."""
        rows = self.rows_for(self.n_groups, self.max_groups)
        grown = torch.zeros(rows, self.dim, dtype=torch.float64)
        grown[: self.sums.shape[0]] = self.sums
        self.sums = grown

    def _merge_pairs(self) -> None:
        half = self.max_groups // 2  # only when every group is open: sums has max_groups rows
        for src in (self.sums, self.counts, self.sq):
            merged = src[0::2] + src[1::2]
            src.zero_()
            src[:half] = merged
        self.n_groups = half
        self.group_size *= 2

    @property
    def mean_count(self) -> float:
        """Mean loss terms per example (c̄); 1 when no counts were given."""
        return self.loss_terms / self.n if self.loss_terms > 0 and self.n > 0 else 1.0

    def active(self) -> tuple[Tensor, Tensor, Tensor]:
        """(T (m, D), n_b (m,), Q_b (m,)) of the groups holding examples."""
        m = self.n_groups
        return self.sums[:m], self.counts[:m], self.sq[:m]

    def gram(self) -> Tensor:
        """W = [T_bᵀT_c] over the active groups."""
        t = self.sums[: self.n_groups]
        return t @ t.T


@dataclass(frozen=True)
class StreamEstimates:
    """The four statistics, their jackknife SEs, and the log-ratio jackknife SEs."""

    n: int
    groups: int
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
    raw_grad_sq_norm: float
    rms_deviation: float
    hessian_se_includes_batch: bool


def _simple(s2: Any, q: Any, n: Any) -> tuple[Any, Any]:
    """(|G|², tr Σ) from |S|², Q, n (elementwise over leading dims; tensors or arrays)."""
    return (s2 - q) / (n * (n - 1)), (q - s2 / n) / (n - 1)


def _hessian(m_total: Any, m_diag: Any, n: Any, n_sq: Any) -> tuple[Any, Any]:
    """(GᵀHG, tr(HΣ)) from Σ_bc M_bc, Σ_b M_bb, n, Σ_b n_b² (module docstring)."""
    ghg = (m_total - m_diag) / (n * n - n_sq)
    return ghg, (m_diag - n_sq * ghg) / n


def _jackknife(values: Tensor) -> float:
    m = values.shape[0]
    return float(torch.sqrt((m - 1) / m * ((values - values.mean()) ** 2).sum()))


def _log_ratio_se(num: Tensor, den: Tensor) -> float | None:
    """Jackknife SE of log(num/den) over leave-one-group-out values; None when any is ≤ 0."""
    if bool((num <= 0).any()) or bool((den <= 0).any()):
        return None
    return _jackknife(torch.log(num) - torch.log(den))


def stream_estimates(
    w: Tensor,
    counts: Tensor,
    sq: Tensor,
    *,
    hessian_forms: Tensor | None = None,
    hessian_counts: Tensor | None = None,
    scale: float = 1.0,
) -> StreamEstimates:
    """Statistics from the group Gram W (m × m), group counts n_b, group Q_b (module docstring).

    ``hessian_forms`` (h, m, m) are T_bᵀ S_k T_c with S_k the Hessian of the SUMMED loss of
    Hessian group k and ``hessian_counts`` (h,) its loss terms, so H_B = Σ_k S_k / Σ_k C_k.
    ``scale`` multiplies every gradient (1/c̄: the statistics scale by its square).
    """
    w = w.to(torch.float64) * scale**2
    q_b = sq.to(torch.float64) * scale**2
    n_b = counts.to(torch.float64)
    m = int(n_b.shape[0])
    n = float(n_b.sum())
    if n < 2:
        raise ValueError("the unbiased estimators need at least 2 gradient examples")
    s2 = w.sum()
    q = q_b.sum()
    g2, tr = _simple(s2, q, torch.tensor(n, dtype=torch.float64))
    g2_se = tr_se = log_simple_se = None
    g2_loo = tr_loo = None
    rows = w.sum(dim=1)
    diag = torch.diagonal(w)
    if m >= 3:
        s2_loo = s2 - 2 * rows + diag
        g2_loo, tr_loo = _simple(s2_loo, q - q_b, n - n_b)
        g2_se, tr_se = _jackknife(g2_loo), _jackknife(tr_loo)
        log_simple_se = _log_ratio_se(tr_loo, g2_loo) if float(g2) > 0 and float(tr) > 0 else None
    ghg = trh = ghg_se = trh_se = log_noise_se = None
    with_batch = False
    if hessian_forms is not None:
        if hessian_counts is None:
            raise ValueError("hessian_counts: needed with hessian_forms")
        forms = hessian_forms.to(torch.float64) * scale**2
        if forms.shape[-1] != m:
            raise ValueError(f"hessian_forms: built for {forms.shape[-1]} groups, not {m}")
        h_counts = hessian_counts.to(torch.float64)
        mt = forms.sum(dim=0) / h_counts.sum()
        n_sq = float((n_b**2).sum())
        nt = torch.tensor(n, dtype=torch.float64)
        ghg_t, trh_t = _hessian(mt.sum(), torch.diagonal(mt).sum(), nt, torch.tensor(n_sq))
        ghg, trh = float(ghg_t), float(trh_t)
        var = [0.0, 0.0]
        if m >= 3:
            mrows = mt.sum(dim=1)
            mdiag = torch.diagonal(mt)
            tot_loo = mt.sum() - 2 * mrows + mdiag
            diag_loo = mdiag.sum() - mdiag
            ghg_loo, trh_loo = _hessian(tot_loo, diag_loo, n - n_b, n_sq - n_b**2)
            var = [_jackknife(ghg_loo) ** 2, _jackknife(trh_loo) ** 2]
            if ghg > 0 and trh > 0:
                log_noise_se = _log_ratio_se(trh_loo, ghg_loo)
        groups_h = forms.shape[0]
        if groups_h >= 2 and m >= 3:
            weights = h_counts / h_counts.sum()
            per = forms / h_counts.view(-1, 1, 1)
            tot = per.sum(dim=(1, 2))
            dg = torch.diagonal(per, dim1=1, dim2=2).sum(dim=1)
            ghg_k, trh_k = _hessian(tot, dg, nt, torch.tensor(n_sq))
            spread = [
                float(groups_h / (groups_h - 1) * (weights**2 * (vals - tot_v) ** 2).sum())
                for vals, tot_v in ((ghg_k, ghg), (trh_k, trh))
            ]
            var = [var[0] + spread[0], var[1] + spread[1]]
            with_batch = True
            if log_noise_se is not None and ghg > 0 and trh > 0:
                # the batch spread of log(tr(HΣ)/GᵀHG), added in quadrature
                ok = (ghg_k > 0) & (trh_k > 0)
                if bool(ok.all()):
                    lr = torch.log(trh_k) - torch.log(ghg_k)
                    lr_total = math.log(trh / ghg)
                    dev = weights**2 * (lr - lr_total) ** 2
                    sp = float(groups_h / (groups_h - 1) * dev.sum())
                    log_noise_se = math.sqrt(log_noise_se**2 + sp)
                else:
                    log_noise_se = None
        if m >= 3:
            ghg_se, trh_se = math.sqrt(var[0]), math.sqrt(var[1])
    return StreamEstimates(
        n=round(n),
        groups=m,
        grad_sq_norm=float(g2),
        grad_sq_norm_se=g2_se,
        trace_sigma=float(tr),
        trace_sigma_se=tr_se,
        gHg=ghg,
        gHg_se=ghg_se,
        trace_h_sigma=trh,
        trace_h_sigma_se=trh_se,
        log_b_simple_se=log_simple_se,
        log_b_noise_se=log_noise_se,
        raw_grad_sq_norm=float(s2) / n**2,
        rms_deviation=math.sqrt(max(float(q - s2 / n) / n, 0.0)),
        hessian_se_includes_batch=with_batch,
    )


@dataclass(frozen=True)
class SelectionBias:
    """P(ratio defined) and median(estimate/truth | defined) under the bootstrap population."""

    p_defined: float
    median_ratio: float | None
    draws: int


def _star(mat: np.ndarray, n_b: np.ndarray, eps: np.ndarray, shrink: float) -> np.ndarray:
    """Quadratic forms of T*_b = n_b·c·ḡ + ε_b·(T_b − n_b·ḡ) from Q = [T_bᵀ A T_c] (any A)."""
    n = n_b.sum()
    mean_t = mat.sum(axis=1) / n  # ḡᵀ A T_b
    mean_sq = mat.sum() / n**2  # ḡᵀ A ḡ
    a = mean_t - n_b * mean_sq  # ḡᵀ A d_b
    nb2 = np.outer(n_b, n_b)
    dev = mat - np.outer(mean_t, n_b) - np.outer(n_b, mean_t) + nb2 * mean_sq
    ea = eps * a  # (draws, m)
    cross = shrink * (n_b[None, :, None] * ea[:, None, :] + ea[:, :, None] * n_b[None, None, :])
    return nb2 * mean_sq * shrink**2 + cross + eps[:, :, None] * eps[:, None, :] * dev


def selection_bias(
    w: Tensor,
    counts: Tensor,
    sq: Tensor,
    *,
    confidence: float,
    draws: int = 2000,
    seed: int = 0,
    hessian_total: Tensor | None = None,
) -> tuple[SelectionBias | None, SelectionBias | None]:
    """(B_simple, B_noise) selection bias by a Gaussian wild bootstrap at the measured statistics.

    The bootstrap population has mean gradient μ = c·ḡ scaled so that |μ|² equals the unbiased
    |Ĝ|² (μᵀHμ = GᵀHG-hat for B_noise) and the measured covariance: group sums are redrawn as
    T*_b = n_b·μ + ε_b·(T_b − n_b·ḡ), ε_b ~ N(0, 1) (Wu 1986 wild bootstrap), which keeps the
    whole spectrum of Σ̂ (the distribution of |Ĝ|² depends on more than tr Σ). For each draw
    the same estimators and one-sided significance test (Student-t, groups − 1 dof) as the
    measurement are applied; P(defined) is the share passing, median_ratio the median of
    estimate/truth over them. ``hessian_total`` is M = [T_bᵀ H_B T_c] (None: no B_noise).
    Returns None for a ratio whose measured numerator or denominator is not positive.
    """
    from scipy import stats as sps

    w_np = w.to(torch.float64).numpy()
    n_b = counts.to(torch.float64).numpy()
    q_b = sq.to(torch.float64).numpy()
    m = n_b.shape[0]
    if m < 3:
        return None, None
    n = float(n_b.sum())
    eps = np.random.default_rng(seed).standard_normal((draws, m))
    crit = float(sps.t.ppf(confidence, m - 1))
    base = stream_estimates(w, counts, sq)
    within = q_b - np.diagonal(w_np) / n_b  # within-group scatter (0 for singletons)

    def run(mat: np.ndarray, num_fn: Any, den_target: float) -> SelectionBias | None:
        mean_sq = float(mat.sum()) / n**2
        if den_target <= 0 or mean_sq <= 0:
            return None
        star = _star(mat, n_b, eps, math.sqrt(den_target / mean_sq))
        num, den, den_loo = num_fn(star)
        se = np.sqrt((m - 1) / m * ((den_loo - den_loo.mean(1, keepdims=True)) ** 2).sum(1))
        ok = (den - crit * se > 0) & (num > 0)
        # population truth: tr(AΣ*)/μᵀAμ with Σ* = Σ_b d_b d_bᵀ / n
        mean_t = mat.sum(axis=1) / n
        dd = np.diagonal(mat) - 2 * n_b * mean_t + n_b**2 * mat.sum() / n**2
        truth = float(dd.sum() / n) / den_target
        med = None
        if ok.any() and truth > 0:
            med = float(np.median((num[ok] / den[ok]) / truth))
        return SelectionBias(float(ok.mean()), med, draws)

    def simple(star: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        diag = np.diagonal(star, axis1=1, axis2=2)
        q_star = within + diag / n_b
        s2 = star.sum(axis=(1, 2))
        q = q_star.sum(1)
        g2, tr = _simple(s2, q, n)
        s2_loo = s2[:, None] - 2 * star.sum(axis=2) + diag
        g2_loo, _ = _simple(s2_loo, q[:, None] - q_star, n - n_b)
        return tr, g2, g2_loo

    out_simple = None
    if base.trace_sigma > 0:
        out_simple = run(w_np, simple, base.grad_sq_norm)
    out_noise = None
    if hessian_total is not None:
        mt = hessian_total.to(torch.float64).numpy()
        n_sq = float((n_b**2).sum())
        ghg, trh = _hessian(mt.sum(), np.trace(mt), n, n_sq)

        def noise(star: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            diag = np.diagonal(star, axis1=1, axis2=2)
            tot = star.sum(axis=(1, 2))
            g_, t_ = _hessian(tot, diag.sum(1), n, n_sq)
            tot_loo = tot[:, None] - 2 * star.sum(axis=2) + diag
            diag_loo = diag.sum(1, keepdims=True) - diag
            g_loo, _ = _hessian(tot_loo, diag_loo, n - n_b, n_sq - n_b**2)
            return t_, g_, g_loo

        if float(trh) > 0:
            out_noise = run(mt, noise, float(ghg))
    return out_simple, out_noise
