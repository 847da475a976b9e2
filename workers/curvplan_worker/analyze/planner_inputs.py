"""The engine's per-sample and gradient-noise outputs → the planner's ``Measurements`` fields.

Conversion for the planner lives with the analyze job (the engine never imports the planner
nor shapes its inputs): ``planner_gradient_noise`` gives the planner's ``DirectNoiseStats`` from
the engine's gradient-noise record, ``planner_measurements`` the per-sample fields from its
``per_sample`` section.
"""

from __future__ import annotations

from typing import TypedDict, TypeVar

from curvplan.types.results import ArrayRef, GradientNoiseEstimate, PerSample

T = TypeVar("T")


class DirectNoiseFields(TypedDict, total=False):
    """The planner's ``DirectNoiseStats`` as the engine measured them (the keys it has)."""

    grad_sq_norm: float
    trace_sigma: float
    gHg: float
    trace_h_sigma: float
    grad_sq_norm_se: float
    trace_sigma_se: float
    gHg_se: float
    trace_h_sigma_se: float
    n_samples: int
    log_b_simple_se: float
    log_b_noise_se: float
    jackknife_groups: int
    b_simple_p_defined: float
    b_simple_median_ratio: float
    b_noise_p_defined: float
    b_noise_median_ratio: float
    stop_reason: str


class PerturbedFields(TypedDict):
    """The planner's ``PerturbedLosses``: one set of perturbed losses."""

    radius: float
    losses: list[list[float | None]]
    kind: str


class PerSampleFields(TypedDict, total=False):
    """The planner's per-sample fields (``Measurements``) from the engine's ``per_sample``."""

    per_sample_losses: list[float | None]
    per_sample_groups: list[int]
    perturbed_losses: PerturbedFields
    per_sample_hessian_norms: list[float | None]


def planner_gradient_noise(stats: GradientNoiseEstimate) -> tuple[DirectNoiseFields, list[str]]:
    """The planner's ``DirectNoiseStats`` from the gradient-noise statistics + notes.

    Every estimate is passed through unchanged, negative ones included: an unbiased |G|² (or
    tr Σ, GᵀHG) can be negative near w* (docs/numerics.md#negative-estimates) and is never clamped
    or
    dropped; the planner then reports B_simple (B_noise) undefined with its warning
    (McCandlish et al. 2018 App. A: ratio of the unbiased estimates). A note says so.
    Returns (stats, notes).
    """
    out = DirectNoiseFields()
    for key in DirectNoiseFields.__annotations__:  # in the planner's order
        value = getattr(stats, key)
        if value is not None:
            out[key] = value  # type: ignore[literal-required]
    notes: list[str] = []
    for key, label, ratio in (
        ("grad_sq_norm", "|G|²", "B_simple"),
        ("trace_sigma", "tr Σ", "B_simple"),
        ("gHg", "GᵀHG", "B_noise"),
        ("trace_h_sigma", "tr(HΣ)", "B_noise"),
    ):
        estimate = out.get(key)
        if isinstance(estimate, float) and estimate < 0:
            notes.append(
                f"unbiased {label} = {estimate:.4g} is negative (indistinguishable from 0 at "
                f"this sample size): passed through unclamped, {ratio} will be undefined"
            )
    return out, notes


def planner_measurements(per_sample: PerSample | None) -> tuple[PerSampleFields, list[str]]:
    """Fields of the planner's ``Measurements`` from the engine's ``per_sample`` section.

    → ``per_sample_losses`` (and ``per_sample_groups`` when the dataset has a ``groups``
    tensor), ``perturbed_losses`` (the planner takes one set: the random directions if present,
    else the top-eigenspace ones) and ``per_sample_hessian_norms``. Returns (fields, notes).
    The section is the engine's, in the process: its arrays inline.
    """
    out = PerSampleFields()
    notes: list[str] = []
    if per_sample is None:
        return out, notes
    out["per_sample_losses"] = list(_inline(per_sample.losses))
    if per_sample.groups is not None:
        out["per_sample_groups"] = [int(g) for g in _inline(per_sample.groups)]
    perturbed = per_sample.perturbed
    if perturbed:
        chosen = next((p for p in perturbed if p.kind == "random"), perturbed[0])
        out["perturbed_losses"] = PerturbedFields(
            radius=chosen.radius, losses=_inline(chosen.losses), kind=chosen.kind
        )
        if len(perturbed) > 1:
            notes.append(f"perturbed_losses: passed the {chosen.kind!r} set only")
    norms = per_sample.hessian_norms
    if norms is not None:
        out["per_sample_hessian_norms"] = list(_inline(norms.norms))
        if not norms.all_converged:
            notes.append("per_sample_hessian_norms: some Lanczos runs did not converge")
    return out, notes


def _inline(value: T | ArrayRef) -> T:
    """An array of the engine's section, inline in the process (never a stored reference)."""
    if isinstance(value, ArrayRef):
        raise ValueError(f"{value.tensor}: an artifact reference, not the engine's array")
    return value
