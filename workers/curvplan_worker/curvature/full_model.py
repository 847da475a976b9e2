"""λ_max of the whole-model Hessian: one Lanczos run over ALL parameters.

The blocks' spectra (``spectra.block_spectrum``) bound it only from below: a diagonal block is
a principal submatrix of H, so λ_max(H_BB) ≤ λ_max(H) (Cauchy interlacing). The budget's
gradient-descent sharpness threshold 2/λ_max (Cohen et al. 2021) needs λ_max(H) itself, so the
analysis runs the engine's Lanczos (:func:`spectra.lanczos_spectrum`, unchanged) once more on
the whole-model operator v ↦ H v, asking for the top end only.

Cost: ``n_products`` Hessian-vector products over all parameters (each about one block
product: a double backward through the whole model), plus a Lanczos basis of
n_parameters × iterations float64 numbers on the host. When that basis would exceed
``FULL_BASIS_BYTES`` the run is skipped and the record says why.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import torch

from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.spectra import lanczos_spectrum

FULL_MODEL_KEY = "full_model"
"""Key of the run's generator (``analyze.derived_generator(seed, key)``)."""

FULL_BASIS_BYTES = 4 * 2**30
"""Host memory the whole-model Lanczos basis may take (float64, n × iterations)."""


class FullModelLambdaMax(TypedDict):
    """λ_max of H over every parameter (the result's ``full_model``)."""

    available: Literal[True]
    lambda_max: float
    residual: float
    converged: bool
    n_products: int
    iterations: int
    n_params: int
    operator: str


class FullModelUnavailable(TypedDict):
    """Why the whole-model λ_max was not measured (its basis would not fit)."""

    available: Literal[False]
    n_params: int
    reason: str


def full_model_lambda_max(
    engine: CurvatureEngine,
    *,
    generator: torch.Generator,
    tol: float,
    max_iter: int | None,
    floor: float,
    basis_bytes: int = FULL_BASIS_BYTES,
) -> FullModelLambdaMax | FullModelUnavailable:
    """λ_max of H over every parameter of ``engine`` (module docstring): a record with
    ``lambda_max``, ``residual``, ``converged``, ``n_products``, ``iterations``, ``n_params``;
    or ``{"available": False, "reason": …}`` when the basis would not fit ``basis_bytes``."""
    names = list(engine.names)
    n = engine.layout(names).numel
    iterations = min(n, max_iter or 500)
    need = 8 * n * (iterations + 1)
    if need > basis_bytes:
        return {
            "available": False,
            "n_params": n,
            "reason": f"the whole-model Lanczos basis needs {need / 2**30:.1f} GiB "
            f"({n:,} parameters × {iterations + 1} vectors, float64) > "
            f"{basis_bytes / 2**30:.1f} GiB: not measured",
        }
    spectrum = lanczos_spectrum(
        lambda v: engine.hvp(names, names, v),
        n,
        generator=generator,
        tol=tol,
        max_iter=max_iter,
        ends=("max",),
        floor=floor,
    )
    return {
        "available": True,
        "lambda_max": spectrum.lambda_max,
        "residual": spectrum.residual_max,
        "converged": spectrum.converged,
        "n_products": spectrum.n_products,
        "iterations": spectrum.iterations,
        "n_params": n,
        "operator": "whole-model Hessian (all parameters)",
    }
