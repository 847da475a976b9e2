"""Per-kind job results: what ``GET /v1/jobs/{id}`` answers in ``result`` once a job succeeded.

A ``plan`` job's result is :class:`PlanResult`, an ``analyze`` job's :class:`AnalyzeResult`,
a ``sweep`` job's :class:`SweepJobResult`: each kind declares its own (the ``result_type`` of
its create model, ``curvplan.types.jobs``).
The recommendation inside both is :class:`curvplan.types.planner.Recommendation`.

The engine's measurements are wide and grow with the engine; :class:`EngineMeasurements`
types the fields a client reads and keeps any other field (``extra="allow"``), so a result
stored by an older or newer worker still validates. Bulky arrays are not inline: they are
:class:`ArrayRef` objects pointing into the job's output artifacts (``AnalyzeResult.artifacts``).

These models are also the engine's records: each stage of the worker's engine builds its
section directly (the arrays inline, in the process), and which arrays are bulky, stored as
job artifacts rather than inline, is declared on the field (:class:`Bulky`, read by
``curvplan_worker.analyze.measurements.split_bulky``). A bulky field therefore holds the arrays
in the process and an :class:`ArrayRef` once stored.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from curvplan.types.options import AnalysisOptions, MachineSettings
from curvplan.types.planner import Recommendation
from curvplan.types.spec import ModelSpec
from curvplan.types.sweep import PointResult, SweepResult

PER_SAMPLE_GROUP = "per_sample_losses"
PERTURBED_GROUP = "perturbed_losses"
DENSE_GROUP = "dense"
OTHER_GROUP = "arrays"

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


class _Open(BaseModel):
    """A section that keeps fields it does not name (results outlive the code that wrote them).

    Stored (:func:`stored_result`), an open record keeps only the fields it was given: a
    record the engine wrote without some field is stored without it, as the engine wrote it,
    and reads back with the field's default.
    """

    model_config = ConfigDict(extra="allow")


class ArrayRef(_Open):
    """A bulky array moved out of the result: tensor ``tensor`` of output ``artifact``."""

    artifact: str = Field(description="Name of the output group; its id is in `artifacts`.")
    tensor: str = Field(description="Tensor name inside that safetensors artifact.")
    shape: list[int]


class TraceEstimate(_Open):
    """tr(H_B): exact (dense) or a Hutch++ estimate with its standard error."""

    value: float | None = None
    stderr: float | None = None
    method: str | None = None
    exact: bool | None = None
    n_products: int | None = None


class BlockBound(_Open):
    """The paper's bound for one block where its theorems give one (``value``, the measured
    spectral norm's ``ratio`` to it), else ``applicable`` false with the ``reason``."""

    applicable: bool | None = None
    reason: str | None = None
    ratio: float | None = None


class Eigenpair(_Open):
    """One of the top-k eigenvalues of a Lanczos run, with its residual."""

    value: float | None = None
    residual: float | None = None
    converged: bool | None = None


class LanczosSpectrum(_Open):
    """The ends of an operator's spectrum by Lanczos, certified to ``tolerance``
    (``residual*`` are the attained residuals, ``attained_tolerance`` the worst relative one)."""

    lambda_max: float | None = None
    lambda_min: float | None = None
    spectral_norm: float | None = None
    converged: bool | None = None
    iterations: int | None = None
    n_products: int | None = None
    tolerance: float | None = None
    attained_tolerance: float | None = None
    residual: float | None = None
    residual_max: float | None = None
    residual_min: float | None = None
    precision_limited: bool | None = None
    basis_vectors: int | None = None
    restarts: int | None = None
    restarts_for_min: int | None = None
    top_k: list[Eigenpair] | None = Field(
        default=None, description="The top-k eigenvalues, when more than λ_max was asked."
    )


class BlockSlice(_Open):
    """A block member that is a slice of a parameter: ``param[..., start:stop]`` on ``dim``."""

    param: str
    dim: int
    start: int
    stop: int


class BlockSpectrum(LanczosSpectrum):
    """One parameter block's Hessian spectrum as the engine measured it (Lanczos, certified
    to ``tolerance``; ``residual*`` are the attained residuals)."""

    name: str
    params: list[str] = Field(default_factory=list)
    n_params: int | None = None
    slices: list[BlockSlice] | None = Field(
        default=None, description="The members that are slices of a parameter."
    )
    trace: TraceEstimate | None = None
    ggn: LanczosSpectrum | None = Field(
        default=None, description="The Gauss-Newton part G of the block (H = G + F)."
    )
    functional: LanczosSpectrum | None = Field(
        default=None, description="The functional part F of the block (H = G + F)."
    )
    bound: BlockBound | None = Field(
        default=None, description="The paper's bound for this block, when one applies."
    )


class BlockPair(_Open):
    """σ_max of one off-diagonal block H[row, col] (Lanczos on H_rc H_rcᵀ)."""

    row: str
    col: str
    sigma_max: float | None = None
    converged: bool | None = None
    residual: float | None = None
    n_products: int | None = None
    precision_limited: bool | None = None
    basis_vectors: int | None = None
    restarts: int | None = None

    @property
    def key(self) -> str:
        """``row|col``: how a fan-out names the pair."""
        return f"{self.row}|{self.col}"


class TopEigenspace(_Open):
    """The top-d eigenpairs of the whole-model Hessian (the vectors stay in the engine's
    process: the per-sample stage perturbs along them)."""

    values: list[float | None] = Field(default_factory=list)
    residuals: list[float | None] = Field(default_factory=list)
    converged: bool | None = None
    n_products: int | None = None


class PerturbedLossSet(_Open):
    """Per-example losses at w* + r·u for each direction u of one kind (``random`` or
    ``top_eigenspace``): one row per direction."""

    kind: str
    radius: float
    losses: Annotated[list[list[float | None]] | ArrayRef, Bulky(PERTURBED_GROUP)]


class PerSampleHessianNorms(_Open):
    """‖∇²ℓ_i‖ of a subsample of examples, one entry per example (with the Lanczos ends)."""

    norms: Annotated[list[float | None] | ArrayRef, Bulky(OTHER_GROUP, SAMPLE_SIZED)]
    indices: Annotated[list[int] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    lambda_max: Annotated[
        list[float | None] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)
    ] = None
    lambda_min: Annotated[
        list[float | None] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)
    ] = None
    residual_max: Annotated[
        list[float | None] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)
    ] = None
    residual_min: Annotated[
        list[float | None] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)
    ] = None
    iterations: Annotated[list[int] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    n_products: Annotated[list[int] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    all_converged: bool = True


class PerSample(_Open):
    """Per-example losses (and group ids), perturbed losses, per-example Hessian norms."""

    losses: Annotated[list[float | None] | ArrayRef, Bulky(PER_SAMPLE_GROUP)]
    groups: Annotated[list[int] | ArrayRef | None, Bulky(PER_SAMPLE_GROUP)] = None
    perturbed: list[PerturbedLossSet] = Field(default_factory=list)
    hessian_norms: PerSampleHessianNorms | None = None


class CostInputs(_Open):
    """What the cost model was given before the spectra (``limits.cost_inputs``); the
    timings (spectra, example, stages, memory) are kept as the engine wrote them."""

    ms_per_product: float | None = None
    first_product_ms: float | None = None
    blocks: dict[str, int] = Field(
        default_factory=dict, description="Parameters of each block the run measures."
    )
    pairs: list[tuple[str, str, int, int]] = Field(
        default_factory=list, description="Each pair the run measures: row, col, their sizes."
    )
    n_params: int | None = None
    n_examples: int | None = None
    tokens: float | None = None
    micro_batch: int | None = None


class StageCost(_Open):
    """One stage of a cost estimate: expected and worst-case products, and seconds."""

    stage: str
    products: float
    worst_products: float
    seconds: float
    items: dict[str, float] | None = Field(
        default=None, description="Expected products of each block or pair of the stage."
    )
    item_seconds: dict[str, float] | None = Field(
        default=None,
        description="Expected seconds of each block or pair, at its own timed products "
        "(docs/operations.md#cost-model-and-eta).",
    )


class MeasuredCost(_Open):
    """The engine's measured figures a cost estimate was made from (``cost_inputs``): one
    product's milliseconds, the micro-batch; the memory, spectra and example timings are kept
    as the engine wrote them."""

    ms_per_product: float | None = None
    first_product_ms: float | None = None
    micro_batch: int | None = None


class AttemptLimitsRecord(_Open):
    """The worker's limits on the attempt (docs/operations.md#memory-limit)."""

    memory_limit_bytes: int | None = None
    memory_limit_source: str | None = None
    time_limit_seconds: int | float | None = None
    micro_batch_factor: float | None = None


class CostEstimate(_Open):
    """An analysis's cost before the spectra: products × milliseconds per product, by stage."""

    products: float
    seconds: float = Field(description="Expected seconds of the engine stages.")
    worst_seconds: float = Field(description="Seconds if every Lanczos run went to max_iter.")
    ms_per_product: float
    ms_source: str = Field(description="measured (one product before the spectra) or prior.")
    setup_seconds: float = 0.0
    stages: list[StageCost] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    stage_seconds: dict[str, float] | None = Field(
        default=None, description="Seconds each engine stage took in the run."
    )
    first_eta_seconds: float | None = Field(
        default=None, description="The first ETA reported, right after the estimate."
    )
    actual_seconds_after_first_eta: float | None = None
    eta_relative_error: float | None = Field(
        default=None, description="(first ETA − actual) / actual: the estimate's error."
    )
    measured: MeasuredCost | None = Field(
        default=None, description="The measured figures the estimate was made from."
    )
    limits: AttemptLimitsRecord | None = Field(
        default=None, description="The worker's memory and time limits on the attempt."
    )


class SeedDerivation(_Open):
    """How a stage's generator seed derives from the job seed (docs/numerics.md#seeds)."""

    scheme: str | None = None
    formula: str | None = None
    keys: dict[str, str] | None = Field(default=None, description="Stage → the key it hashes.")


class FullModelLambda(_Open):
    """λ_max of the whole-model Hessian from one Lanczos over all parameters, or
    ``available`` false with the ``reason``."""

    available: bool | None = None
    lambda_max: float | None = None
    residual: float | None = None
    converged: bool | None = None
    n_products: int | None = None
    iterations: int | None = None
    n_params: int | None = None
    operator: str | None = None
    reason: str | None = None


class DenseBlock(_Open):
    """One diagonal block of the dense Hessian: its exact eigenvalue ends and trace."""

    name: str
    lambda_max: float | None = None
    lambda_min: float | None = None
    spectral_norm: float | None = None
    trace: float | None = None


class DenseHessian(_Open):
    """The exact dense Hessian's spectrum (small models), of the whole and of each block."""

    n_parameters: int | None = None
    lambda_max: float | None = None
    lambda_min: float | None = None
    spectral_norm: float | None = None
    trace: float | None = None
    asymmetry: float | None = Field(
        default=None, description="‖H − Hᵀ‖_max / ‖H‖_max of the computed matrix."
    )
    blocks: list[DenseBlock] | None = None
    block_names: list[str] | None = None
    block_norm_matrix: list[list[float]] | ArrayRef | None = Field(
        default=None, description="σ_max of every block pair, in block_names order."
    )


class MemoryRetry(_Open):
    """One out-of-memory retry: during which stage, the micro-batch it retried with (an
    in-run retry: the micro-batch before and after; a retried attempt: the one it ran with)."""

    during: str
    micro_batch: int | None = None
    from_micro_batch: int | None = None
    to_micro_batch: int | None = None


class LockstepBatching(_Open):
    """How the lockstep batched its products (``memory.plan_lockstep``)."""

    batched: bool
    vectors_per_product: int


class LockstepRun(_Open):
    """The lockstep's plan (``memory.LockstepPlan.as_dict``) and what the run did
    (``lockstep.LockstepStats.as_dict``)."""

    plan: LockstepBatching
    mode: str


class MemoryPlan(_Open):
    """How the products were fitted to memory (docs/numerics.md#memory-plan); the measured
    byte counts and the later stages' memory are kept as the engine wrote them."""

    budget_bytes: int | None = None
    budget_source: str | None = None
    source: str | None = None
    n_examples: int | None = None
    configured_micro_batch: int | None = None
    micro_batch: int | None = None
    cache_graph: bool | None = None
    retries: list[MemoryRetry] = Field(default_factory=list)
    final_micro_batch: int | None = None
    lockstep: LockstepRun | None = None


class Precision(_Open):
    """Whether the model's products reach float64 accuracy (a Hugging Face model computing
    parts in float32 does not), and the accuracy they reach."""

    limited: bool
    reason: str | None = None
    reachable_relative_accuracy: float | None = None


class ModelDescription(_Open):
    """What was built: a reference spec, or a Hugging Face architecture and its vocabulary."""

    source: str


class DataParallelGroup(_Open):
    """The data-parallel group the operator stages ran on (``distributed.py``)."""

    world_size: int
    backend: str


class FanOutChild(_Open):
    """One child job of a block fan-out: its blocks and pairs, estimated cost, how long it
    measured, which attempt succeeded."""

    job_id: str
    name: str | None = None
    blocks: list[str]
    pairs: list[list[str]]
    estimated_cost: float | None = None
    elapsed_s: float | None = None
    attempt: int | None = None


class FanOut(_Open):
    """The block fan-out an analysis was assembled from (docs/numerics.md#block-fan-out)."""

    children: list[FanOutChild]


class ModelBounds(_Open):
    """The paper's block bounds for the model (the bounds ``blocks`` by name), or
    ``applicable`` false with the ``reasons`` the model is outside the theory's family."""

    applicable: bool | None = None
    reasons: list[str] | None = None
    blocks: dict[str, BlockBound] | None = Field(
        default=None, description="Each block's bound record, by block name."
    )


class GradientNoiseEstimate(_Open):
    """Gradient-noise statistics from per-example gradients (|G|², tr Σ, and the noise
    scales B_simple = tr Σ / |G|², B_noise = tr(HΣ) / GᵀHG), or ``available`` false with
    the ``reason``; the standard errors and the sampling record are kept as written."""

    available: bool | None = None
    reason: str | None = None
    grad_sq_norm: float | None = None
    trace_sigma: float | None = None
    gHg: float | None = None
    trace_h_sigma: float | None = None
    grad_sq_norm_se: float | None = None
    trace_sigma_se: float | None = None
    gHg_se: float | None = None
    trace_h_sigma_se: float | None = None
    n_samples: int | None = None
    log_b_simple_se: float | None = None
    log_b_noise_se: float | None = None
    jackknife_groups: int | None = None
    b_simple_p_defined: float | None = None
    b_simple_median_ratio: float | None = None
    b_noise_p_defined: float | None = None
    b_noise_median_ratio: float | None = None
    stop_reason: str | None = None
    b_simple: float | None = None
    b_noise: float | None = None
    gradient_norm: float | None = None
    rms_deviation: float | None = Field(
        default=None, description="RMS of the per-example gradients' deviation from their mean."
    )
    mean_count: float | None = Field(default=None, description="Loss terms per example.")
    grad_indices: Annotated[list[int] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    hessian_indices: Annotated[list[int] | ArrayRef | None, Bulky(OTHER_GROUP, SAMPLE_SIZED)] = None
    series: Annotated[
        dict[str, list[int | float | None] | ArrayRef | int | float | None] | None,
        Bulky(OTHER_GROUP, SAMPLE_SIZED, deep=True),
    ] = None
    # at an intermediate checkpoint (the analyze job's): where, and the loss there
    checkpoint: str | None = None
    checkpoint_artifact: str | list[str] | None = None
    step: int | None = None
    loss: float | None = None
    logged_loss: float | None = None


class EngineMeasurements(_Open):
    """The curvature engine's answer for the checkpoint at w*: every stage's record (those
    that ran; bulky arrays as references once stored).

    The engine's process holds the typed inputs (``options``, ``machine``, ``spec``) as the
    models it ran with; a stored result holds them as JSON, not those models, which refuse
    fields a later version removes. The analyze job adds ``fan_out`` (the children of a block
    fan-out) and ``cost_estimate`` (the ETA's record) before it stores the result.
    """

    versions: dict[str, str | None] | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int | None = None
    seed_derivation: SeedDerivation | None = Field(
        default=None,
        description="How each block's, pair's and the top eigenspace's generator is seeded "
        "from the seed (docs/numerics.md#seeds).",
    )
    fan_out: FanOut | None = Field(
        default=None,
        description="The block fan-out, when there was one: its child jobs, the blocks and "
        "pairs each measured and their estimated costs.",
    )
    options: dict[str, JsonValue] | AnalysisOptions | None = Field(
        default=None,
        union_mode="left_to_right",
        description="The analysis options the engine ran with.",
    )
    machine: dict[str, JsonValue] | MachineSettings | None = Field(
        default=None,
        union_mode="left_to_right",
        description="The worker's machine settings (device, threads, caching, budgets).",
    )
    model: ModelDescription | None = Field(default=None, description="What was built.")
    precision_limited: Precision | None = None
    spec: dict[str, JsonValue] | ModelSpec | None = Field(
        default=None, union_mode="left_to_right", description="The model spec it built."
    )
    n_parameters: int | None = None
    n_examples: int | None = None
    cache_graph: bool | None = None
    eval_batch_size: int | None = None
    data_parallel: DataParallelGroup | None = None
    loss: float | None = None
    n_loss_terms: int | float | None = None
    gradient_norm: float | None = None
    n_eval_batches: int | None = None
    blocks: list[BlockSpectrum] | None = None
    off_diagonal: list[BlockPair] | None = None
    dense: Annotated[DenseHessian | None, Bulky(DENSE_GROUP, SAMPLE_SIZED, deep=True)] = None
    top_eigenspace: TopEigenspace | None = None
    full_model: FullModelLambda | None = Field(
        default=None,
        description="λ_max of the whole-model Hessian from one Lanczos over all parameters: "
        "lambda_max, residual, converged, n_products (its cost), iterations, n_params; or "
        "available false with the reason.",
    )
    per_sample: PerSample | None = Field(
        default=None, description="Per-sample losses and perturbations ({artifact, tensor}…)."
    )
    gradient_noise: GradientNoiseEstimate | None = None
    bounds: ModelBounds | None = None
    memory_plan: MemoryPlan | None = Field(
        default=None,
        description="How the products were fitted to memory: measured bytes per example and "
        "per batch, cached or not, the micro-batch chosen, the budget, the measurement's source, "
        "out-of-memory retries (docs/numerics.md#memory-plan).",
    )
    peak_memory_bytes: int | None = Field(
        default=None, description="Peak memory of the engine run (peak_memory_source says what)."
    )
    peak_memory_source: str | None = None
    cost_inputs: CostInputs | None = Field(
        default=None,
        description="What the cost model was given before the spectra: one measured product "
        "(ms_per_product, first_product_ms), the spectra's products as they will run "
        "(spectra: each block's and pair's own, the Lanczos iteration's cost, the batched "
        "round), a one-example product (example), the blocks and pairs, the sample's size "
        "and the memory the smallest plan needs (docs/operations.md#cost-model-and-eta).",
    )
    cost_estimate: CostEstimate | None = Field(
        default=None,
        description="The estimate made from them, stage by stage (products × ms per product), "
        "and how the first ETA compared with the run (docs/operations.md#cost-model-and-eta).",
    )
    elapsed_s: float | None = None


class PlannerArray(_Open):
    """A bulky planner input in an output artifact (``perturbed_losses`` also keeps its
    ``radius`` and ``kind``)."""

    artifact_id: str
    tensor: str
    radius: float | None = None
    kind: str | None = None


class PlannerInputs(_Open):
    """The planner's measurements without the bulky arrays (a re-plan rebuilds them)."""

    fields: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="The planner's measurement fields (curvplan.types.planner.Measurements) "
        "other than the bulky arrays, as JSON.",
    )
    arrays: dict[str, PlannerArray] = Field(
        default_factory=dict, description="{field: {artifact_id, tensor, …}}"
    )


class PlanResult(_Open):
    """Result of a succeeded ``plan`` job."""

    recommendation: Recommendation


class AnalyzeResult(_Open):
    """Result of a succeeded ``analyze`` job: measurements, recommendation, output artifacts."""

    measurements: EngineMeasurements
    intermediate_gradient_noise: list[GradientNoiseEstimate] = Field(
        default_factory=list,
        description="Gradient-noise statistics at each intermediate checkpoint, in order.",
    )
    planner_inputs: PlannerInputs | None = None
    artifacts: dict[str, uuid.UUID] = Field(
        default_factory=dict, description="Output artifacts of the job: {group name: artifact id}."
    )
    notes: list[str] = Field(default_factory=list)
    sweeps_used: dict[str, list[uuid.UUID]] = Field(
        default_factory=dict,
        description="Which of `sweeps` each planner table came from: {loss_vs_data | "
        "steps_to_target | branched_critical_batch: [sweep job ids]}. Data sweeps of one setup "
        "are combined into one L(D), batch sweeps of one setup and target into one "
        "steps-to-target table (docs/budget.md#data-sweep).",
    )
    recommendation: Recommendation
    peak_memory_bytes: int | None = Field(
        default=None,
        description="Peak memory of the attempt over all stages: CUDA peak allocated on its "
        "device, else the process's peak resident memory (peak_memory_source).",
    )
    peak_memory_source: str | None = Field(
        default=None, description="What measured peak_memory_bytes (cuda or the process RSS)."
    )


class AnalyzeBlocksResult(_Open):
    """Result of a succeeded ``analyze_blocks`` job (one group of a block fan-out): the
    records of its blocks and pairs, which its parent assembles."""

    measurements: EngineMeasurements
    estimated_cost: float | None = None


class SweepJobResult(_Open):
    """Result of a succeeded ``sweep`` job: the sweep's fit, the planner measurements it gives
    an analysis (through ``sweeps``), and the recommendation from those alone."""

    sweep: SweepResult
    measurements: dict[str, Any] = Field(
        default_factory=dict,
        description="The planner measurements of the sweep (steps_to_target, loss_vs_data or "
        "branched_critical_batch): what an analysis listing it in `sweeps` plans with.",
    )
    recommendation: Recommendation


class SweepPointJobResult(_Open):
    """Result of a succeeded ``sweep_point`` job (one training run of a sweep)."""

    point: PointResult


JobResult = AnalyzeResult | PlanResult | AnalyzeBlocksResult | SweepJobResult | SweepPointJobResult


def _not_given(value: object) -> dict[Any, Any]:
    """The ``exclude`` tree of the fields the open records inside ``value`` were not given."""
    tree: dict[Any, Any] = {}
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        if isinstance(value, _Open):
            tree = {name: True for name in fields.keys() - value.model_fields_set}
        for name in fields.keys() - tree.keys():
            if sub := _not_given(getattr(value, name)):
                tree[name] = sub
    elif isinstance(value, list | tuple):
        tree = {i: sub for i, item in enumerate(value) if (sub := _not_given(item))}
    elif isinstance(value, dict):
        tree = {key: sub for key, item in value.items() if (sub := _not_given(item))}
    return tree


def stored_result(result_type: type[BaseModel], result: object) -> dict[str, Any]:
    """What a worker writes as a succeeded job's ``result``: ``result``, which must be an
    instance of its kind's ``result_type``, as JSON, validated again as ``result_type`` (what
    the API answers from it), with only finite numbers (jsonb holds no NaN). Raises TypeError
    for another model, ``ValidationError`` for a result changed into an invalid one after it
    was built, ValueError for a non-finite number."""
    if not isinstance(result, result_type):
        raise TypeError(f"the result is a {type(result).__name__}, not a {result_type.__name__}")
    exclude = _not_given(result) or None
    # jsonb holds no NaN or infinity; pydantic's JSON form would turn some into null
    json.dumps(result.model_dump(exclude=exclude), allow_nan=False, default=str)
    stored: dict[str, Any] = result.model_dump(mode="json", exclude=exclude)
    result_type.model_validate(stored)
    return stored
