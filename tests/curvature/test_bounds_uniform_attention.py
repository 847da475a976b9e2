"""Is the paper's ||dA/dT|| <= 1/L (uniform attention) violated on non-uniform attention?

Findings asserted here (docs/formulas.md#bounds):
- under uniform attention (W_Q = 0) the exact ||dA/dT|| is 1/L and the 1/L chain bounds ||G_Q||;
- on non-uniform attention ||dA/dT|| reaches 1/2 > 1/L, and the Theorem 4 ingredient
  ||G_Q|| <= ||W_V|| ||W_K|| ||X||^3 / (L sqrt(d_K)) is violated on random instances;
- Theorem 1's consolidated M evaluated with c_A = 1/L still dominated the exact Hessian on
  those instances (its functional term, with rho >= sqrt(r) L ||X|| ||W_V||, dominates).
"""

from __future__ import annotations

import math

import pytest
import torch

from curvplan_worker.curvature.bounds import BoundOptions, theorem1_bounds
from curvplan_worker.curvature.bounds.attention import (
    _dense_attention_jacobians,
    attention_jacobian_bounds,
    attention_scalars,
    softmax_jacobian_norm,
)

torch.set_default_dtype(torch.float64)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
PAPER_1_OVER_L = BoundOptions(c_A="1/L", A_norm="L")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _softmax_jacobian_dense(T: torch.Tensor) -> float:
    jac = torch.autograd.functional.jacobian(
        lambda t: torch.softmax(t.view(T.shape), dim=-1).reshape(-1), T.reshape(-1)
    )
    return float(torch.linalg.matrix_norm(jac, ord=2))


def test_uniform_attention_has_norm_one_over_L_and_the_chain_holds() -> None:
    g = torch.Generator().manual_seed(3)
    for L in (2, 3, 5):
        X = torch.randn(L, 3, generator=g)
        W_Q, W_K, W_V = torch.zeros(3, 2), torch.randn(3, 2, generator=g), torch.randn(3, 3)
        A = torch.full((L, L), 1.0 / L)
        assert softmax_jacobian_norm(A) == pytest.approx(1.0 / L, rel=1e-12)
        assert _softmax_jacobian_dense(torch.zeros(L, L)) == pytest.approx(1.0 / L, rel=1e-12)
        s = attention_scalars(X, W_Q, W_K, W_V, PAPER_1_OVER_L)
        exact = _dense_attention_jacobians(X, W_Q, W_K, W_V)
        assert exact["Q"] <= attention_jacobian_bounds(s)["Q"] * (1 + 1e-12)


def test_non_uniform_attention_exceeds_one_over_L() -> None:
    L = 4
    T = torch.tensor([[0.0, 0.0, -50.0, -50.0]] * L)  # each row splits 1/2, 1/2
    dense = _softmax_jacobian_dense(T)
    assert dense == pytest.approx(0.5, rel=1e-9)
    assert softmax_jacobian_norm(torch.softmax(T, dim=-1)) == pytest.approx(dense, rel=1e-9)
    assert dense > 1.0 / L  # the paper's 1/L is not a bound here; 1/2 (Gershgorin) is


def test_paper_one_over_L_chain_for_G_Q_is_violated_but_theorem1_M_survives() -> None:
    violations = []
    for seed in range(600):
        g = torch.Generator().manual_seed(seed)
        L = int(torch.randint(3, 9, (1,), generator=g))
        d = int(torch.randint(1, 4, (1,), generator=g))
        sc = float(torch.rand(1, generator=g)) * 6
        X = torch.randn(L, 1, generator=g) @ torch.randn(1, d, generator=g)
        X = X + 0.1 * torch.randn(L, d, generator=g)
        W_Q = torch.randn(d, 1, generator=g) * sc
        W_K = torch.randn(d, 1, generator=g) * sc
        W_V = torch.randn(d, d, generator=g)
        T = torch.randn(L, d, generator=g)
        s = attention_scalars(X, W_Q, W_K, W_V, PAPER_1_OVER_L)
        exact = _dense_attention_jacobians(X, W_Q, W_K, W_V)["Q"]
        bound = attention_jacobian_bounds(s)["Q"]
        if exact > bound * 1.05:
            violations.append((seed, L, d, exact / bound, X, W_Q, W_K, W_V, T))
    assert violations, "expected the 1/L chain for ||G_Q|| to fail on some instance"
    worst = max(v[3] for v in violations)
    assert worst > 1.1  # observed up to ~1.12 on these seeds
    for seed, L, d, _, X, W_Q, W_K, W_V, T in violations:
        keys = [W_K, W_Q, W_V]
        sizes = [w.numel() for w in keys]

        def loss(flat: torch.Tensor, X=X, T=T, sizes=sizes, d=d) -> torch.Tensor:
            wk, wq, wv = torch.split(flat, sizes)
            scores = (X @ wq.view(d, 1)) @ (X @ wk.view(d, 1)).T
            F = torch.softmax(scores, dim=-1) @ X @ wv.view(d, d)
            return ((F - T) ** 2).sum() / F.numel()

        H = torch.autograd.functional.hessian(loss, torch.cat([w.reshape(-1) for w in keys]))
        M = theorem1_bounds(X, W_Q, W_K, W_V, T, PAPER_1_OVER_L)["M"]
        measured = float(torch.linalg.matrix_norm(H, ord=2))
        assert measured <= M, f"Theorem 1 M with c_A=1/L violated: seed={seed} L={L} d_V={d}"
        assert math.isfinite(M)
