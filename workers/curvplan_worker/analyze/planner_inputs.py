"""The engine's per-sample and gradient-noise outputs → the planner's ``Measurements`` fields.

Conversion for the planner lives with the analyze job (the engine never imports the planner
nor shapes its inputs): ``planner_gradient_noise`` gives the planner's ``DirectNoiseStats`` from
``gradient_noise.gradient_noise_statistics``, ``planner_measurements`` the fields from the
``per_sample`` section and those statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_DIRECT_KEYS = (
    "grad_sq_norm",
    "trace_sigma",
    "gHg",
    "trace_h_sigma",
    "grad_sq_norm_se",
    "trace_sigma_se",
    "gHg_se",
    "trace_h_sigma_se",
    "n_samples",
    "log_b_simple_se",
    "log_b_noise_se",
    "jackknife_groups",
    "b_simple_p_defined",
    "b_simple_median_ratio",
    "b_noise_p_defined",
    "b_noise_median_ratio",
    "stop_reason",
)


def planner_gradient_noise(stats: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The planner's ``DirectNoiseStats`` dict from ``gradient_noise_statistics`` + notes.

    Every estimate is passed through unchanged, negative ones included: an unbiased |G|² (or
    tr Σ, GᵀHG) can be negative near w* (docs/numerics.md#negative-estimates) and is never clamped
    or
    dropped; the planner then reports B_simple (B_noise) undefined with its warning
    (McCandlish et al. 2018 App. A: ratio of the unbiased estimates). A note says so.
    Returns (dict, notes).
    """
    out = {key: stats.get(key) for key in _DIRECT_KEYS if stats.get(key) is not None}
    notes: list[str] = []
    for key, label, ratio in (
        ("grad_sq_norm", "|G|²", "B_simple"),
        ("trace_sigma", "tr Σ", "B_simple"),
        ("gHg", "GᵀHG", "B_noise"),
        ("trace_h_sigma", "tr(HΣ)", "B_noise"),
    ):
        value = out.get(key)
        if value is not None and value < 0:
            notes.append(
                f"unbiased {label} = {value:.4g} is negative (indistinguishable from 0 at this "
                f"sample size): passed through unclamped, {ratio} will be undefined"
            )
    return out, notes


def planner_measurements(
    per_sample: Mapping[str, Any] | None = None,
    gradient_noise: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Fields of the planner's ``Measurements`` from this module's and per_sample's outputs.

    ``per_sample`` is ``per_sample.per_sample_section(...)``: → ``per_sample_losses`` (and
    ``per_sample_groups`` when the dataset has a ``groups`` tensor),
    ``perturbed_losses`` (the planner takes one set: the random directions if present, else the
    top-eigenspace ones) and ``per_sample_hessian_norms``. ``gradient_noise`` is
    ``gradient_noise_statistics(...)``: → ``gradient_noise`` (``DirectNoiseStats``, see
    ``planner_gradient_noise``) and ``gradient_norm_at_w_star``. Returns (fields, notes).
    """
    out: dict[str, Any] = {}
    notes: list[str] = []
    if per_sample is not None:
        out["per_sample_losses"] = list(per_sample["losses"])
        if per_sample.get("groups") is not None:
            out["per_sample_groups"] = [int(g) for g in per_sample["groups"]]
        perturbed = list(per_sample.get("perturbed") or [])
        if perturbed:
            chosen = next((p for p in perturbed if p["kind"] == "random"), perturbed[0])
            out["perturbed_losses"] = {k: chosen[k] for k in ("radius", "losses", "kind")}
            if len(perturbed) > 1:
                notes.append(f"perturbed_losses: passed the {chosen['kind']!r} set only")
        norms = per_sample.get("hessian_norms")
        if norms is not None:
            out["per_sample_hessian_norms"] = list(norms["norms"])
            if not norms.get("all_converged", True):
                notes.append("per_sample_hessian_norms: some Lanczos runs did not converge")
    if gradient_noise is not None:
        direct, more = planner_gradient_noise(gradient_noise)
        out["gradient_noise"] = direct
        notes.extend(more)
        out["gradient_norm_at_w_star"] = float(gradient_noise["gradient_norm"])
        if gradient_noise.get("rms_deviation") is not None:
            out["per_sample_gradient_rms"] = float(gradient_noise["rms_deviation"])
        if gradient_noise.get("mean_count"):
            out["tokens_per_example"] = float(gradient_noise["mean_count"])
    return out, notes
