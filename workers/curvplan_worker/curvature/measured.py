"""The engine's result as typed records: one per stage, collected into :class:`EngineMeasurements`.

Each stage of :func:`curvplan_worker.curvature.analyze.measure` returns its record (header,
memory plan, gradient, cost inputs, block spectra, off-diagonal pairs, whole-model λ_max,
dense Hessian, top eigenspace, per-sample statistics, gradient noise, bounds); the result JSON
of the engine contract is :meth:`EngineMeasurements.as_result`, the same keys a stage wrote
(a stage that did not run leaves its key out).

Sections written by other engine modules (a spectrum's ``as_dict``, the gradient-noise
statistics, the bounds) keep every key they have (``extra="allow"``); the fields named here
are the ones the analyze job reads.

Which arrays are bulky, stored as job artifacts rather than inline, is declared on the field
(:class:`Bulky`), read by ``curvplan_worker.analyze.measurements.split_bulky``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from curvplan.types.options import AnalysisOptions, MachineSettings
from curvplan.types.spec import ModelSpec

PER_SAMPLE_GROUP = "per_sample_losses"
PERTURBED_GROUP = "perturbed_losses"
DENSE_GROUP = "dense"
OTHER_GROUP = "arrays"

JsonObject = dict[str, JsonValue]
"""A JSON object as it travels between processes (a record read back before validation)."""

SAMPLE_SIZED = 64
"""A sample-sized list (one entry per example drawn) stays inline up to this many entries."""


@dataclass(frozen=True)
class Bulky:
    """Field metadata: the field's numeric arrays go to artifact group ``group`` when they
    have more than ``min_elements`` elements or more than one dimension. ``deep``: every
    numeric array anywhere inside the field (a section of matrices)."""

    group: str
    min_elements: int = 0
    deep: bool = False


class _Section(BaseModel):
    """A record whose other keys (written by the module that measured it) are kept."""

    model_config = ConfigDict(extra="allow")


class TraceRecord(_Section):
    """tr(H_B): Hutch++ (or exact) with its standard error (``trace.py``)."""

    value: float | None = None


class BoundRecord(_Section):
    """One block's bound (``bounds/``) with its ratio to the measured norm, or why none."""

    applicable: bool | None = None
    reason: str | None = None
    ratio: float | None = None


class BlockRecord(_Section):
    """One block's spectrum (``Spectrum.as_dict``), trace, GGN and functional parts, bound."""

    name: str
    params: list[str] = Field(default_factory=list)
    n_params: int | None = None
    lambda_max: float | None = None
    lambda_min: float | None = None
    spectral_norm: float | None = None
    trace: TraceRecord | None = None
    bound: BoundRecord | None = None


class PairRecord(_Section):
    """σ_max of one off-diagonal block H[row, col] (``SingularValue.as_dict``)."""

    row: str
    col: str

    @property
    def key(self) -> str:
        return f"{self.row}|{self.col}"


class FullModelRecord(_Section):
    """λ_max of the whole-model Hessian (``full_model.py``), or why it was not measured."""

    available: bool
    lambda_max: float | None = None
    residual: float | None = None
    converged: bool | None = None
    n_products: int | None = None
    reason: str | None = None


class TopEigenspaceRecord(BaseModel):
    """The top-d eigenpairs of H (the vectors stay in the process: the per-sample stage)."""

    values: list[float]
    residuals: list[float]
    converged: bool
    n_products: int


class PerturbedRecord(_Section):
    """Per-example losses at w* + r·u for each direction u (``per_sample.py``)."""

    kind: str
    radius: float
    losses: Annotated[list[list[float | None]], Bulky(PERTURBED_GROUP)]


class HessianNormsRecord(_Section):
    """‖∇²ℓ_i‖ of a subsample of examples (``per_sample.py``); one entry per example."""

    norms: Annotated[list[float | None], Bulky(OTHER_GROUP, SAMPLE_SIZED)]
    indices: Annotated[list[int] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    lambda_max: Annotated[list[float | None] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    lambda_min: Annotated[list[float | None] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    residual_max: Annotated[list[float | None] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    residual_min: Annotated[list[float | None] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    iterations: Annotated[list[int] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    n_products: Annotated[list[int] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    all_converged: bool = True


class PerSampleRecord(BaseModel):
    """Per-example losses (and group ids), perturbed losses, per-example Hessian norms."""

    losses: Annotated[list[float | None], Bulky(PER_SAMPLE_GROUP)]
    groups: Annotated[list[int] | None, Bulky(PER_SAMPLE_GROUP)] = None
    perturbed: list[PerturbedRecord] = Field(default_factory=list)
    hessian_norms: HessianNormsRecord | None = None


class GradientNoiseRecord(_Section):
    """|G|², tr Σ, GᵀHG, tr(HΣ) at w* (``gradient_noise.py``), or why not measured."""

    available: bool | None = None
    reason: str | None = None
    gradient_norm: float | None = None
    rms_deviation: float | None = None
    mean_count: float | None = None
    grad_indices: Annotated[list[int] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    hessian_indices: Annotated[list[int] | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    series: Annotated[
        dict[str, list[int | float | None] | int | float | None] | None,
        Bulky(OTHER_GROUP, SAMPLE_SIZED, deep=True),
    ] = None
    # at an intermediate checkpoint (the analyze job's): where, and the loss there
    checkpoint: str | None = None
    checkpoint_artifact: str | list[str] | None = None
    step: int | None = None
    loss: float | None = None
    logged_loss: float | None = None

    def as_result(self) -> dict[str, Any]:
        """The statistics as JSON: the keys measured, NaN/inf as null."""
        result: dict[str, Any] = clean(self.model_dump(exclude_unset=True))
        return result


class BoundsRecord(_Section):
    """The paper's block bounds (``bounds/``): inside its assumptions or not, with reasons."""

    applicable: bool | None = None
    reasons: list[str] = Field(default_factory=list)
    blocks: dict[str, BoundRecord] = Field(
        default_factory=dict, description="Each block's bound record, by block name."
    )


class RetryRecord(_Section):
    """One out-of-memory retry: during which stage, the micro-batch it retried with."""

    during: str
    micro_batch: int


class LockstepPlanRecord(_Section):
    """How the lockstep batched its products (``memory.plan_lockstep``)."""

    batched: bool
    vectors_per_product: int


class LockstepRecord(_Section):
    """The lockstep's plan (``memory.LockstepPlan.as_dict``) and what the run did
    (``lockstep.LockstepStats.as_dict``)."""

    plan: LockstepPlanRecord
    mode: str


class PrecisionRecord(_Section):
    """Whether the model's products reach float64 accuracy (a Hugging Face model computing
    parts in float32 does not), and the accuracy they reach."""

    limited: bool
    reason: str | None = None
    reachable_relative_accuracy: float | None = None


class ModelDescription(_Section):
    """What was built: a reference spec, or a Hugging Face architecture and its vocabulary."""

    source: str


class DataParallelRecord(BaseModel):
    """The data-parallel group the operator stages ran on (``distributed.py``)."""

    world_size: int
    backend: str


class MemoryPlanRecord(_Section):
    """How the products were fitted to memory (``memory.MemoryPlan.as_dict``), the later
    stages' memory, the lockstep's plan and what it did, and the retries."""

    retries: list[RetryRecord] = Field(default_factory=list)
    final_micro_batch: int | None = None
    lockstep: LockstepRecord | None = None


class FanOutChild(BaseModel):
    """One child job of a block fan-out: its blocks and pairs, estimated cost, how long it
    measured, which attempt succeeded."""

    job_id: str
    name: str | None = None
    blocks: list[str]
    pairs: list[list[str]]
    estimated_cost: float | None = None
    elapsed_s: float | None = None
    attempt: int | None = None


class FanOutRecord(BaseModel):
    """The block fan-out an analysis was assembled from (``docs/numerics.md#block-fan-out``)."""

    children: list[FanOutChild]


class EngineMeasurements(_Section):
    """The engine's answer for the checkpoint at w*: every stage's record (those that ran).

    The analyze job adds ``fan_out`` (the children of a block fan-out) and ``cost_estimate``
    (the ETA's record) before it stores the result.
    """

    versions: dict[str, str | None] | None = None
    device: str
    dtype: str
    seed: int
    seed_derivation: dict[str, str | dict[str, str]]
    options: AnalysisOptions
    machine: MachineSettings
    model: ModelDescription
    precision_limited: PrecisionRecord
    n_parameters: int
    n_examples: int
    spec: ModelSpec | None = None
    cache_graph: bool | None = None
    eval_batch_size: int | None = None
    data_parallel: DataParallelRecord | None = None
    memory_plan: MemoryPlanRecord | None = None
    loss: float | None = None
    n_loss_terms: int | float | None = None
    gradient_norm: float | None = None
    n_eval_batches: int | None = None
    cost_inputs: dict[str, Any] | None = None
    blocks: list[BlockRecord] = Field(default_factory=list)
    off_diagonal: list[PairRecord] = Field(default_factory=list)
    full_model: FullModelRecord | None = None
    dense: Annotated[dict[str, Any] | None, Bulky(DENSE_GROUP, SAMPLE_SIZED, deep=True)] = None
    top_eigenspace: TopEigenspaceRecord | None = None
    per_sample: PerSampleRecord | None = None
    gradient_noise: GradientNoiseRecord | None = None
    bounds: BoundsRecord | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    elapsed_s: float | None = None
    fan_out: FanOutRecord | None = None
    cost_estimate: dict[str, Any] | None = None

    def as_result(self) -> dict[str, Any]:
        """The result JSON of the engine contract: the stages that ran, NaN/inf as null."""
        result: dict[str, Any] = clean(self.model_dump(exclude_unset=True))
        return result


M = TypeVar("M", bound=BaseModel)


def fully_set(model: M) -> M:
    """A copy of ``model`` with every field marked set, nested models too (no validation):
    :meth:`EngineMeasurements.as_result` then writes all of its fields, as its own
    ``model_dump`` would, although the result leaves out the stages that did not run."""
    copy = model.model_copy()
    for name in type(model).model_fields:
        value = getattr(copy, name)
        if isinstance(value, BaseModel):
            object.__setattr__(copy, name, fully_set(value))
    object.__setattr__(copy, "__pydantic_fields_set__", set(type(model).model_fields))
    return copy


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, tensors → lists, tuples → lists."""
    import torch

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, torch.Tensor):
        return clean(value.tolist())
    return value
