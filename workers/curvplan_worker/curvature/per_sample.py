"""Per-sample statistics at w*: losses, losses at perturbed points, per-sample Hessian norms.

What the planner's sample-size criteria consume (Petrov et al. 2025, §3.3 and Theorem 7;
the off-minimum Δ criteria of the follow-ups, docs/formulas.md#sample-size):

* ``per_example_losses`` — l_i(w*) for every example (an example is a sequence; its loss is
  the mean over its loss terms: summed loss / count, as the objective defines them);
* ``perturbed_losses`` — l_i(w* + r·u) for unit directions u (random, or given such as the
  top-D Hessian eigenvectors);
* ``per_sample_hessian_norms`` — ‖∇²l_i(w*)‖₂ = max(|λ_max|, |λ_min|) on a subsample, by Lanczos
  on the per-example Hessian-vector product, with convergence flags → M of Theorem 7.

Weights are never mutated: every evaluation goes through ``torch.func.functional_call`` with a
parameter dict. The model runs in eval mode (asserted free of active dropout), attention under
the MATH SDPA backend (the fused kernels have no second derivative); the caller's mode is
restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, TypedDict

import torch
from torch import Tensor, nn
from torch.func import functional_call

from curvplan_worker.curvature.cancel import check_cancel
from curvplan_worker.curvature.device import eval_mode
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
from curvplan_worker.curvature.spectra import Spectrum, lanczos_spectrum

__all__ = [
    "ExampleLossObjective",
    "per_example_loss_sums",
    "per_example_losses",
    "per_sample_hessian_norms",
    "per_sample_section",
    "perturbed_losses",
    "perturbed_losses_record",
    "random_subspace_directions",
    "random_unit_directions",
    "select_parameters",
]

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)


ExampleLossObjective = Objective
"""The engine's one objective protocol (``objective.Objective``), under its former name here."""


# ---------------------------------------------------------------------------------------------
# Shared plumbing (also used by gradient_noise.py)
# ---------------------------------------------------------------------------------------------


def _call_objective(
    model: nn.Module,
    objective: Objective,
    params: Mapping[str, Tensor],
    inputs: Tensor,
    targets: Tensor,
) -> tuple[Tensor, Tensor]:
    """Per-example (summed loss, count) with ``params`` substituted (others: the model's own),
    through the same ``model(inputs)`` → ``objective.output_losses`` path as the operator."""
    outputs = functional_call(model, dict(params), (inputs,))
    return objective.output_losses(outputs, targets)


curvature_mode = eval_mode
"""The engine's one eval-mode guard (``device.eval_mode``), under its former name here."""


def _flatten(tensors: Sequence[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: Tensor, like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    offset = 0
    for name, ref in like.items():
        n = ref.numel()
        out[name] = flat[offset : offset + n].view_as(ref).to(ref.dtype)
        offset += n
    return out


# ---------------------------------------------------------------------------------------------
# Per-example losses
# ---------------------------------------------------------------------------------------------


def per_example_loss_sums(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    batch_size: int = 64,
    params: Mapping[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-example summed loss s_i and count c_i (fp64), evaluated in micro-batches.

    The dataset loss is L = Σ s_i / Σ c_i (engine contract: loss terms weighted by their counts),
    the empirical risk of Petrov et al. 2025 §2 (docs/formulas.md#bounds). ``params`` substitutes
    weights.
    """
    n = check_sample(inputs, targets)
    check_batch_size(batch_size)
    params = dict(params) if params is not None else {}
    device = next(model.parameters()).device
    sums = torch.empty(n, dtype=torch.float64)
    counts = torch.empty(n, dtype=torch.float64)
    with torch.no_grad(), eval_mode(model):
        for sl in iter_chunks(n, batch_size):
            check_cancel("per-sample losses")
            s, c = _call_objective(
                model,
                objective,
                params,
                to_device(inputs[sl], device),
                to_device(targets[sl], device),
            )
            sums[sl] = s.detach().to("cpu", torch.float64)
            counts[sl] = c.detach().to("cpu", torch.float64)
    if bool((counts <= 0).any()):
        bad = torch.nonzero(counts <= 0).flatten()[:10].tolist()
        raise ValueError(f"targets: examples {bad} have no loss terms (count 0, e.g. all ignored)")
    return sums, counts


def per_example_losses(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    batch_size: int = 64,
) -> Tensor:
    """l_i(w*) = s_i / c_i for every example (fp64, shape (n,)).

    The per-sample losses l_i of Petrov et al. 2025, §3.3 (L_k = (1/k)Σ_{i≤k} l_i) and of the
    docs/formulas.md#sample-size (computed once, at w*, without augmentation).
    """
    sums, counts = per_example_loss_sums(model, objective, inputs, targets, batch_size)
    return sums / counts


# ---------------------------------------------------------------------------------------------
# Directions and perturbed losses
# ---------------------------------------------------------------------------------------------


def random_unit_directions(
    params: Mapping[str, Tensor] | int, n: int, generator: torch.Generator
) -> Tensor:
    """n directions u ~ Uniform(unit sphere) over all selected parameters jointly: (n, D) fp64.

    Gaussian draws normalised over the concatenation of all selected parameters (not per
    tensor), the random unit directions of the Δ₁ criterion (docs/formulas.md#sample-size).
    ``params`` is the parameter dict (see ``select_parameters``) or the dimension D itself.
    Drawn on the CPU from ``generator`` so that a seed reproduces them on any device.
    """
    dim = params if isinstance(params, int) else numel(params)
    if n < 1:
        raise ValueError(f"n: need at least one direction, got {n}")
    if dim < 1:
        raise ValueError("params: zero-dimensional parameter space")
    z = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    directions: Tensor = z / torch.linalg.vector_norm(z, dim=1, keepdim=True)
    return directions


def random_subspace_directions(basis: Tensor, n: int, generator: torch.Generator) -> Tensor:
    """n random unit directions inside span(basis): u = Uz/‖Uz‖, z ~ N(0, I_D). Shape (n, P).

    ``basis`` (D, P) holds orthonormal rows, e.g. the top-D Hessian eigenvectors U_D of the
    subspace criterion Δ₂^(D) (curvature-aligned probing, docs/formulas.md#sample-size).
    """
    if basis.ndim != 2 or basis.shape[0] < 1:
        raise ValueError("basis: need a (D, P) matrix with D ≥ 1 rows")
    u = basis.to(torch.float64)
    gram = u @ u.T
    eye = torch.eye(u.shape[0], dtype=torch.float64, device=u.device)
    if not torch.allclose(gram, eye, atol=1e-6):
        raise ValueError("basis: rows must be orthonormal (‖UUᵀ − I‖ > 1e-6)")
    z = torch.randn(n, u.shape[0], generator=generator, dtype=torch.float64).to(u.device)
    d = z @ u
    directions: Tensor = d / torch.linalg.vector_norm(d, dim=1, keepdim=True)
    return directions


def _check_directions(directions: Tensor, dim: int) -> Tensor:
    if directions.ndim == 1:
        directions = directions.unsqueeze(0)
    if directions.ndim != 2 or directions.shape[1] != dim:
        raise ValueError(
            f"directions: expected shape (P, {dim}) over the selected parameters, "
            f"got {tuple(directions.shape)}"
        )
    norms = torch.linalg.vector_norm(directions.to(torch.float64), dim=1)
    if bool(((norms - 1.0).abs() > 1e-6).any()):
        bad = torch.nonzero((norms - 1.0).abs() > 1e-6).flatten()[:10].tolist()
        raise ValueError(f"directions: rows {bad} are not unit vectors (‖u‖ must be 1 ± 1e-6)")
    return directions


def perturbed_losses(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    radius: float,
    directions: Tensor | int,
    *,
    param_names: Sequence[str] | None = None,
    batch_size: int = 64,
    seed: int = 0,
) -> Tensor:
    """l_i(w* + r·u_p) for every direction p and example i: (P, n) fp64.

    The losses behind the off-minimum criteria Δ₁ (random unit directions at radius ε) and the
    subspace criteria (top-D eigenvectors) of the follow-ups (docs/formulas.md#sample-size).
    ``directions`` is a (P, D) tensor of unit rows over ``param_names`` (in that order; default
    all trainable parameters in ``named_parameters()`` order), or an int P: that many random
    unit directions from ``torch.Generator().manual_seed(seed)``. Live weights are not touched.
    """
    if not math.isfinite(radius) or radius < 0:
        raise ValueError(f"radius: must be a finite number ≥ 0, got {radius}")
    base = select_parameters(model, param_names)
    dim = numel(base)
    if isinstance(directions, int):
        directions = random_unit_directions(dim, directions, torch.Generator().manual_seed(seed))
    dirs = _check_directions(directions, dim)
    n = check_sample(inputs, targets)
    out = torch.empty(dirs.shape[0], n, dtype=torch.float64)
    base_flat = _flatten(list(base.values())).to(torch.float64)
    for p in range(dirs.shape[0]):
        moved = base_flat + radius * dirs[p].to(base_flat.device, torch.float64)
        params = _unflatten(moved, base)
        sums, counts = per_example_loss_sums(
            model, objective, inputs, targets, batch_size, params=params
        )
        out[p] = sums / counts
    return out


class PerturbedLossesJson(TypedDict):
    """Losses at w* + r·u for P directions u (:func:`perturbed_losses_record`): the planner's
    ``PerturbedLosses`` (``radius``, ``kind``, ``losses``) and the provenance."""

    radius: float
    kind: Literal["random", "top_eigenspace"]
    losses: list[list[float]]
    n_directions: int
    seed: int | None
    param_names: list[str]


class HessianNormsJson(TypedDict):
    """Per-example Hessian spectral norms and their Lanczos runs
    (:func:`per_sample_hessian_norms`), with the summary the planner takes M from."""

    indices: list[int]
    norms: list[float]
    lambda_max: list[float]
    lambda_min: list[float]
    residual_max: list[float]
    residual_min: list[float]
    converged: list[bool]
    n_products: list[int]
    iterations: list[int]
    all_converged: bool
    max: float
    mean: float
    quantiles: dict[str, float]
    tol: float
    seed: int
    param_names: list[str]


class PerSampleSection(TypedDict):
    """The result JSON's ``per_sample`` section (:func:`per_sample_section`)."""

    losses: list[float]
    perturbed: list[PerturbedLossesJson]
    hessian_norms: HessianNormsJson | None


def perturbed_losses_record(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    radius: float,
    directions: Tensor | int,
    *,
    kind: Literal["random", "top_eigenspace"] = "random",
    param_names: Sequence[str] | None = None,
    batch_size: int = 64,
    seed: int = 0,
) -> PerturbedLossesJson:
    """JSON-able ``{radius, kind, losses[P][n], n_directions, seed, param_names}``.

    ``kind`` labels the directions as the planner's ``PerturbedLosses.kind`` does: "random"
    (uniform on the sphere of all selected parameters) or "top_eigenspace" (given top-D Hessian
    eigenvectors, or random directions inside their span from ``random_subspace_directions``).
    The first three keys are the planner's ``PerturbedLosses``; the others record provenance.
    """
    if kind not in ("random", "top_eigenspace"):
        raise ValueError(f"kind: must be 'random' or 'top_eigenspace', got {kind!r}")
    losses = perturbed_losses(
        model,
        objective,
        inputs,
        targets,
        radius,
        directions,
        param_names=param_names,
        batch_size=batch_size,
        seed=seed,
    )
    names = list(select_parameters(model, param_names))
    return {
        "radius": float(radius),
        "kind": kind,
        "losses": losses.tolist(),
        "n_directions": int(losses.shape[0]),
        "seed": int(seed) if isinstance(directions, int) else None,
        "param_names": names,
    }


# ---------------------------------------------------------------------------------------------
# Per-sample Hessian spectral norms
# ---------------------------------------------------------------------------------------------


def per_sample_hessian_norms(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    *,
    n_subsample: int | None = 32,
    indices: Sequence[int] | None = None,
    param_names: Sequence[str] | None = None,
    seed: int = 0,
    tol: float = 1e-6,
    max_iter: int | None = None,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
) -> HessianNormsJson:
    """‖H_i(w*)‖₂ = max(|λ_max|, |λ_min|) of per-example Hessians; max → M of Theorem 7.

    Petrov et al. 2025, Theorem 7 assumes ‖H_i(w*)‖₂ ≤ M for all i; the
    planner takes M as the measured max over a sample of i (docs/formulas.md#sample-size). H_i
    is the Hessian of example i's mean loss l_i = s_i/c_i over ``param_names`` (default: all
    trainable parameters). The subsample is ``indices`` or ``n_subsample`` examples drawn
    without replacement with ``seed`` (None: all).
    Both ends come from the engine's residual-certified Lanczos (``spectra.lanczos_spectrum``:
    ‖Hy − θy‖ ≤ tol·max(|θ|, 10⁻³‖H‖) per end, at most ``max_iter`` steps, default min(D, 500)).
    Returns JSON-able ``{indices, norms, lambda_max, lambda_min, residual_max, residual_min,
    converged, n_products, iterations, all_converged, max, mean, quantiles: {"q50": …}, tol,
    seed, param_names}``.
    """
    n = check_sample(inputs, targets)
    if indices is None:
        if n_subsample is None or n_subsample >= n:
            chosen = list(range(n))
        else:
            if n_subsample < 1:
                raise ValueError(f"n_subsample: must be ≥ 1, got {n_subsample}")
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
            chosen = sorted(int(i) for i in perm[:n_subsample])
    else:
        chosen = [int(i) for i in indices]
        if not chosen:
            raise ValueError("indices: empty")
        bad = [i for i in chosen if not 0 <= i < n]
        if bad:
            raise ValueError(f"indices: out of range [0, {n}): {bad[:10]}")
    if not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol: must be a finite number > 0, got {tol}")
    if max_iter is not None and max_iter < 1:
        raise ValueError(f"max_iter: must be ≥ 1, got {max_iter}")
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantiles: {q} is outside [0, 1]")
    base = select_parameters(model, param_names)
    dim = numel(base)
    device, _ = device_dtype(base)
    generator = torch.Generator().manual_seed(seed)
    results: list[Spectrum] = []
    names = list(base)
    for i in chosen:
        check_cancel("per-sample Hessian norms")
        x = to_device(inputs[i : i + 1], device)
        y = to_device(targets[i : i + 1], device)
        # the operator on one example: its loss is s_i / c_i, the example's mean loss
        with CurvatureEngine(model, objective, [(x, y)], param_names=names) as engine:
            results.append(
                lanczos_spectrum(
                    lambda v, e=engine: e.hvp(names, names, v),
                    dim,
                    generator=generator,
                    tol=tol,
                    max_iter=max_iter,
                )
            )
    norms = torch.tensor([r.spectral_norm for r in results], dtype=torch.float64)
    return {
        "indices": chosen,
        "norms": norms.tolist(),
        "lambda_max": [r.lambda_max for r in results],
        "lambda_min": [r.lambda_min for r in results],
        "residual_max": [r.residual_max for r in results],
        "residual_min": [r.residual_min for r in results],
        "converged": [r.converged for r in results],
        "n_products": [r.n_products for r in results],
        "iterations": [r.iterations for r in results],
        "all_converged": all(r.converged for r in results),
        "max": float(norms.max()),
        "mean": float(norms.mean()),
        "quantiles": {_quantile_key(q): float(torch.quantile(norms, q)) for q in quantiles},
        "tol": float(tol),
        "seed": int(seed),
        "param_names": list(base),
    }


def _quantile_key(q: float) -> str:
    return "q" + f"{100 * q:g}".replace(".", "_")


# ---------------------------------------------------------------------------------------------
# Composition: the result's "per_sample" section
# ---------------------------------------------------------------------------------------------


def per_sample_section(
    model: nn.Module,
    objective: ExampleLossObjective,
    inputs: Tensor,
    targets: Tensor,
    *,
    radius: float | None = None,
    n_directions: int = 8,
    eigen_directions: Tensor | None = None,
    n_hessian_subsample: int | None = 32,
    param_names: Sequence[str] | None = None,
    batch_size: int = 64,
    seed: int = 0,
    tol: float = 1e-6,
    max_iter: int | None = None,
) -> PerSampleSection:
    """The result JSON's ``per_sample`` section: ``{losses, perturbed, hessian_norms}``.

    ``losses``: l_i(w*) for every example (Petrov et al. 2025 §3.3). ``perturbed``: with a
    ``radius``, the losses at w* + r·u for ``n_directions`` random unit directions (seed
    ``seed``) and, with ``eigen_directions`` ((D, P) orthonormal rows, e.g. the top-D Hessian
    eigenvectors), at those directions (kind "top_eigenspace") (docs/formulas.md#sample-size).
    ``hessian_norms``:
    ``per_sample_hessian_norms`` on ``n_hessian_subsample`` examples (0 skips it), → M of
    Theorem 7.
    """
    losses = per_example_losses(model, objective, inputs, targets, batch_size)
    perturbed: list[PerturbedLossesJson] = []
    if radius is not None:
        if not radius > 0:
            raise ValueError(f"radius: must be > 0, got {radius}")
        common = {"param_names": param_names, "batch_size": batch_size, "seed": seed}
        if n_directions > 0:
            perturbed.append(
                perturbed_losses_record(
                    model, objective, inputs, targets, radius, n_directions, **common
                )
            )
        if eigen_directions is not None:
            perturbed.append(
                perturbed_losses_record(
                    model,
                    objective,
                    inputs,
                    targets,
                    radius,
                    eigen_directions,
                    kind="top_eigenspace",
                    **common,
                )
            )
    hessian_norms = None
    if n_hessian_subsample is None or n_hessian_subsample > 0:
        hessian_norms = per_sample_hessian_norms(
            model,
            objective,
            inputs,
            targets,
            n_subsample=n_hessian_subsample,
            param_names=param_names,
            seed=seed,
            tol=tol,
            max_iter=max_iter,
        )
    return {"losses": losses.tolist(), "perturbed": perturbed, "hessian_norms": hessian_norms}
