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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from curvplan_worker.analyze.planner_inputs import planner_gradient_noise, planner_measurements

BULKY_MIN_ELEMENTS = 64
"""A numeric list with more elements than this is stored as an array, not inline."""

PER_SAMPLE_GROUP = "per_sample_losses"
PERTURBED_GROUP = "perturbed_losses"
DENSE_GROUP = "dense"
OTHER_GROUP = "arrays"


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


def _reference(group: str, key: str, array: np.ndarray) -> dict[str, Any]:
    return {"artifact": group, "tensor": key, "shape": list(array.shape)}


def split_bulky(
    result: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """(slim result, {group: {tensor name: array}}); the input is not modified."""
    groups: dict[str, dict[str, np.ndarray]] = {}

    def take(group: str, key: str, array: np.ndarray) -> dict[str, Any]:
        groups.setdefault(group, {})[key] = array
        return _reference(group, key, array)

    def walk(value: Any, path: str, group: str) -> Any:
        if isinstance(value, Mapping):
            return {k: walk(v, f"{path}.{k}" if path else str(k), group) for k, v in value.items()}
        if isinstance(value, list):
            array = _numeric_array(value)
            if array is not None and (array.size > BULKY_MIN_ELEMENTS or array.ndim > 1):
                return take(group, path, array)
            return [walk(v, f"{path}.{i}", group) for i, v in enumerate(value)]
        return value

    slim: dict[str, Any] = {}
    for key, value in result.items():
        if key == "per_sample" and isinstance(value, Mapping):
            section: dict[str, Any] = {}
            for sub, sub_value in value.items():
                array = _numeric_array(sub_value) if sub in ("losses", "groups") else None
                if array is not None:
                    section[sub] = take(PER_SAMPLE_GROUP, f"per_sample.{sub}", array)
                elif sub == "perturbed" and isinstance(sub_value, list):
                    section[sub] = [
                        walk(p, f"per_sample.perturbed.{i}", PERTURBED_GROUP)
                        if not isinstance(p, Mapping)
                        else _split_perturbed(p, i, take)
                        for i, p in enumerate(sub_value)
                    ]
                else:
                    section[sub] = walk(sub_value, f"per_sample.{sub}", OTHER_GROUP)
            slim[key] = section
        elif key == "dense":
            slim[key] = walk(value, "dense", DENSE_GROUP)
        else:
            slim[key] = walk(value, key, OTHER_GROUP)
    return slim, groups


def _split_perturbed(record: Mapping[str, Any], i: int, take: Any) -> dict[str, Any]:
    out = dict(record)
    array = _numeric_array(record.get("losses"))
    if array is not None:
        out["losses"] = take(PERTURBED_GROUP, f"per_sample.perturbed.{i}.losses", array)
    return out


def planner_fields(
    result: Mapping[str, Any], intermediate_noise: Sequence[Mapping[str, Any]] = ()
) -> tuple[dict[str, Any], list[str]]:
    """Fields of the planner's ``Measurements`` from an engine result; (fields, notes).

    Per-sample losses, perturbed losses and per-sample Hessian norms come from
    ``result["per_sample"]`` (the planner takes M of Petrov et al. 2025, Theorem 7, as their
    maximum, docs/formulas.md#sample-size, and says it is a measured lower estimate); ``theory``
    (inside the paper's assumptions or not, with reasons) from ``result["bounds"]``;
    ``blocks`` from the block spectra; ``gradient_norm_at_w_star`` from ``gradient_norm``
    (Assumption 1) and ``per_sample_gradient_rms`` (the RMS per-example gradient deviation at
    w*, what Assumption 1 really needs) with ``tokens_per_example`` from the w* gradient noise.
    Gradient noise comes from the LAST intermediate checkpoint (the one closest to w*; at w*
    itself |G|² ≈ 0 and B_simple is undefined, McCandlish et al. 2018 §2.2) and EVERY
    intermediate checkpoint, oldest first, goes to ``gradient_noise_trend``; without
    intermediate checkpoints there is none and a note says so.
    """
    per_sample = result.get("per_sample")
    fields, notes = planner_measurements(per_sample=per_sample if per_sample else None)
    # M stays a measured maximum (per_sample_hessian_norms), not a `hessian_norm_bound`: the
    # planner then labels Theorem 7's k* as resting on a lower estimate of the assumed bound.
    bounds = result.get("bounds")
    if isinstance(bounds, Mapping) and isinstance(bounds.get("applicable"), bool):
        fields["theory"] = {
            "applicable": bounds["applicable"],
            "reasons": [str(r)[:500] for r in bounds.get("reasons") or []][:100],
        }
    blocks = []
    for block in result.get("blocks") or []:
        entry = {
            "name": block["name"],
            "lambda_max": float(block["lambda_max"]),
            "lambda_min": float(block["lambda_min"]),
            "spectral_norm": float(block["spectral_norm"]),
        }
        trace = block.get("trace")
        if isinstance(trace, Mapping) and trace.get("value") is not None:
            entry["trace"] = float(trace["value"])
        blocks.append(entry)
    if blocks:
        fields["blocks"] = blocks
    full = result.get("full_model")
    if isinstance(full, Mapping) and full.get("available") and full.get("lambda_max") is not None:
        # the whole-model λ_max: the budget's gradient-descent sharpness threshold 2/λ_max
        fields["full_model"] = {
            "lambda_max": float(full["lambda_max"]),
            "residual": None if full.get("residual") is None else float(full["residual"]),
            "converged": None if full.get("converged") is None else bool(full["converged"]),
            "n_products": None if full.get("n_products") is None else int(full["n_products"]),
        }
    elif isinstance(full, Mapping) and full.get("reason"):
        notes.append(f"full_model: {full['reason']}")
    if result.get("gradient_norm") is not None:
        fields["gradient_norm_at_w_star"] = float(result["gradient_norm"])
    if result.get("gradient_noise"):
        at_w_star = result["gradient_noise"]
        if isinstance(at_w_star, Mapping) and at_w_star.get("rms_deviation") is not None:
            # Assumption 1 needs every per-example gradient at w* small, not only the mean
            fields["per_sample_gradient_rms"] = float(at_w_star["rms_deviation"])
        if isinstance(at_w_star, Mapping) and at_w_star.get("mean_count"):
            fields["tokens_per_example"] = float(at_w_star["mean_count"])
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
        trend = []
        for stats in intermediate_noise:
            point, _ = planner_gradient_noise(stats)
            if not point:
                continue
            if stats.get("checkpoint") is not None:
                point["checkpoint"] = str(stats["checkpoint"])[:200]
            if isinstance(stats.get("step"), int) and stats["step"] >= 0:
                point["step"] = stats["step"]
            if isinstance(stats.get("loss"), int | float) and stats["loss"] >= 0:
                point["loss"] = float(stats["loss"])  # the budget evaluates the trend at a loss
            if isinstance(stats.get("logged_loss"), int | float) and stats["logged_loss"] >= 0:
                point["logged_loss"] = float(stats["logged_loss"])  # the run's own log
            trend.append(point)
        if trend:
            # every checkpoint, oldest first: the noise scale's trend over training
            fields["gradient_noise_trend"] = trend
    return fields, notes
