"""Streaming (grouped) gradient-noise estimators against the Gram-matrix form and known truth.

Oracles: the n × n Gram-matrix estimators of ``gradient_noise.noise_estimates_from_gram``
(exact equality when every group holds one example), an analytic Gaussian population for
unbiasedness and interval coverage (G, Σ known, so B_simple = tr Σ/|G|² is known).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from curvplan_worker.curvature.gradient_noise import HessianForms, noise_estimates_from_gram
from curvplan_worker.curvature.noise_stream import (
    GroupedGradientSums,
    selection_bias,
    stream_estimates,
)


def _accumulate(g: torch.Tensor, max_groups: int, chunk: int = 7) -> GroupedGradientSums:
    acc = GroupedGradientSums(g.shape[1], max_groups=max_groups)
    for start in range(0, g.shape[0], chunk):
        acc.add(g[start : start + chunk])
    return acc


def _forms(g: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    f = torch.stack([g @ s[k] @ g.T for k in range(s.shape[0])])
    return 0.5 * (f + f.transpose(1, 2))


def test_singleton_groups_equal_the_gram_matrix_form() -> None:
    gen = torch.Generator().manual_seed(3)
    n, dim = 37, 23
    g = torch.randn(n, dim, generator=gen, dtype=torch.float64) + 0.2
    a = torch.randn(3, dim, dim, generator=gen, dtype=torch.float64)
    s = a @ a.transpose(1, 2)
    counts = torch.tensor([5.0, 7.0, 6.0], dtype=torch.float64)
    acc = _accumulate(g, max_groups=64)
    t, n_b, q_b = acc.active()
    assert acc.group_size == 1 and acc.n_groups == n
    ref = noise_estimates_from_gram(g @ g.T, HessianForms(_forms(g, s), counts, 0))
    est = stream_estimates(acc.gram(), n_b, q_b, hessian_forms=_forms(t, s), hessian_counts=counts)
    for key in (
        "grad_sq_norm",
        "grad_sq_norm_se",
        "trace_sigma",
        "trace_sigma_se",
        "gHg",
        "gHg_se",
        "trace_h_sigma",
        "trace_h_sigma_se",
        "raw_grad_sq_norm",
    ):
        want, got = getattr(ref, key), getattr(est, key)
        assert got == pytest.approx(want, rel=1e-10, abs=1e-12), key


def test_grouping_keeps_point_estimates_and_bounds_memory() -> None:
    gen = torch.Generator().manual_seed(4)
    n, dim = 203, 11
    g = torch.randn(n, dim, generator=gen, dtype=torch.float64) + 0.5
    acc = _accumulate(g, max_groups=16)
    assert acc.sums.shape == (16, dim)  # O(max_groups · D), independent of n
    assert acc.n == n and 8 <= acc.n_groups <= 16
    t, n_b, q_b = acc.active()
    assert float(n_b.sum()) == n
    torch.testing.assert_close(t.sum(dim=0), g.sum(dim=0), rtol=1e-12, atol=1e-12)
    ref = noise_estimates_from_gram(g @ g.T)
    est = stream_estimates(acc.gram(), n_b, q_b)
    assert est.grad_sq_norm == pytest.approx(ref.grad_sq_norm, rel=1e-10)
    assert est.trace_sigma == pytest.approx(ref.trace_sigma, rel=1e-10)
    assert est.rms_deviation == pytest.approx(math.sqrt(ref.trace_sigma * (n - 1) / n), rel=1e-10)


def test_group_hessian_terms_are_unbiased() -> None:
    """Micro-batch (group) estimators of GᵀHG and tr(HΣ) average to the truth."""
    rng = np.random.default_rng(5)
    dim = 4
    mean = np.array([1.0, -0.5, 0.3, 0.0])
    cov_root = rng.normal(size=(dim, dim)) / 2
    sigma = cov_root @ cov_root.T
    h = np.diag([3.0, 1.0, 0.5, 2.0])
    truth_ghg = float(mean @ h @ mean)
    truth_trh = float(np.trace(h @ sigma))
    ghg, trh = [], []
    for _ in range(400):
        g = torch.tensor(rng.normal(size=(50, dim)) @ cov_root.T + mean)
        acc = _accumulate(g, max_groups=8)
        t, n_b, q_b = acc.active()
        forms = (t @ torch.tensor(h) @ t.T).unsqueeze(0)
        est = stream_estimates(
            acc.gram(), n_b, q_b, hessian_forms=forms, hessian_counts=torch.ones(1)
        )
        ghg.append(est.gHg)
        trh.append(est.trace_h_sigma)
    for values, truth in ((ghg, truth_ghg), (trh, truth_trh)):
        values = np.asarray(values)
        assert abs(values.mean() - truth) < 4 * values.std(ddof=1) / math.sqrt(values.size)


@pytest.mark.parametrize("max_groups", [64, 16])
def test_log_ratio_jackknife_covers_b_simple(max_groups: int) -> None:
    """≥ 200 replicates: the jackknife interval of log B_simple covers the true value at a
    rate in [0.90, 0.98] (nominal 0.95), with numerator and denominator correlated."""
    rng = np.random.default_rng(11)
    dim, n = 6, 64
    scales = np.array([3.0, 1.0, 0.5, 0.5, 0.3, 0.2])
    mean = np.array([0.9, 0.2, 0, 0, 0, 0])
    truth = float((scales**2).sum() / (mean @ mean))
    hits = total = 0
    for _ in range(300):
        g = torch.tensor(rng.normal(size=(n, dim)) * scales + mean)
        acc = _accumulate(g, max_groups=max_groups)
        est = stream_estimates(acc.gram(), *acc.active()[1:])
        if est.log_b_simple_se is None:
            continue
        total += 1
        t = stats.t.ppf(0.975, est.groups - 1)
        centre = math.log(est.trace_sigma / est.grad_sq_norm)
        hits += abs(centre - math.log(truth)) <= t * est.log_b_simple_se
    assert total >= 250
    assert 0.90 <= hits / total <= 0.98


def test_selection_bias_matches_the_sampling_distribution() -> None:
    """At low signal the wild bootstrap at the measured statistics reproduces the probability
    that B_simple is defined and the median estimate/truth of the defined ones (300
    measurements from a known population; bootstrap figures are the median over 30 of them)."""
    rng = np.random.default_rng(23)
    dim, n = 6, 64
    scales = np.array([3.0, 1.0, 0.5, 0.5, 0.3, 0.2])
    mean = np.array([0.9, 0.2, 0, 0, 0, 0])
    truth = float((scales**2).sum() / (mean @ mean))
    defined, boot_p, boot_ratio = [], [], []
    for r in range(300):
        acc = _accumulate(torch.tensor(rng.normal(size=(n, dim)) * scales + mean), 64)
        w, (_, n_b, q_b) = acc.gram(), acc.active()
        est = stream_estimates(w, n_b, q_b)
        crit = stats.t.ppf(0.95, est.groups - 1)
        if est.grad_sq_norm - crit * est.grad_sq_norm_se > 0:
            defined.append(est.trace_sigma / est.grad_sq_norm / truth)
        if r < 30:
            bias, _ = selection_bias(w, n_b, q_b, confidence=0.95, seed=r, draws=500)
            if bias is not None:
                boot_p.append(bias.p_defined)
                if bias.median_ratio is not None:
                    boot_ratio.append(bias.median_ratio)
    actual_p = len(defined) / 300
    assert 0.05 < actual_p < 0.5  # a regime where the selection matters
    assert float(np.median(boot_p)) == pytest.approx(actual_p, abs=0.08)
    actual_ratio = float(np.median(defined))
    assert actual_ratio < 0.8  # reported values are biased low …
    assert float(np.median(boot_ratio)) == pytest.approx(actual_ratio, rel=0.35)  # … and seen
