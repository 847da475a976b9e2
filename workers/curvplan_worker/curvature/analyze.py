"""``analyze``: the curvature engine end to end (result JSON of the engine contract).

Stages (each reports progress; cancellation is checked at each report and inside every long loop,
one operator product or micro-batch apart, see ``cancel.py``):
load → self-test → loss and gradient → per-block spectra (λ_max, λ_min, trace, GGN and
functional parts) → off-diagonal σ_max → dense (small models) → per-sample statistics →
gradient noise → theoretical bounds. Every stage's numbers come from the same fixed evaluation
batches and the same loss normalisation (mean loss term over the whole sample).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import torch

from curvplan.types.huggingface import HuggingFaceModel
from curvplan.types.options import AnalysisOptions, MachineSettings, OptionsError, parse_options
from curvplan.types.results import (
    BlockBound,
    BlockPair,
    BlockSlice,
    BlockSpectrum,
    CostInputs,
    DataParallelGroup,
    DenseHessian,
    EngineMeasurements,
    FullModelLambda,
    GradientNoiseEstimate,
    LanczosSpectrum,
    LockstepRun,
    MemoryRetry,
    ModelBounds,
    ModelDescription,
    PerSample,
    PerSampleHessianNorms,
    PerturbedLossSet,
    Precision,
    SeedDerivation,
    TopEigenspace,
    TraceEstimate,
)
from curvplan.types.results import (
    MemoryPlan as MemoryPlanRecord,
)
from curvplan.types.spec import ModelSpec
from curvplan_core import blocks as core_blocks
from curvplan_core.blocks import UnknownBlocks
from curvplan_core.cost_model import CostOptions, noise_split
from curvplan_worker.curvature.blocks import custom_blocks, default_blocks, select_blocks
from curvplan_worker.curvature.cancel import Cancelled, cancel_scope
from curvplan_worker.curvature.data import Dataset
from curvplan_worker.curvature.dense import DEFAULT_DENSE_LIMIT, dense_summary
from curvplan_worker.curvature.device import (
    configure_cuda_for_curvature,
    resolve_device,
    resolve_dtype,
)
from curvplan_worker.curvature.distributed import DataParallel
from curvplan_worker.curvature.full_model import FULL_MODEL_KEY, full_model_lambda_max
from curvplan_worker.curvature.ggn import functional_product, ggn_product
from curvplan_worker.curvature.hvp import self_test
from curvplan_worker.curvature.limits import (
    AttemptLimits,
    TooLarge,
    check_fits,
    cost_inputs,
    host_budget,
    largest_basis_bytes,
    time_one_example,
)
from curvplan_worker.curvature.lockstep import Lockstep, Task
from curvplan_worker.curvature.measured import JsonObject, as_result, clean, fully_set
from curvplan_worker.curvature.memory import (
    LockstepPlan,
    MemoryPlan,
    OutOfDeviceMemory,
    agree_lockstep,
    default_budget,
    later_stage_memory,
    peak_memory,
    plan_lockstep,
    reset_peak,
)
from curvplan_worker.curvature.memory_fit import fit_to_memory
from curvplan_worker.curvature.noise_stream import GroupedGradientSums
from curvplan_worker.curvature.objective import Objective
from curvplan_worker.curvature.operator import CurvatureEngine, block_slices
from curvplan_worker.curvature.sources import ModelInput, ModelSource, load_source, parse_model
from curvplan_worker.curvature.spectra import (
    SingularValue,
    Spectrum,
    basis_bytes,
    basis_dtype,
    basis_vectors,
    block_steps,
    lanczos_spectrum,
    pair_steps,
)
from curvplan_worker.curvature.trace import hutchpp_trace


@dataclass(frozen=True)
class ProgressEvent:
    """One structured progress report of :func:`analyze`.

    ``stage`` is one of ``load``, ``self_test``, ``gradient``, ``blocks``, ``off_diagonal``,
    ``full_model``, ``dense``, ``top_eigenspace``, ``per_sample``, ``gradient_noise``,
    ``bounds``, ``done``;
    ``fraction`` ∈ [0, 1]; for ``blocks`` (and ``off_diagonal``) ``index`` (1-based),
    ``total`` and ``block`` say which block is being measured. ``products``: the engine's
    Hessian-vector products so far; the ``cost`` event (after one product was measured, before
    the spectra) carries in ``cost`` what the worker's cost model needs (``limits.cost_inputs``).
    """

    fraction: float
    stage: str
    message: str = ""
    index: int | None = None
    total: int | None = None
    block: str | None = None
    products: int | None = None
    cost: dict[str, Any] | None = None


R = TypeVar("R")

Progress = Callable[[ProgressEvent], None]
ShouldCancel = Callable[[], bool]

SEED_DERIVATION = {
    "scheme": "sha256",
    "formula": "int.from_bytes(sha256(f'{seed}:{key}').digest()[:8], 'big')",
    "keys": {
        "block": "block:<name> (λ_max/λ_min, then trace probes, then GGN and functional parts)",
        "off_diagonal": "pair:<row>|<col>",
        "top_eigenspace": "top_eigenspace",
        "full_model": "full_model (the whole-model λ_max Lanczos)",
    },
}
"""How every stage that draws random vectors gets its generator (``docs/numerics.md#seeds``):
one generator per block, per off-diagonal pair and for the top eigenspace, each seeded from the
job seed and its key, so a block's numbers do not depend on which blocks were measured before
it, in this process or another (block fan-out)."""


def derived_seed(seed: int, key: str) -> int:
    """The seed of one stage's generator: the first 8 bytes of sha256(f"{seed}:{key}"),
    big-endian (:data:`SEED_DERIVATION`)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def derived_generator(seed: int, key: str) -> torch.Generator:
    """A CPU generator seeded with :func:`derived_seed` (the engine draws start vectors on the
    CPU in float64, so the numbers do not depend on the device's generator)."""
    return torch.Generator().manual_seed(derived_seed(seed, key))


def block_key(name: str) -> str:
    return f"block:{name}"


def pair_key(row: str, col: str) -> str:
    return f"pair:{row}|{col}"


@dataclass(frozen=True)
class BlockShare:
    """What one fan-out child measures: only these blocks' spectra and these off-diagonal
    pairs (every other stage is the parent's)."""

    blocks: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class MeasuredBlocks:
    """Block and pair records measured elsewhere (the fan-out children), for the fan-in run:
    :func:`analyze` uses them instead of measuring the blocks and pairs itself."""

    blocks: list[BlockSpectrum] = field(default_factory=list)
    off_diagonal: list[BlockPair] = field(default_factory=list)

    @classmethod
    def from_json(
        cls, blocks: Sequence[JsonObject], off_diagonal: Sequence[JsonObject]
    ) -> MeasuredBlocks:
        """The records of the children's result JSON, validated once."""
        return cls(
            [BlockSpectrum.model_validate(b) for b in blocks],
            [BlockPair.model_validate(p) for p in off_diagonal],
        )


class ShareTask(TypedDict):
    """A fan-out child's blocks and pairs as JSON (:class:`BlockShare`)."""

    blocks: list[str]
    pairs: list[list[str]]


class MeasuredTask(TypedDict):
    """The children's records as JSON (:class:`MeasuredBlocks`)."""

    blocks: list[JsonObject]
    off_diagonal: list[JsonObject]


class FanOutTask(TypedDict, total=False):
    """The fan-out part of a data-parallel rank's task (:func:`fan_out_task`)."""

    only: ShareTask
    measured: MeasuredTask


@dataclass(frozen=True)
class FanOut:
    """The ``only`` and ``measured`` arguments of :func:`analyze` (both None: a full run)."""

    only: BlockShare | None = None
    measured: MeasuredBlocks | None = None


def fan_out_task(only: BlockShare | None, measured: MeasuredBlocks | None) -> FanOutTask:
    """``only`` and ``measured`` as JSON, for the task of the data-parallel ranks (each rank
    must run the same products as rank 0); :func:`fan_out_from_task` reads it back."""
    out = FanOutTask()
    if only is not None:
        out["only"] = {"blocks": list(only.blocks), "pairs": [list(p) for p in only.pairs]}
    if measured is not None:
        out["measured"] = {
            "blocks": [as_result(b) for b in measured.blocks],
            "off_diagonal": [as_result(p) for p in measured.off_diagonal],
        }
    return out


def fan_out_from_task(task: FanOutTask) -> FanOut:
    """The ``only`` and ``measured`` arguments of :func:`analyze` from a rank's task."""
    only, measured = task.get("only"), task.get("measured")
    return FanOut(
        only=None
        if only is None
        else BlockShare(tuple(only["blocks"]), tuple((r, c) for r, c in only["pairs"])),
        measured=None
        if measured is None
        else MeasuredBlocks.from_json(measured["blocks"], measured["off_diagonal"]),
    )


@dataclass(frozen=True)
class BlockPlan:
    """The blocks an analysis measures (name → parameters, in order) and its off-diagonal
    pairs (row, col, parameters of row, of col): what a fan-out splits."""

    blocks: dict[str, int]
    pairs: list[tuple[str, str, int, int]]


_clean = clean
"""JSON-safe values (:func:`measured.clean`), for the callers that clean their own records."""


def _versions() -> dict[str, str | None]:
    try:
        from importlib.metadata import version

        curvplan = version("curvplan")
    except Exception:
        curvplan = None
    try:  # the installed version, without importing transformers (seconds) for a reference run
        from importlib.metadata import version

        hf_version = version("transformers")
    except Exception:
        hf_version = None
    return {
        "torch": torch.__version__,
        "transformers": hf_version,
        "cuda": torch.version.cuda,
        "curvplan": curvplan,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


class _Reporter:
    def __init__(self, progress: Progress | None, should_cancel: ShouldCancel | None) -> None:
        self.progress = progress
        self.should_cancel = should_cancel
        #: The engine's product counter, once there is an engine (events then carry it).
        self.products: Callable[[], int] | None = None

    def __call__(self, fraction: float, stage: str, message: str = "", **where: Any) -> None:
        if self.should_cancel is not None and self.should_cancel():
            raise Cancelled(f"cancelled during {stage}")
        if self.progress is not None:
            if self.products is not None:
                where.setdefault("products", self.products())
            self.progress(ProgressEvent(min(max(fraction, 0.0), 1.0), stage, message, **where))


def analyze(
    spec: ModelInput,
    checkpoint_path: str | Sequence[str] | None,
    data_path: str | None,
    options: AnalysisOptions | Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    should_cancel: ShouldCancel | None = None,
    *,
    model: torch.nn.Module | None = None,
    data: Dataset | None = None,
    machine: MachineSettings | None = None,
    distributed: DataParallel | None = None,
    only: BlockShare | None = None,
    measured: MeasuredBlocks | None = None,
    limits: AttemptLimits | None = None,
) -> dict[str, Any]:
    """Measure the curvature of the model at its checkpoint weights on an evaluation sample.

    ``spec`` is the model source: a reference model spec, or ``{"source": "huggingface",
    "config": {…config.json…}}`` (``docs/engine-model-sources.md``); a typed one (a job's
    ``ModelSpec`` or ``HuggingFaceModel``) and typed ``AnalysisOptions`` are used as they are,
    JSON forms are parsed once here. ``checkpoint_path`` is a
    safetensors checkpoint or a list of shards (or pass a built ``model``), ``data_path`` a
    safetensors sample (or ``data``). ``machine`` is how to run (device, threads, self-test,
    graph caching): the caller's configuration, never the request's. ``distributed`` is this
    process's rank of a data-parallel group (``distributed.py``): the operator stages are
    sharded over the ranks, rank 0 alone runs the rest and gets the result (other ranks get
    ``{}``). Returns the result JSON of
    the engine contract (:func:`measured.as_result` of :func:`measure`). Raises
    ``SpecError``, ``HFModelError``, ``OptionsError``,
    ``CheckpointMismatch``, ``DataError`` with messages naming the field, and
    :class:`Cancelled`.

    Block fan-out (``docs/numerics.md#block-fan-out``): with ``only`` the run measures just
    those blocks and pairs and returns ``{blocks, off_diagonal}`` records (plus the header
    fields); with ``measured`` it measures everything else and takes the block and pair
    records from there. Each block and pair has its own generator (:data:`SEED_DERIVATION`),
    so the assembled result equals a single-process run's float for float.

    ``limits``: the worker's memory and time limits (``limits.py``): the products are planned
    inside the memory limit on a CPU without ``memory_budget``, a run that cannot fit raises
    :class:`TooLarge`, and the ``cost`` progress event hands the worker one measured product.
    """
    result = measure(
        parse_model(spec),
        checkpoint_path,
        data_path,
        parse_options(options),
        progress,
        should_cancel,
        model=model,
        data=data,
        machine=machine,
        distributed=distributed,
        only=only,
        measured=measured,
        limits=limits,
    )
    return {} if result is None else as_result(result)


def measure(
    spec: ModelSpec | HuggingFaceModel,
    checkpoint_path: str | Sequence[str] | None,
    data_path: str | None,
    options: AnalysisOptions,
    progress: Progress | None = None,
    should_cancel: ShouldCancel | None = None,
    *,
    model: torch.nn.Module | None = None,
    data: Dataset | None = None,
    machine: MachineSettings | None = None,
    distributed: DataParallel | None = None,
    only: BlockShare | None = None,
    measured: MeasuredBlocks | None = None,
    limits: AttemptLimits | None = None,
) -> EngineMeasurements | None:
    """:func:`analyze` on typed inputs, returning each stage's typed record collected into
    one :class:`EngineMeasurements` (None on a data-parallel rank other than 0)."""
    machine = machine or MachineSettings()
    threads = torch.get_num_threads()
    if machine.threads:
        torch.set_num_threads(machine.threads)
    try:
        # The loops inside each stage check should_cancel too (cancel.check_cancel), so a
        # run stops within one operator product of the request, not at the next block.
        with cancel_scope(should_cancel):
            run = _Run(
                spec=spec,
                opts=options,
                machine=machine,
                report=_Reporter(progress, should_cancel),
                dist=distributed,
                limits=limits,
            )
            return _measure(run, checkpoint_path, data_path, model, data, only, measured)
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Run:
    """What every stage of one analysis reads: its typed inputs and the progress reporter."""

    spec: ModelSpec | HuggingFaceModel
    opts: AnalysisOptions
    machine: MachineSettings
    report: _Reporter
    dist: DataParallel | None
    limits: AttemptLimits | None
    started: float = field(default_factory=time.perf_counter)


@dataclass
class _Loaded:
    """The built model on its device, the sample, the blocks and pairs of the analysis."""

    device: torch.device
    source: ModelSource
    model: torch.nn.Module
    data: Dataset
    all_blocks: dict[str, list[str]]
    blocks: dict[str, list[str]]
    pairs: list[tuple[str, str]]
    n_params: int
    micro_batch: int | None


@dataclass(frozen=True)
class _Mode:
    """Which stages a run makes, chosen up front (``docs/numerics.md#block-fan-out``):
    a full run measures everything; a fan-out child (``only``) its blocks' and pairs'
    spectra; the fan-in (``measured``) everything else, with the children's records."""

    name: str  # "full" | "child" | "fan_in"
    spectra_blocks: dict[str, list[str]]
    spectra_pairs: list[tuple[str, str]]
    cost_stages: list[str] | None
    measured: MeasuredBlocks | None = None

    @property
    def later_stages(self) -> bool:
        """Whether the stages after the spectra run (all but a fan-out child)."""
        return self.name != "child"


def _mode(loaded: _Loaded, only: BlockShare | None, measured: MeasuredBlocks | None) -> _Mode:
    blocks = loaded.blocks
    if only is not None:
        wanted = {name: blocks[name] for name in _known(only.blocks, blocks, "blocks")}
        _known([x for p in only.pairs for x in p], blocks, "off_diagonal")
        return _Mode("child", wanted, list(only.pairs), ["blocks", "off_diagonal"])
    if measured is not None:
        stages = ["full_model", "dense", "top_eigenspace", "per_sample", "gradient_noise"]
        return _Mode("fan_in", {}, [], stages, measured)
    return _Mode("full", dict(blocks), list(loaded.pairs), None)


def _load(
    run: _Run,
    checkpoint_path: str | Sequence[str] | None,
    data_path: str | None,
    model: torch.nn.Module | None,
    data: Dataset | None,
) -> _Loaded:
    """Build the model at its checkpoint weights on the device, read the sample, select the
    blocks and pairs."""
    run.report(0.0, "load", "building the model")
    device = resolve_device(run.machine.device)
    if run.dist is not None:
        device = run.dist.place(device)
    dtype = resolve_dtype(run.opts.precision)
    if device.type == "cuda":
        configure_cuda_for_curvature()
    source = load_source(
        run.spec, checkpoint_path, data_path, dtype=dtype, seed=0, built=model, data=data
    )
    module = source.module.to(device=device, dtype=dtype)
    assert source.data is not None  # load_source reads or validates the sample
    sample = source.data.to(device, dtype)
    if run.machine.self_test:
        run.report(0.02, "self_test", "HVP against finite differences on a tiny model")
        self_test(device)
    all_blocks = _all_blocks(source, module, run.opts)
    blocks = select_blocks(all_blocks, run.opts.blocks)
    return _Loaded(
        device=device,
        source=source,
        model=module,
        data=sample,
        all_blocks=all_blocks,
        blocks=blocks,
        pairs=selected_pairs(list(blocks), run.opts),
        n_params=sum(p.numel() for _, p in module.named_parameters()),
        micro_batch=source.micro_batch(run.opts.eval_batch_size),
    )


def _all_blocks(
    source: ModelSource, module: torch.nn.Module, opts: AnalysisOptions
) -> dict[str, list[str]]:
    if opts.block_definitions:
        return custom_blocks(module, opts.block_definitions)
    return source.default_blocks or default_blocks(module)


@dataclass
class _MemoryStage:
    """The memory plan's record, the caching and micro-batch it chose, the basis bytes."""

    record: MemoryPlanRecord
    plan: MemoryPlan
    basis: float


def _memory_stage(
    run: _Run, loaded: _Loaded, engine: CurvatureEngine, sizes: dict[str, int], cache_graph: bool
) -> _MemoryStage:
    """docs/numerics.md#memory-plan: micro-batch and caching chosen to fit the budget (per
    rank on its own shard when data parallel); on a host with a worker memory limit and no
    memory_budget, inside that limit (docs/operations.md#memory-limit)."""
    opts, machine, limits = run.opts, run.machine, run.limits
    basis = largest_basis_bytes(sizes, opts, loaded.n_params, machine.basis_budget)
    budget = default_budget(loaded.device, machine.memory_budget)
    bounded_by_limit = budget[0] is None and loaded.device.type == "cpu" and limits is not None
    if bounded_by_limit:
        assert limits is not None
        budget = host_budget(limits, basis)
    try:
        plan = fit_to_memory(
            engine, max(budget[0], 1) if budget[0] is not None else None, budget[1], cache_graph
        )
    except OutOfDeviceMemory as exc:
        if not bounded_by_limit or exc.per_example_bytes is None:
            raise
        assert limits is not None
        check_fits(limits, exc.per_example_bytes, basis)
        raise TooLarge(
            exc.per_example_bytes + basis,
            limits,
            {"one-example product": exc.per_example_bytes, "Lanczos basis": float(basis)},
        ) from None
    if limits is not None and limits.micro_batch_factor < 1 and engine.micro_batch > 1:
        # the retry after an out-of-memory kill: half the micro-batch of the killed run
        engine.rebatch(max(1, int(engine.micro_batch * limits.micro_batch_factor)))
        plan.micro_batch = engine.micro_batch
        plan.retries.append(
            {"during": "previous attempt killed out of memory", "micro_batch": engine.micro_batch}
        )
    record = plan.as_dict()
    # the noise stage's gradient examples, as the cost model and the engine split them
    n_data = len(loaded.data)
    n_grad = noise_split(n_data, CostOptions.from_options(opts))[0]
    micro_batch = loaded.micro_batch
    record["stages"] = later_stage_memory(
        plan,
        loaded.n_params,
        # a vmapped batch holds at most the examples there are (8 rows, not 64, of an
        # 8-example sample: 5 GB, not 42, on an 82 M-parameter model)
        sample_batch=min(micro_batch or 64, n_data),
        noise_batch=min(micro_batch or 32, n_grad),
        noise_groups=GroupedGradientSums.rows_for(n_grad, opts.noise_max_groups),
        basis_budget=machine.basis_budget,
    )
    return _MemoryStage(MemoryPlanRecord.model_validate(clean(record)), plan, basis)


def _cost_stage(
    run: _Run,
    loaded: _Loaded,
    engine: CurvatureEngine,
    mode: _Mode,
    sizes: dict[str, int],
    basis: float,
) -> tuple[CostInputs, LockstepPlan | None]:
    """docs/operations.md#cost-model-and-eta: one measured product, before the spectra; the
    spectra's lockstep plan, made once (the cost model times its products as run)."""
    opts, blocks = run.opts, loaded.blocks
    memory = check_fits(run.limits, engine.per_example_bytes or 0.0, basis) or {}
    probe = blocks[next(iter(sizes))] if sizes else None
    spectra_blocks, spectra_pairs = mode.spectra_blocks, mode.spectra_pairs
    lockstep_plan = (
        _lockstep_plan(engine, blocks, spectra_blocks, spectra_pairs, opts, run.machine)
        if spectra_blocks or spectra_pairs
        else None
    )
    inputs = cost_inputs(
        engine,
        sizes,
        [
            (r, c, engine.layout(blocks[r]).numel, engine.layout(blocks[c]).numel)
            for r, c in spectra_pairs
        ],
        probe,
        opts,
        n_params=loaded.n_params,
        tokens=float(engine.total_count),
        stages=mode.cost_stages,
        memory=memory,
        spectra=(
            _spectra_timing(
                blocks, spectra_blocks, spectra_pairs, lockstep_plan, run.machine.basis_budget
            )
            if lockstep_plan is not None
            else None
        ),
        example=(
            time_one_example(
                loaded.model, loaded.source.objective, loaded.data.inputs, loaded.data.targets
            )
            if opts.per_sample and opts.hessian_subsample > 0 and mode.name != "child"
            else None
        ),
    )
    run.report(0.05, "cost", "one product measured: estimating the stages", cost=inputs)
    return CostInputs.model_validate(clean(inputs)), lockstep_plan


def _cost_sizes(engine: CurvatureEngine, mode: _Mode) -> dict[str, int]:
    """The blocks the cost model and the basis bound count: those this run measures."""
    return {name: engine.layout(members).numel for name, members in mode.spectra_blocks.items()}


def _assembled(
    run: _Run, loaded: _Loaded, measured: MeasuredBlocks
) -> tuple[list[BlockSpectrum], list[BlockPair]]:
    """The fan-in: the children's block and pair records in this run's order, each in one
    step of progress, as a single-process run's stages would have reported them."""
    blocks, pairs = loaded.blocks, loaded.pairs
    run.report(
        0.6,
        "blocks",
        f"{len(blocks)} blocks measured by the fan-out's child jobs",
        index=len(blocks),
        total=len(blocks),
    )
    block_records = _in_order(
        measured.blocks,
        list(blocks),
        "blocks",
        lambda r: r.name,
    )
    if pairs:
        run.report(0.7, "off_diagonal", f"{len(pairs)} pairs measured by the child jobs")
    pair_records = _in_order(
        measured.off_diagonal,
        [f"{r}|{c}" for r, c in pairs],
        "off_diagonal",
        lambda r: r.key,
    )
    return block_records, pair_records


def _full_model_stage(run: _Run, engine: CurvatureEngine) -> FullModelLambda:
    run.report(0.71, "full_model", "λ_max of the whole-model Hessian (one Lanczos)")
    opts = run.opts
    return FullModelLambda.model_validate(
        clean(
            full_model_lambda_max(
                engine,
                generator=derived_generator(opts.seed, FULL_MODEL_KEY),
                tol=opts.tolerance,
                max_iter=opts.max_iter,
                floor=opts.residual_floor,
            )
        )
    )


def _dense_stage(run: _Run, loaded: _Loaded, engine: CurvatureEngine) -> DenseHessian | None:
    """The exact dense Hessian of a small model (``dense.py``), when the options ask."""
    opts, n_params = run.opts, loaded.n_params
    if not (opts.dense == "on" or (opts.dense == "auto" and n_params <= opts.dense_limit)):
        return None
    if n_params > max(opts.dense_limit, DEFAULT_DENSE_LIMIT) and opts.dense == "on":
        raise OptionsError([("dense", f"{n_params} parameters is too many for dense")])
    run.report(0.72, "dense", f"exact dense Hessian ({n_params} columns)")
    return DenseHessian.model_validate(clean(dense_summary(engine, loaded.blocks)))


def _finish(engine: CurvatureEngine, memory: MemoryPlanRecord) -> None:
    """After the operator stages: the graph released, the retries and final micro-batch."""
    engine.release_graph()
    memory.retries = [MemoryRetry.model_validate(clean(r)) for r in engine.oom_retries]
    memory.final_micro_batch = engine.micro_batch


def _measure(
    run: _Run,
    checkpoint_path: str | Sequence[str] | None,
    data_path: str | None,
    model: torch.nn.Module | None,
    data: Dataset | None,
    only: BlockShare | None,
    measured: MeasuredBlocks | None,
) -> EngineMeasurements | None:
    """The stages of the run's mode, in order, each adding its record."""
    loaded = _load(run, checkpoint_path, data_path, model, data)
    mode = _mode(loaded, only, measured)
    opts, machine, dist = run.opts, run.machine, run.dist
    out = _header(run, loaded)
    batches = loaded.data.batches(loaded.micro_batch)
    cache_graph = machine.cache_graph
    if loaded.micro_batch and not opts.eval_batch_size and len(batches) > 1:
        # micro-batched automatically for a large vocabulary: keeping every micro-batch's
        # first-backward graph would undo the micro-batching, so each product rebuilds it
        # (an explicit eval_batch_size keeps the machine's caching)
        cache_graph = False
    shard, reducer = batches, None
    if dist is not None:  # docs/numerics.md#data-parallel
        shard, reducer = dist.start(batches), dist.reduce
        out.data_parallel = DataParallelGroup(world_size=dist.world_size, backend=dist.backend)
    reset_peak(loaded.device)
    top_vectors = None
    with CurvatureEngine(
        loaded.model, loaded.source.objective, shard, cache_graph=cache_graph, reducer=reducer
    ) as engine:
        run.report.products = lambda: engine.n_hvp
        sizes = _cost_sizes(engine, mode)
        memory = _memory_stage(run, loaded, engine, sizes, cache_graph)
        out.cache_graph = memory.plan.cache_graph
        out.eval_batch_size = (
            memory.plan.micro_batch
            if memory.plan.micro_batch != memory.plan.configured_micro_batch
            else loaded.micro_batch
        )
        out.memory_plan = memory.record
        _gradient_stage(run, engine, out)
        out.cost_inputs, lockstep_plan = _cost_stage(run, loaded, engine, mode, sizes, memory.basis)
        if mode.measured is not None:
            out.blocks, out.off_diagonal = _assembled(run, loaded, mode.measured)
        else:
            out.blocks, out.off_diagonal, memory.record.lockstep = _spectra(
                engine,
                loaded.blocks,
                mode.spectra_blocks,
                mode.spectra_pairs,
                opts,
                run.report,
                machine,
                lockstep_plan,
            )
        if mode.later_stages:
            out.full_model = _full_model_stage(run, engine)
            dense = _dense_stage(run, loaded, engine)
            if dense is not None:
                out.dense = dense
            if opts.per_sample and opts.top_d > 0:
                run.report(0.75, "top_eigenspace", f"top-{opts.top_d} eigenvectors of H")
                top_vectors, out.top_eigenspace = _top_eigenspace(engine, opts)
        _finish(engine, memory.record)
    if mode.later_stages:
        if dist is not None and not dist.is_root:
            return None  # the rest runs on rank 0 alone
        _later_stages(run, loaded, engine, top_vectors, out)
    out.peak_memory_bytes, out.peak_memory_source = peak_memory(loaded.device)
    out.elapsed_s = time.perf_counter() - run.started
    if mode.later_stages:
        run.report(1.0, "done", "analysis complete")
    return out


def _later_stages(
    run: _Run,
    loaded: _Loaded,
    engine: CurvatureEngine,
    top_vectors: torch.Tensor | None,
    out: EngineMeasurements,
) -> None:
    """The stages on rank 0 alone: per-sample statistics, gradient noise, bounds."""
    opts = run.opts
    model, objective, data = loaded.model, loaded.source.objective, loaded.data
    if opts.per_sample:
        run.report(0.8, "per_sample", "per-sample losses, perturbed losses, Hessian norms")
        out.per_sample = _per_sample(
            model, objective, data, opts, top_vectors, engine, loaded.micro_batch
        )
    if opts.gradient_noise:
        run.report(0.88, "gradient_noise", "|G|², tr Σ, GᵀHG, tr(HΣ)")
        out.gradient_noise = _gradient_noise(model, objective, data, opts, loaded.micro_batch)
    if opts.bounds:
        run.report(0.94, "bounds", "theoretical block bounds")
        out.bounds = _bounds(model, loaded.source, data, opts, out.blocks)


def _gradient_stage(run: _Run, engine: CurvatureEngine, out: EngineMeasurements) -> None:
    """Loss and gradient at w*: the loss, its terms, ‖∇L(w*)‖, the evaluation batches."""
    run.report(0.05, "gradient", "loss and gradient at w*")
    grad = engine.gradient()
    out.loss = clean(engine.loss_value)
    out.n_loss_terms = clean(engine.total_count)
    out.gradient_norm = clean(float(torch.linalg.vector_norm(grad.double())))
    out.n_eval_batches = len(engine.batches)


def _header(run: _Run, loaded: _Loaded) -> EngineMeasurements:
    """The result's header: versions, device, options, the model, the sample's size (the
    measurements the later stages add their records to)."""
    source = loaded.source
    header = EngineMeasurements(
        versions=_versions(),
        device=str(loaded.device),
        dtype=run.opts.precision,
        seed=run.opts.seed,
        seed_derivation=SeedDerivation.model_validate(SEED_DERIVATION),
        # the typed inputs as they are (every field written to the result, set or default)
        options=fully_set(run.opts),
        machine=fully_set(run.machine),
        model=ModelDescription.model_validate(clean(source.description)),
        precision_limited=Precision.model_validate(clean(source.precision)),
        n_parameters=loaded.n_params,
        n_examples=len(loaded.data),
    )
    if source.spec is not None:
        header.spec = fully_set(source.spec)
    return header


def _known(names: Sequence[str], blocks: dict[str, list[str]], field_name: str) -> list[str]:
    unknown = sorted(set(names) - set(blocks))
    if unknown:
        raise OptionsError([(field_name, f"unknown or unselected blocks {unknown}")])
    return list(dict.fromkeys(names))


def _in_order(records: list[R], keys: list[str], what: str, key: Callable[[R], str]) -> list[R]:
    """Records measured elsewhere, in this run's order; every key exactly once."""
    by_key = {key(r): r for r in records}
    missing = [k for k in keys if k not in by_key]
    extra = sorted(set(by_key) - set(keys))
    if missing or extra or len(by_key) != len(records):
        raise ValueError(
            f"{what}: the measured records do not match the analysis (missing {missing}, "
            f"unexpected {extra}, {len(records) - len(by_key)} duplicated)"
        )
    return [by_key[k] for k in keys]


def selected_pairs(names: list[str], opts: AnalysisOptions) -> list[tuple[str, str]]:
    """The off-diagonal pairs ``opts.off_diagonal`` asks for, among the selected blocks."""
    try:
        return core_blocks.selected_pairs(names, opts.off_diagonal)
    except UnknownBlocks as exc:
        raise OptionsError([("off_diagonal", str(exc))]) from None


def plan_blocks(
    spec: ModelInput,
    checkpoint_path: str | Sequence[str] | None,
    data_path: str | None,
    options: AnalysisOptions | Mapping[str, Any] | None = None,
    *,
    model: torch.nn.Module | None = None,
    data: Dataset | None = None,
) -> BlockPlan:
    """The blocks and pairs :func:`analyze` would measure with these inputs and options, with
    their sizes (what a block fan-out splits into groups). Loads the model like ``analyze``
    and raises the same errors; measures nothing."""
    typed = parse_model(spec)
    opts = parse_options(options)
    dtype = resolve_dtype(opts.precision)
    source = load_source(
        typed, checkpoint_path, data_path, dtype=dtype, seed=0, built=model, data=data
    )
    module = source.module
    if opts.block_definitions:
        all_blocks = custom_blocks(module, opts.block_definitions)
    else:
        all_blocks = source.default_blocks or default_blocks(module)
    blocks = select_blocks(all_blocks, opts.blocks)
    layout = CurvatureEngine(module, source.objective)
    sizes = {name: layout.layout(members).numel for name, members in blocks.items()}
    pairs = [(r, c, sizes[r], sizes[c]) for r, c in selected_pairs(list(blocks), opts)]
    return BlockPlan(blocks=sizes, pairs=pairs)


def _task_bytes(
    engine: CurvatureEngine,
    all_blocks: Mapping[str, Sequence[str]],
    blocks: Mapping[str, Sequence[str]],
    pairs: Sequence[tuple[str, str]],
    opts: AnalysisOptions,
    machine: MachineSettings,
) -> list[int]:
    """The bounded basis bytes of every lockstep task: the blocks, then the pairs."""
    itemsize = torch.empty((), dtype=basis_dtype(engine.dtype)).element_size()
    wanted = max(1, opts.top_k) + 1  # the top-k (at least λ_max) and λ_min
    out = []
    for name in blocks:
        n = engine.layout(all_blocks[name]).numel
        out.append(
            basis_bytes(n, basis_vectors(n, machine.basis_budget, itemsize, wanted), itemsize)
        )
    for _, col in pairs:
        n = engine.layout(all_blocks[col]).numel
        out.append(basis_bytes(n, basis_vectors(n, machine.basis_budget, itemsize, 1), itemsize))
    return out


def _lockstep_plan(
    engine: CurvatureEngine,
    all_blocks: Mapping[str, Sequence[str]],
    blocks: Mapping[str, Sequence[str]],
    pairs: Sequence[tuple[str, str]],
    opts: AnalysisOptions,
    machine: MachineSettings,
) -> LockstepPlan:
    """The lockstep's concurrency, vectors per product and batching (``memory.plan_lockstep``;
    agreed over the ranks of a data-parallel group: a collective every rank calls)."""
    itemsize = torch.empty((), dtype=basis_dtype(engine.dtype)).element_size()
    task_bytes = _task_bytes(engine, all_blocks, blocks, pairs, opts, machine)
    used = [*blocks, *(x for pair in pairs for x in pair)]
    bases = engine.layout([m for name in dict.fromkeys(used) for m in all_blocks[name]]).bases
    n_union = sum(engine.params[b].numel() for b in bases)
    plan = plan_lockstep(
        engine.memory_plan,
        task_bytes,
        n_union,
        itemsize,
        engine.memory_budget,
        device_type=engine.device.type,
    )
    if engine.reducer is not None:  # every rank makes the same batched products
        plan = agree_lockstep(plan, task_bytes, engine.reducer, engine.device)
    return plan


def _spectra_timing(
    all_blocks: Mapping[str, Sequence[str]],
    blocks: Mapping[str, Sequence[str]],
    pairs: Sequence[tuple[str, str]],
    plan: LockstepPlan,
    basis_budget: int | None,
) -> dict[str, Any]:
    """``limits.time_spectra``'s arguments: the lockstep's items in its order, and its plan."""
    items = [(name, list(all_blocks[name]), list(all_blocks[name])) for name in blocks]
    items += [(f"{r}|{c}", list(all_blocks[r]), list(all_blocks[c])) for r, c in pairs]
    return {
        "items": items,
        "batched": plan.batched,
        "vectors_per_product": plan.vectors_per_product,
        "concurrent": None if plan.concurrent >= plan.n_tasks else plan.concurrent,
        "basis_budget": basis_budget,
    }


def _spectra(
    engine: CurvatureEngine,
    all_blocks: Mapping[str, Sequence[str]],
    blocks: Mapping[str, Sequence[str]],
    pairs: Sequence[tuple[str, str]],
    opts: AnalysisOptions,
    report: _Reporter,
    machine: MachineSettings,
    plan: LockstepPlan | None = None,
) -> tuple[list[BlockSpectrum], list[BlockPair], LockstepRun]:
    """Block spectra and off-diagonal σ_max, all advancing in lockstep (``lockstep.py``:
    one batched second backward per round, chunked to the memory plan), then each block's
    trace and GGN parts from its own generator. Returns (block records, pair records, the
    lockstep record: the plan and what the run did). ``plan``: the lockstep plan when the
    cost model already made it (:func:`_lockstep_plan`)."""
    generators = {name: derived_generator(opts.seed, block_key(name)) for name in blocks}
    sizes = {name: engine.layout(members).numel for name, members in all_blocks.items()}
    tasks: list[Task] = []
    task_bytes = _task_bytes(engine, all_blocks, blocks, pairs, opts, machine)
    for (name, members), bytes_ in zip(blocks.items(), task_bytes, strict=False):
        steps = block_steps(
            engine,
            members,
            generator=generators[name],
            tol=opts.tolerance,
            max_iter=opts.max_iter,
            top_k=opts.top_k,
            floor=opts.residual_floor,
            basis_budget=machine.basis_budget,
        )
        tasks.append(Task(block_key(name), steps, bytes_))
    for (row, col), bytes_ in zip(pairs, task_bytes[len(blocks) :], strict=True):
        steps = pair_steps(
            engine,
            all_blocks[row],
            all_blocks[col],
            generator=derived_generator(opts.seed, pair_key(row, col)),
            tol=opts.tolerance,
            max_iter=opts.max_iter,
            basis_budget=machine.basis_budget,
        )
        tasks.append(Task(pair_key(row, col), steps, bytes_))
    if plan is None:
        plan = _lockstep_plan(engine, all_blocks, blocks, pairs, opts, machine)
    n_blocks, n_tasks = len(blocks), len(tasks)
    if tasks:
        report(
            0.05,
            "blocks",
            f"{n_blocks} blocks and {len(pairs)} pairs in lockstep "
            f"({plan.vectors_per_product if plan.batched else 'one'} vector"
            f"{'s' if plan.batched else ''} per second backward)",
            index=0,
            total=n_tasks,
        )

    def done(key: str, value: object, finished: int, total: int) -> None:
        kind, _, name = key.partition(":")
        what = f"block {name}" if kind == "block" else f"pair H[{name.replace('|', ', ')}]"
        report(
            0.05 + 0.5 * finished / max(total, 1),
            "blocks",
            f"{what} certified ({finished}/{total})",
            index=finished,
            total=total,
            block=name,
        )

    runner = Lockstep(
        engine,
        vectors_per_product=plan.vectors_per_product,
        basis_room=plan.basis_room_bytes,
        batched=plan.batched,
    )
    runner.stats.mode_reason = plan.batched_reason
    results = runner.run(tasks, done)
    records: list[BlockSpectrum] = []
    for i, (name, members) in enumerate(blocks.items()):
        spectrum = results[block_key(name)]
        assert isinstance(spectrum, Spectrum)
        n = sizes[name]
        record = BlockSpectrum.model_validate(
            clean({"name": name, "params": list(members), "n_params": n, **spectrum.as_dict()})
        )
        slices = block_slices(members)
        if slices:
            record.slices = [BlockSlice.model_validate(clean(d)) for d in slices]
        gen = generators[name]
        if opts.trace_probes > 0 or opts.ggn:
            report(
                0.55 + 0.05 * i / max(n_blocks, 1),
                "blocks",
                f"trace of block {name} ({i + 1}/{n_blocks})",
                index=i + 1,
                total=n_blocks,
                block=name,
            )
        if opts.trace_probes > 0:
            trace = hutchpp_trace(
                lambda v, m=members: engine.block_hvp(m, v),
                n,
                n_products=opts.trace_probes,
                generator=gen,
            )
            record.trace = TraceEstimate.model_validate(clean(trace.as_dict()))
        if opts.ggn:
            parts = []
            for op in (ggn_product, functional_product):
                part = lanczos_spectrum(
                    lambda v, m=members, op=op: op(engine, m, v),
                    n,
                    generator=gen,
                    tol=opts.tolerance,
                    max_iter=opts.max_iter,
                    floor=opts.residual_floor,
                    basis_budget=machine.basis_budget,
                    device=engine.device,
                    dtype=basis_dtype(engine.dtype),
                )
                parts.append(LanczosSpectrum.model_validate(clean(part.as_dict())))
            record.ggn, record.functional = parts
        records.append(record)
    if pairs:
        report(0.6, "off_diagonal", f"{len(pairs)} pairs measured in lockstep with the blocks")
    pair_records: list[BlockPair] = []
    for row, col in pairs:
        sv = results[pair_key(row, col)]
        assert isinstance(sv, SingularValue)
        pair_records.append(
            BlockPair.model_validate(clean({"row": row, "col": col, **sv.as_dict()}))
        )
    info = LockstepRun.model_validate(clean({"plan": plan.as_dict(), **runner.stats.as_dict()}))
    return records, pair_records, info


def _top_eigenspace(
    engine: CurvatureEngine, opts: AnalysisOptions
) -> tuple[torch.Tensor, TopEigenspace]:
    names = engine.names
    n = engine.layout(names).numel
    spec = lanczos_spectrum(
        lambda v: engine.hvp(names, names, v),
        n,
        generator=derived_generator(opts.seed, "top_eigenspace"),
        tol=max(opts.tolerance, 1e-4),
        max_iter=opts.max_iter,
        top_k=opts.top_d,
        ends=("max",),
        floor=opts.residual_floor,
        want_vectors=True,
    )
    vectors = torch.stack([e.vector for e in spec.top])
    info = TopEigenspace.model_validate(
        clean(
            {
                "values": [e.value for e in spec.top],
                "residuals": [e.residual for e in spec.top],
                "converged": spec.converged,
                "n_products": spec.n_products,
            }
        )
    )
    return vectors, info


def _per_sample(
    model: torch.nn.Module,
    objective: Objective,
    data: Dataset,
    opts: AnalysisOptions,
    top_vectors: torch.Tensor | None,
    engine: CurvatureEngine,
    micro_batch: int | None,
) -> PerSample | None:
    try:
        from curvplan_worker.curvature import per_sample as ps
    except ImportError:
        return None
    x, y = data.inputs, data.targets
    bs = micro_batch or 64
    out = PerSample(losses=clean(ps.per_example_losses(model, objective, x, y, batch_size=bs)))
    if data.groups is not None:  # one group id per loss: the planner's cluster-robust variance
        out.groups = [int(g) for g in data.groups.tolist()]
    perturbed = []
    if opts.n_directions > 0:
        perturbed.append(
            ps.perturbed_losses_record(
                model,
                objective,
                x,
                y,
                opts.perturbation_radius,
                opts.n_directions,
                kind="random",
                batch_size=bs,
                seed=opts.seed,
            )
        )
    if top_vectors is not None:
        perturbed.append(
            ps.perturbed_losses_record(
                model,
                objective,
                x,
                y,
                opts.perturbation_radius,
                top_vectors,
                kind="top_eigenspace",
                param_names=engine.names,
                batch_size=bs,
                seed=opts.seed,
            )
        )
    out.perturbed = [PerturbedLossSet.model_validate(clean(r)) for r in perturbed]
    if opts.hessian_subsample > 0:
        norms = ps.per_sample_hessian_norms(
            model,
            objective,
            x,
            y,
            n_subsample=min(opts.hessian_subsample, len(data)),
            seed=opts.seed,
            tol=max(opts.tolerance, 1e-6),
            max_iter=opts.per_sample_max_iter,
        )
        out.hessian_norms = PerSampleHessianNorms.model_validate(clean(norms))
    return out


def _gradient_noise(
    model: torch.nn.Module,
    objective: Objective,
    data: Dataset,
    opts: AnalysisOptions,
    micro_batch: int | None,
) -> GradientNoiseEstimate | None:
    try:
        from curvplan_worker.curvature import gradient_noise as gn
    except ImportError:
        return None
    if len(data) < 3:
        return GradientNoiseEstimate(
            available=False, reason="needs at least 3 examples (2 gradient, 1 Hessian)"
        )
    stats = gn.gradient_noise_from_sample(
        model,
        objective,
        data.inputs,
        data.targets,
        n_grad=opts.noise_grad_examples,
        n_hessian=opts.noise_hessian_examples,
        seed=opts.seed,
        batch_size=micro_batch or 32,
        max_groups=opts.noise_max_groups,
    )
    return GradientNoiseEstimate.model_validate(clean(stats))


def _bounds(
    model: torch.nn.Module,
    source: ModelSource,
    data: Dataset,
    opts: AnalysisOptions,
    block_records: list[BlockSpectrum],
) -> ModelBounds | None:
    """The paper's block bounds where the model is in the theory's family; elsewhere every
    block says not applicable, with the reason."""
    if source.bounds_reason is not None:
        for record in block_records:
            record.bound = BlockBound(applicable=False, reason=source.bounds_reason)
        return ModelBounds(applicable=False, reasons=[source.bounds_reason], blocks={})
    try:
        from curvplan_worker.curvature.bounds import block_bounds_for_model, tightness
    except ImportError:
        return None
    bounds = block_bounds_for_model(
        model, source.spec, data.inputs, data.targets, opts.bound_options.model_dump()
    )
    measured = {r.name: r.spectral_norm for r in block_records}
    ratios = tightness(bounds, measured)
    for record in block_records:
        rec = bounds.get("blocks", {}).get(record.name)
        if rec is None:
            record.bound = BlockBound(
                applicable=False, reason="the paper's theorems give no bound for this block"
            )
        else:
            record.bound = BlockBound.model_validate(
                clean({**rec, "ratio": ratios.get(record.name)})
            )
    return ModelBounds.model_validate(clean(bounds))
