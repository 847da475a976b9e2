"""The Lanczos eigenvalue certificate (docs/numerics.md#lanczos) against dense oracles: the
reported residual bounds the eigenvalue error, |λ − value| ≤ residual (Bauer–Fike), on every
block of the tiny engine cases (their independent dense Hessian) and on spectra built to be hard
(a near-degenerate top, dense edges, λ_min in a cluster, a small restarted basis), at loose and
tight tolerances and several start vectors; a converged end's residual meets its tolerance; and
the Ritz values lie inside the spectrum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.spectra import block_spectrum, lanczos_spectrum

pytestmark = pytest.mark.usefixtures("single_thread")

TOLS = (1e-1, 1e-2, 1e-3)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_bounds_hold(
    spec, exact: np.ndarray, tol: float, floor: float = 1e-3, cluster: float = 0.0
) -> None:
    """``cluster``: the width of an end's cluster; the residual bounds the distance to the
    *nearest* eigenvalue (Bauer–Fike, always), and to the end only up to a cluster at the end
    that is narrower than the residual (docs/numerics.md#lanczos)."""
    norm = max(abs(exact[0]), abs(exact[-1]))
    rounding = 1e-11 * norm  # float64 products and basis
    for value, residual, want in (
        (spec.lambda_max, spec.residual_max, exact[-1]),
        (spec.lambda_min, spec.residual_min, exact[0]),
    ):
        assert np.min(np.abs(exact - value)) <= residual + rounding
        assert abs(value - want) <= residual + cluster + rounding, (value, want, residual, tol)
        if spec.converged:
            assert residual <= tol * max(abs(value), floor * norm) + rounding
    # a Rayleigh quotient lies inside the spectrum (Cauchy interlacing)
    assert spec.lambda_max <= exact[-1] + rounding and spec.lambda_min >= exact[0] - rounding


def test_every_block_bound_holds_against_the_dense_hessian(case):
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for name, members in case.blocks.items():
            exact = np.linalg.eigvalsh(case.sub(members, members).numpy())
            for tol in TOLS:
                for seed in range(2):
                    spec = block_spectrum(eng, members, generator=_gen(seed), tol=tol)
                    assert spec.converged, (name, tol, seed)
                    _assert_bounds_hold(spec, exact, tol)


def _spectra() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n = 200
    near_degenerate = np.sort(rng.uniform(-0.3, 0.5, n))
    near_degenerate[-2:] = [0.999, 1.0]  # the top two 1e-3 apart
    dense_edges = np.sort(rng.uniform(-1.0, 1.0, n))  # both ends in a dense continuum
    clustered_min = np.linspace(-1e-3, 2.0, n)
    clustered_min[:40] = np.linspace(-1e-3, -0.9e-3, 40)  # λ_min in a cluster near zero
    isolated = np.concatenate([np.linspace(-0.5, 0.5, n - 2), [-2.0, 3.0]])
    return {
        "near_degenerate": near_degenerate,
        "dense_edges": dense_edges,
        "clustered_min": clustered_min,
        "isolated": np.sort(isolated),
    }


@pytest.mark.parametrize("kind", list(_spectra()))
def test_the_bound_holds_on_hard_spectra_and_small_bases(kind):
    values = _spectra()[kind]
    n = len(values)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=_gen(1), dtype=torch.float64))
    matrix = q @ torch.diag(torch.from_numpy(values)) @ q.T
    for tol in TOLS:
        for basis in (None, 12):
            for seed in range(2):
                spec = lanczos_spectrum(
                    lambda v: matrix @ v,
                    n,
                    generator=_gen(seed),
                    tol=tol,
                    basis=basis,
                    max_iter=2000,
                )
                cluster = values[-1] - values[-2] if kind == "near_degenerate" else 0.0
                _assert_bounds_hold(spec, values, tol, cluster=cluster)
