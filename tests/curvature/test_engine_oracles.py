"""The engine's products and spectra against independent oracles (fp64, tiny models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _engine_cases import build_case

from curvplan_worker.curvature.dense import dense_summary
from curvplan_worker.curvature.ggn import functional_product, ggn_product
from curvplan_worker.curvature.hvp import CurvatureEngine, finite_difference_hvp
from curvplan_worker.curvature.spectra import block_spectrum, off_diagonal_norm
from curvplan_worker.curvature.trace import hutchpp_trace

pytestmark = pytest.mark.usefixtures("single_thread")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


@pytest.mark.parametrize("cache_graph", [True, False])
def test_every_block_hvp_matches_dense_oracle_and_finite_differences(case, cache_graph):
    gen = torch.Generator().manual_seed(1)
    with CurvatureEngine(case.model, case.objective, case.batches, cache_graph=cache_graph) as eng:
        full_v = torch.randn(case.hessian.shape[0], generator=gen, dtype=torch.float64)
        hv = eng.hvp(case.names, case.names, full_v)
        assert _rel(hv, case.hessian @ full_v) <= 1e-8
        fd = finite_difference_hvp(eng, case.names, case.names, full_v)
        assert _rel(hv, fd) <= 1e-8
        for block, members in case.blocks.items():
            v = torch.randn(len(case.index(members)), generator=gen, dtype=torch.float64)
            got = eng.block_hvp(members, v)
            assert _rel(got, case.sub(members, members) @ v) <= 1e-8, block
            fd = finite_difference_hvp(eng, members, members, v)
            assert _rel(got, fd) <= 1e-8, block


def test_off_diagonal_products_match_dense_oracle(lm_case):
    case = lm_case
    gen = torch.Generator().manual_seed(2)
    pairs = [("layers.0.q", "layers.0.k"), ("layers.1.v", "layers.0.ln2"), ("embed", "head")]
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for row, col in pairs:
            rows, cols = case.blocks[row], case.blocks[col]
            v = torch.randn(len(case.index(cols)), generator=gen, dtype=torch.float64)
            assert _rel(eng.hvp(rows, cols, v), case.sub(rows, cols) @ v) <= 1e-8


def test_block_extreme_eigenvalues_match_eigvalsh(case):
    gen = torch.Generator().manual_seed(3)
    tol = 1e-6
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for block, members in case.blocks.items():
            exact = np.linalg.eigvalsh(case.sub(members, members).numpy())
            spec = block_spectrum(eng, members, generator=gen, tol=tol, top_k=2)
            assert spec.converged, block
            norm = max(abs(exact[0]), abs(exact[-1]))
            for got, want in ((spec.lambda_max, exact[-1]), (spec.lambda_min, exact[0])):
                # relative accuracy; eigenvalues below 1e-3·‖H_B‖ are resolved to tol·1e-3·‖H_B‖
                assert abs(got - want) <= tol * max(abs(want), 1e-3 * norm), (block, got, want)
            assert spec.spectral_norm == pytest.approx(norm, rel=tol)
            assert spec.top[1].value == pytest.approx(exact[-2], rel=tol, abs=tol * 1e-3 * norm)
            assert spec.n_products >= spec.iterations


def test_lambda_min_is_not_confused_with_largest_magnitude(lm_case):
    """A block whose most negative eigenvalue dominates in magnitude (docs/numerics.md#lanczos)."""
    case = lm_case
    gen = torch.Generator().manual_seed(4)
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for members in case.blocks.values():
            exact = np.linalg.eigvalsh(case.sub(members, members).numpy())
            spec = block_spectrum(eng, members, generator=gen)
            assert spec.lambda_max >= spec.lambda_min
            if abs(exact[0]) > abs(exact[-1]):
                assert spec.lambda_min == pytest.approx(exact[0], rel=1e-6)
                assert spec.lambda_max == pytest.approx(exact[-1], rel=1e-6, abs=1e-9)
                return
    pytest.fail("the fixture has no block with a dominant negative eigenvalue")


def test_off_diagonal_sigma_max_matches_dense_svd(lm_case):
    case = lm_case
    gen = torch.Generator().manual_seed(5)
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for row, col in [("layers.0.q", "layers.0.k"), ("layers.1.ffn_in", "layers.1.v")]:
            rows, cols = case.blocks[row], case.blocks[col]
            want = np.linalg.norm(case.sub(rows, cols).numpy(), 2)
            got = off_diagonal_norm(eng, rows, cols, generator=gen, tol=1e-8)
            assert got.converged
            assert got.sigma_max == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("name", ["cls_pre_relu_rms", "regression_theory"])
def test_dense_summary_matches_oracle(name):
    case = build_case(name)  # the two smaller models: the dense pass costs n products
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        summary = dense_summary(eng, case.blocks, chunk=1)
    exact = np.linalg.eigvalsh(case.hessian.numpy())
    assert summary["lambda_max"] == pytest.approx(exact[-1], rel=1e-10)
    assert summary["lambda_min"] == pytest.approx(exact[0], rel=1e-10, abs=1e-12)
    assert summary["asymmetry"] < 1e-10
    names = summary["block_names"]
    i, j = names.index("layers.0.q"), names.index("layers.0.k")
    want = np.linalg.norm(case.sub(case.blocks["layers.0.q"], case.blocks["layers.0.k"]).numpy(), 2)
    assert summary["block_norm_matrix"][i][j] == pytest.approx(want, rel=1e-10)


def _explicit_ggn(case, members: list[str]) -> torch.Tensor:
    """Jᵀ H_out J from the full Jacobian of the outputs and the loss's output Hessian."""
    model = case.model
    params = dict(model.named_parameters())
    base = {n: p.detach() for n, p in params.items()}
    x, y = case.inputs, case.targets
    with torch.no_grad():
        out0 = model(x)
        _, counts = case.objective.output_losses(out0, y)
    total = counts.sum()

    def out_of(*block):
        p = dict(base)
        p.update(zip(members, block, strict=True))
        return torch.func.functional_call(model, p, (x,)).reshape(-1)

    jac = torch.autograd.functional.jacobian(out_of, tuple(base[n] for n in members))
    j = torch.cat([t.reshape(out0.numel(), -1) for t in jac], dim=1)

    def loss_of(flat_out):
        losses, _ = case.objective.output_losses(flat_out.reshape(out0.shape), y)
        return losses.sum() / total

    h_out = torch.autograd.functional.hessian(loss_of, out0.reshape(-1))
    return j.T @ h_out @ j


def test_ggn_and_functional_parts(case):
    gen = torch.Generator().manual_seed(6)
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for block in ("layers.0.v", "layers.0.ffn_in", "layers.0.q"):
            members = case.blocks[block]
            v = torch.randn(len(case.index(members)), generator=gen, dtype=torch.float64)
            g = ggn_product(eng, members, v)
            assert _rel(g, _explicit_ggn(case, members) @ v) <= 1e-8, block
            f = functional_product(eng, members, v)
            assert _rel(g + f, case.sub(members, members) @ v) <= 1e-10, block
        if "head" in case.blocks and case.name != "lm_post_gelu_tied":
            # the output is linear in the head: its functional part vanishes exactly
            members = case.blocks["head"]
            v = torch.randn(len(case.index(members)), generator=gen, dtype=torch.float64)
            f = functional_product(eng, members, v)
            assert float(f.norm()) <= 1e-10 * float(eng.block_hvp(members, v).norm())


def test_hutchpp_trace_within_its_standard_error(lm_case):
    case = lm_case
    gen = torch.Generator().manual_seed(7)
    n = case.hessian.shape[0]
    exact = float(torch.trace(case.hessian))
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:

        def full(v):
            return eng.hvp(case.names, case.names, v)

        est = hutchpp_trace(full, n, n_products=90, generator=gen)
        assert not est.exact and est.n_products == 90
        assert est.stderr > 0
        assert abs(est.value - exact) <= 4 * est.stderr
        members = case.blocks["layers.0.ffn_in"]  # 30 parameters: traced exactly
        block_exact = float(torch.trace(case.sub(members, members)))
        small = hutchpp_trace(lambda v: eng.block_hvp(members, v), 30, generator=gen)
        assert small.exact and small.stderr == 0.0
        assert small.value == pytest.approx(block_exact, rel=1e-12)
