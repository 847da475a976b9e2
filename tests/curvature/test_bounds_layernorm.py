"""LayerNorm norms of the bounds package against dense autograd Jacobians/Hessians (fp64).

Oracle: the (Ld) x (Ld) Jacobian and the (Ld)^2 x (Ld) Hessian matricization of a plain
LayerNorm, both by autograd, and their largest singular values (Petrov et al. 2025 §2 layout).
"""

from __future__ import annotations

import math

import pytest
import torch

from curvplan_worker.curvature.bounds.layernorm import (
    layernorm_hessian_norm,
    layernorm_hessian_norm_closed_form,
    layernorm_jacobian_norm,
    lemma4_bounds,
    row_scales,
)

torch.set_default_dtype(torch.float64)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ln(x: torch.Tensor, eps: float, gamma: torch.Tensor | None = None) -> torch.Tensor:
    centred = x - x.mean(dim=-1, keepdim=True)
    y = centred / torch.sqrt((centred**2).mean(dim=-1, keepdim=True) + eps)
    return y if gamma is None else y * gamma


def _dense_norms(x: torch.Tensor, eps: float, gamma=None) -> tuple[float, float]:
    shape = x.shape

    def flat(v: torch.Tensor) -> torch.Tensor:
        return _ln(v.view(shape), eps, gamma).reshape(-1)

    v = x.reshape(-1)
    jac = torch.autograd.functional.jacobian(flat, v, vectorize=True)
    hess = torch.autograd.functional.jacobian(
        lambda u: torch.autograd.functional.jacobian(
            flat, u, create_graph=True, vectorize=True
        ).reshape(-1),
        v,
        vectorize=True,
    )
    return (
        float(torch.linalg.matrix_norm(jac, ord=2)),
        float(torch.linalg.matrix_norm(hess, ord=2)),
    )


def _rows(seed: int, m: int, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-1, 0.5, m)[:, None]  # rows of very different variance
    return (torch.randn(m, d, generator=g) + 3.0) * scales


@pytest.mark.parametrize("d", [2, 3, 4, 7])
@pytest.mark.parametrize("eps", [0.0, 1e-5, 1e-2])
def test_exact_norms_match_dense_autograd(d: int, eps: float) -> None:
    x = _rows(10 * d, 3, d)
    jac, hess = _dense_norms(x, eps)
    assert layernorm_jacobian_norm(x, eps) == pytest.approx(jac, rel=1e-9, abs=1e-9)
    assert layernorm_hessian_norm(x, eps) == pytest.approx(hess, rel=1e-9, abs=1e-9)
    s_min = float(row_scales(x, eps).min())
    digest = math.sqrt(max(d - 2, 2) / d) / s_min**2
    assert layernorm_hessian_norm_closed_form(x, eps) == pytest.approx(digest, rel=1e-12)
    if d >= 3:
        # docs/formulas.md#bounds: ||J|| = 1 / min_i s_i exactly (any eps, d >= 3)
        assert jac == pytest.approx(1.0 / s_min, rel=1e-9)
        # docs/formulas.md#bounds: exact for eps = 0, an upper bound for eps > 0
        if eps == 0.0:
            assert hess == pytest.approx(digest, rel=1e-9)
        else:
            assert hess <= digest * (1 + 1e-12)
            assert hess >= 0.5 * digest  # and not vacuous


def test_closed_form_hessian_formula_bounds_exact_value_on_random_inputs_except_d4() -> None:
    g = torch.Generator().manual_seed(7)
    for _ in range(200):
        d = int(torch.randint(5, 12, (1,), generator=g))
        eps = float(10 ** torch.empty(1).uniform_(-6, 1, generator=g))
        x = torch.randn(2, d, generator=g) * float(torch.rand(1, generator=g) * 2 + 0.01)
        assert layernorm_hessian_norm(x, eps) <= layernorm_hessian_norm_closed_form(x, eps) * (
            1 + 1e-12
        )


def test_closed_form_hessian_formula_is_not_a_bound_for_d4_with_eps() -> None:
    """Finding: the closed form sqrt(max(d-2,2)/d)/min s^2 is not a bound on ||H|| for eps > 0:
    for d = 4 and eps ~ 1.1 Var the dense Hessian exceeds it by ~3 % (the exact closed form of
    :func:`layernorm_hessian_norm` is what the bounds use)."""
    x = torch.tensor([[1.0, -1.0, 0.3, -0.3]])
    eps = 1.1 * float(x.var(unbiased=False))
    _, hess = _dense_norms(x, eps)
    assert hess > layernorm_hessian_norm_closed_form(x, eps) * 1.02
    assert hess == pytest.approx(layernorm_hessian_norm(x, eps), rel=1e-9)


def test_affine_gamma_multiplies_by_max_abs_gamma_as_upper_bound() -> None:
    x = _rows(3, 3, 5)
    gamma = torch.tensor([0.5, -2.0, 1.0, 0.1, 1.5])
    jac, hess = _dense_norms(x, 1e-5, gamma)
    assert jac <= layernorm_jacobian_norm(x, 1e-5, gamma) * (1 + 1e-12)
    assert hess <= layernorm_hessian_norm(x, 1e-5, gamma) * (1 + 1e-12)
    assert layernorm_jacobian_norm(x, 1e-5, gamma) == pytest.approx(
        2.0 * layernorm_jacobian_norm(x, 1e-5)
    )


@pytest.mark.parametrize("eps", [0.0, 1e-5, 1e-2])
def test_lemma4_with_per_row_std_holds(eps: float) -> None:
    g = torch.Generator().manual_seed(11)
    for _ in range(25):
        m = int(torch.randint(1, 4, (1,), generator=g))
        n = int(torch.randint(3, 6, (1,), generator=g))
        x = torch.randn(m, n, generator=g) * float(torch.rand(1, generator=g) * 3 + 0.05)
        x = x + float(torch.randn(1, generator=g))  # nonzero row means
        jac, hess = _dense_norms(x, eps)
        jac_bound, hess_bound = lemma4_bounds(x, eps, "per_row_std")
        assert jac <= jac_bound, (m, n, eps)
        assert hess <= hess_bound, (m, n, eps)


def test_lemma4_literal_row_norm_fails_on_closed_form_counterexample() -> None:
    """Lemma 4's counterexample (docs/formulas.md#bounds): m=4, n=64, standardized rows:
    ||J|| = 1 but the literal bound ~0.14.

    Documents the slip in Lemma 4's definition of sigma_min (row norm instead of row std).
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g)
    x = (x - x.mean(dim=-1, keepdim=True)) / x.std(dim=-1, unbiased=False, keepdim=True)
    jac = float(
        torch.linalg.matrix_norm(
            torch.autograd.functional.jacobian(
                lambda v: _ln(v.view(4, 64), 0.0).reshape(-1), x.reshape(-1)
            ),
            ord=2,
        )
    )
    assert jac == pytest.approx(1.0, rel=1e-9)
    literal_jac, _ = lemma4_bounds(x, 0.0, "row_norm")
    corrected_jac, _ = lemma4_bounds(x, 0.0, "per_row_std")
    assert literal_jac < 0.2 < 1.0  # the literal statement is violated
    assert corrected_jac > 5.0 >= jac  # the corrected one holds (and is loose)
    # the Hessian is violated as well: exact norm sqrt(62/64) vs the literal bound
    _, literal_hess = lemma4_bounds(x, 0.0, "row_norm")
    assert literal_hess < layernorm_hessian_norm(x, 0.0)


def test_zero_variance_row_without_eps_is_a_clear_error() -> None:
    x = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]])
    with pytest.raises(ValueError, match="Assumption 2"):
        layernorm_jacobian_norm(x, 0.0)
    assert layernorm_jacobian_norm(x, 1e-2) == pytest.approx(1.0 / math.sqrt(1e-2))
    with pytest.raises(ValueError, match="eps"):
        layernorm_hessian_norm(x, -1.0)
