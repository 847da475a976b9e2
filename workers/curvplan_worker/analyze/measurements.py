"""From the engine's result JSON to what the job stores and what the planner reads.

* :func:`split_bulky` moves the bulky arrays (per-sample losses, perturbed losses, dense
  matrices, any long numeric list) out of the result into named groups of arrays that the
  job stores as artifacts; the result keeps a reference ``{"artifact": group, "tensor":
  key, "shape": [...]}`` in their place.
* :func:`planner_fields` builds the planner's ``Measurements`` fields from the full result
  (engine contract, "Result JSON") and the gradient-noise statistics of the intermediate
  checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from curvplan.types.results import (
    DENSE_GROUP,
    OTHER_GROUP,
    PER_SAMPLE_GROUP,
    PERTURBED_GROUP,
    Bulky,
    EngineMeasurements,
    GradientNoiseEstimate,
)
from curvplan_worker.analyze.planner_inputs import (
    DirectNoiseFields,
    PerSampleFields,
    planner_gradient_noise,
    planner_measurements,
)
from curvplan_worker.curvature.measured import as_result

__all__ = [
    "DENSE_GROUP",
    "OTHER_GROUP",
    "PERTURBED_GROUP",
    "PER_SAMPLE_GROUP",
    "planner_fields",
    "split_bulky",
]


def _numeric_array(value: Any) -> np.ndarray | None:
    """``value`` as a float/int array if it is a rectangular list of numbers, else None."""
    if not isinstance(value, list) or not value:
        return None
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        return None
    if array.dtype.kind not in "fiu" or array.dtype == object:
        return None
    return array.astype(np.float64) if array.dtype.kind == "f" else array.astype(np.int64)


def _bulky(info: FieldInfo) -> Bulky | None:
    return next((m for m in info.metadata if isinstance(m, Bulky)), None)


Groups = dict[str, dict[str, np.ndarray]]


def split_bulky(result: EngineMeasurements) -> tuple[dict[str, Any], Groups]:
    """(slim result JSON, {group: {tensor name: array}}): every array of a field declared
    :class:`Bulky` moves to its group, a reference ``{"artifact": group, "tensor": key,
    "shape": [...]}`` in its place; every other value stays inline. The input is not
    modified."""
    groups: Groups = {}

    def take(bulky: Bulky, value: Any, path: str) -> Any:
        array = _numeric_array(value)
        if array is not None and (array.size > bulky.min_elements or array.ndim > 1):
            groups.setdefault(bulky.group, {})[path] = array
            return {"artifact": bulky.group, "tensor": path, "shape": list(array.shape)}
        if bulky.deep and isinstance(value, dict):
            return {k: take(bulky, v, f"{path}.{k}") for k, v in value.items()}
        if bulky.deep and isinstance(value, list):
            return [take(bulky, v, f"{path}.{i}") for i, v in enumerate(value)]
        return value

    def section(model: BaseModel, dumped: dict[str, Any], path: str) -> dict[str, Any]:
        out = dict(dumped)
        fields = type(model).model_fields
        for key, value in dumped.items():
            where = f"{path}.{key}" if path else key
            inner = getattr(model, key, None)
            info = fields.get(key)
            bulky = _bulky(info) if info is not None else None
            if bulky is not None:
                out[key] = take(bulky, value, where)
            elif isinstance(inner, BaseModel) and isinstance(value, dict):
                out[key] = section(inner, value, where)
            elif isinstance(inner, list) and isinstance(value, list):
                out[key] = [
                    section(m, v, f"{where}.{i}") if isinstance(m, BaseModel) else v
                    for i, (m, v) in enumerate(zip(inner, value, strict=True))
                ]
        return out

    return section(result, as_result(result), ""), groups


class TheoryFields(TypedDict):
    """The planner's ``TheoryApplicability``."""

    applicable: bool
    reasons: list[str]


class BlockFields(TypedDict, total=False):
    """The planner's ``BlockCurvature`` of one block."""

    name: str
    lambda_max: float | None
    lambda_min: float | None
    spectral_norm: float | None
    trace: float


class FullModelFields(TypedDict):
    """The planner's ``FullModelCurvature``."""

    lambda_max: float
    residual: float | None
    converged: bool | None
    n_products: int | None


class TrendPointFields(DirectNoiseFields, total=False):
    """One point of the planner's ``gradient_noise_trend``: the statistics and where."""

    checkpoint: str
    step: int
    loss: float
    logged_loss: float


class PlannerFields(PerSampleFields, total=False):
    """The fields of the planner's ``Measurements`` an analysis measures (a plan job's JSON
    names; the analyze job adds those of its sweeps and validates the whole)."""

    theory: TheoryFields
    blocks: list[BlockFields]
    full_model: FullModelFields
    gradient_norm_at_w_star: float
    per_sample_gradient_rms: float
    tokens_per_example: float
    gradient_noise: DirectNoiseFields
    gradient_noise_trend: list[TrendPointFields]
    model_parameters: int


def planner_fields(
    result: EngineMeasurements, intermediate_noise: Sequence[GradientNoiseEstimate] = ()
) -> tuple[PlannerFields, list[str]]:
    """Fields of the planner's ``Measurements`` from the engine's measurements; (fields, notes).

    Per-sample losses, perturbed losses and per-sample Hessian norms come from
    ``result.per_sample`` (the planner takes M of Petrov et al. 2025, Theorem 7, as their
    maximum, docs/formulas.md#sample-size, and says it is a measured lower estimate); ``theory``
    (inside the paper's assumptions or not, with reasons) from ``result.bounds``;
    ``blocks`` from the block spectra; ``gradient_norm_at_w_star`` from ``gradient_norm``
    (Assumption 1) and ``per_sample_gradient_rms`` (the RMS per-example gradient deviation at
    w*, what Assumption 1 really needs) with ``tokens_per_example`` from the w* gradient noise.
    Gradient noise comes from the LAST intermediate checkpoint (the one closest to w*; at w*
    itself |G|² ≈ 0 and B_simple is undefined, McCandlish et al. 2018 §2.2) and EVERY
    intermediate checkpoint, oldest first, goes to ``gradient_noise_trend``; without
    intermediate checkpoints there is none and a note says so.
    """
    per_sample, notes = planner_measurements(result.per_sample)
    fields = PlannerFields(**per_sample)
    # M stays a measured maximum (per_sample_hessian_norms), not a `hessian_norm_bound`: the
    # planner then labels Theorem 7's k* as resting on a lower estimate of the assumed bound.
    bounds = result.bounds
    if bounds is not None and bounds.applicable is not None:
        fields["theory"] = {
            "applicable": bounds.applicable,
            "reasons": [str(r)[:500] for r in bounds.reasons or []][:100],
        }
    blocks: list[BlockFields] = []
    for block in result.blocks or []:
        entry: BlockFields = {
            "name": block.name,
            "lambda_max": block.lambda_max,
            "lambda_min": block.lambda_min,
            "spectral_norm": block.spectral_norm,
        }
        if block.trace is not None and block.trace.value is not None:
            entry["trace"] = block.trace.value
        blocks.append(entry)
    if blocks:
        fields["blocks"] = blocks
    full = result.full_model
    if full is not None and full.available and full.lambda_max is not None:
        # the whole-model λ_max: the budget's gradient-descent sharpness threshold 2/λ_max
        fields["full_model"] = {
            "lambda_max": full.lambda_max,
            "residual": full.residual,
            "converged": full.converged,
            "n_products": full.n_products,
        }
    elif full is not None and full.reason:
        notes.append(f"full_model: {full.reason}")
    if result.gradient_norm is not None:
        fields["gradient_norm_at_w_star"] = result.gradient_norm
    noise_at_w_star = result.gradient_noise
    if noise_at_w_star is not None:
        if noise_at_w_star.rms_deviation is not None:
            # Assumption 1 needs every per-example gradient at w* small, not only the mean
            fields["per_sample_gradient_rms"] = noise_at_w_star.rms_deviation
        if noise_at_w_star.mean_count:
            fields["tokens_per_example"] = noise_at_w_star.mean_count
    noise_source = intermediate_noise[-1] if intermediate_noise else None
    if noise_source is None:
        notes.append(
            "gradient_noise: no intermediate checkpoints, so B_simple/B_noise are undefined "
            "(|G|² ≈ 0 at a converged w*)"
        )
    if noise_source is not None:
        direct, more = planner_gradient_noise(noise_source)
        notes.extend(more)
        if direct:
            fields["gradient_noise"] = direct
        trend: list[TrendPointFields] = []
        for stats in intermediate_noise:
            direct_point, _ = planner_gradient_noise(stats)
            if not direct_point:
                continue
            point = TrendPointFields(**direct_point)
            if stats.checkpoint is not None:
                point["checkpoint"] = stats.checkpoint[:200]
            if stats.step is not None and stats.step >= 0:
                point["step"] = stats.step
            if stats.loss is not None and stats.loss >= 0:
                point["loss"] = stats.loss  # the budget evaluates the trend at a loss
            if stats.logged_loss is not None and stats.logged_loss >= 0:
                point["logged_loss"] = stats.logged_loss  # the run's own log
            trend.append(point)
        if trend:
            # every checkpoint, oldest first: the noise scale's trend over training
            fields["gradient_noise_trend"] = trend
    return fields, notes
