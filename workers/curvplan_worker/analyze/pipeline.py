"""The analyze job, stage by stage (docs/formulas.md): artifacts → engine → outputs → planner.

Block fan-out (docs/numerics.md#block-fan-out): the API decides it at submission, by cost
(``curvplan_core.analysis_plan``), and creates the ``analyze_blocks`` children with the parent
waiting (``waiting for children``, children done / total), so the parent never loads anything
before its one attempt, the fan-in, which runs the stages below with the children's records
(``block spectra n/n`` then comes in one step).

Progress stages, in order: ``loading``, ``block spectra i/n``, ``off-diagonal``, ``dense
hessian``, ``per-sample losses`` (the engine measures per-sample losses, perturbed losses and
per-sample Hessian norms in one stage), ``gradient noise``, ``bounds``, ``gradient noise
(intermediate i/n)``, ``storing outputs``, ``planning``. The engine reports structured events
(``ProgressEvent``: stage, fraction, block index and count). Cancellation is checked at every
progress report and, inside the engine, before every operator product and micro-batch, so a
cancelled job stops within about one product instead of at the end of a block.

The model is a reference spec or a Hugging Face source (``{"source": "huggingface", "config":
…}``); a checkpoint is one artifact id or the ids of its shards
(``docs/engine-model-sources.md``). The request arrives as the validated ``AnalyzeJobCreate``
(parsed once, from the stored JSON, by the attempt child): its model spec and options go to
the engine as those typed objects and are never parsed again in this process.

A job with ``resources.devices`` > 1 runs the engine's operator stages on that many
data-parallel ranks, this attempt process being rank 0 (``ranks.py``,
docs/operations.md#several-devices-per-job); everything else here runs on rank 0 alone.
"""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from curvplan.types.huggingface import HuggingFaceModel
from curvplan.types.jobs import AnalyzeBlocksJobCreate, AnalyzeJobCreate
from curvplan.types.options import AnalysisOptions, MachineSettings
from curvplan.types.results import (
    AnalyzeBlocksResult,
    AnalyzeResult,
    BlockPair,
    BlockSpectrum,
    EngineMeasurements,
    FanOut,
    FanOutChild,
    GradientNoiseEstimate,
    PlannerArray,
    PlannerInputs,
)
from curvplan.types.spec import CausalLMTask, ModelSpec
from curvplan_core.config import Settings, get_settings
from curvplan_core.planner import Measurements, Targets, make_plan
from curvplan_core.planner.budget_section import CommandFlags
from curvplan_worker.analyze.artifacts import ArtifactAccess, attempt_access
from curvplan_worker.analyze.eta import EtaTracker
from curvplan_worker.analyze.measurements import planner_fields, split_bulky
from curvplan_worker.analyze.sweep_inputs import read_sweeps
from curvplan_worker.errors import JobCancelled, JobError
from curvplan_worker.job_context import ChildOutcome, JobContext

if TYPE_CHECKING:
    from curvplan_worker.analyze.ranks import RankTask
    from curvplan_worker.curvature.analyze import BlockShare, MeasuredBlocks, ProgressEvent

log = logging.getLogger("curvplan.worker.analyze")

ENGINE_SHARE = (0.03, 0.85)
"""The slice of the job's progress bar that the engine's own fractions map onto."""

_STAGE_NAMES = {
    "load": "loading",
    "self_test": "loading",
    "gradient": "loading",
    "cost": "loading",
    "off_diagonal": "off-diagonal",
    "full_model": "full-model lambda_max",
    "dense": "dense hessian",
    "top_eigenspace": "top eigenspace",
    "per_sample": "per-sample losses",
    "gradient_noise": "gradient noise",
    "bounds": "bounds",
    "done": "bounds",
}


def job_stage(event: ProgressEvent) -> str:
    """The job's stage name for an engine progress event (``blocks`` → ``block spectra i/n``)."""
    if event.stage == "blocks":
        if event.index is not None and event.total is not None:
            return f"block spectra {event.index}/{event.total}"
        return "block spectra"
    return _STAGE_NAMES.get(event.stage, event.stage)


def _should_cancel(ctx: JobContext) -> Callable[[], bool]:
    def check() -> bool:
        try:
            ctx.check_cancelled()
        except JobCancelled:
            return True
        return False

    return check


def _engine_progress(
    ctx: JobContext, eta: EtaTracker | None = None
) -> Callable[[ProgressEvent], None]:
    low, high = ENGINE_SHARE

    def report(event: ProgressEvent) -> None:
        fraction = low + (high - low) * event.fraction
        seconds = eta.update(event) if eta is not None else None
        ctx.report_progress(fraction, job_stage(event), event.message, eta_seconds=seconds)

    return report


def _ids(value: uuid.UUID | list[uuid.UUID]) -> list[str]:
    """A checkpoint reference: one artifact id or the list of its shards' ids."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def resolve_checkpoint(
    access: ArtifactAccess,
    project_id: uuid.UUID,
    value: uuid.UUID | list[uuid.UUID],
    field: str,
) -> list[Any]:
    """A checkpoint reference (one id or its shards' ids) resolved to readable files; errors
    name ``field`` (``field.i`` for shard i)."""
    ids = _ids(value)
    if len(ids) == 1:
        return [access.resolve(project_id, ids[0], "checkpoint", field)]
    return [access.resolve(project_id, a, "checkpoint", f"{field}.{i}") for i, a in enumerate(ids)]


def run(body: AnalyzeJobCreate, ctx: JobContext) -> AnalyzeResult:
    """Run one attempt of an analyze job: its measurements (bulky arrays stored as output
    artifacts), the planner's inputs and the recommendation.

    A job the API fanned out at submission runs once, as its fan-in (``ctx.children`` set):
    every stage but the block spectra and pairs, with the children's records
    (docs/numerics.md#block-fan-out).
    """
    options = body.options
    ctx.report_progress(0.0, "loading", "resolving artifacts")
    settings = get_settings()
    machine = worker_machine(settings)
    with attempt_access(ctx) as (access, project_id):
        engine = access.engine
        checkpoint = resolve_checkpoint(access, project_id, body.checkpoint, "checkpoint")
        dataset = access.resolve(project_id, str(body.dataset), "dataset", "dataset")
        intermediates = [
            resolve_checkpoint(access, project_id, a, f"intermediate_checkpoints.{i}")
            for i, a in enumerate(body.intermediate_checkpoints)
        ]
        checkpoint_paths = [str(c.path) for c in checkpoint]
        measured, fan_out_record = None, None
        if ctx.children is not None:  # the fan-in: the API created the children at submission
            children = ctx.children_as(AnalyzeBlocksJobCreate, AnalyzeBlocksResult, body.model)
            measured, fan_out_record = _fanned_in(children)
        result = measure_engine(
            body.model,
            checkpoint_paths,
            str(dataset.path),
            options,
            machine,
            ctx,
            devices=body.resources.devices,
            lease_seconds=settings.lease_seconds,
            measured=measured,
        )
        if fan_out_record is not None:
            result.fan_out = fan_out_record
        noise = _intermediate_noise(
            body.model,
            intermediates,
            str(dataset.path),
            options,
            machine,
            ctx,
            declared=_declared_logs(body),
        )
        measured_fields, notes = planner_fields(result, noise)
        swept = read_sweeps(engine, project_id, body.sweeps)
        fields: dict[str, Any] = {**measured_fields, **swept.fields}
        notes.extend(swept.notes)
        n_params = result.cost_inputs.n_params if result.cost_inputs is not None else None
        if n_params:  # prices a data sweep's training time in budget.data.next_step
            fields["model_parameters"] = int(n_params)
        fields.setdefault("tokens_per_example", _tokens_per_example(body.model))
        if fields["tokens_per_example"] is None:
            fields.pop("tokens_per_example")
        measurements = _measurements(fields)  # before any output is stored
        ctx.report_progress(0.93, "storing outputs", "bulky arrays → job artifacts")
        slim, groups = split_bulky(result)
        outputs = {
            name: access.store_output(
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                name=name,
                tensors=tensors,
                metadata={"job_id": ctx.job_id},
            )
            for name, tensors in sorted(groups.items())
        }
    ctx.report_progress(0.96, "planning", "measurements → recommendation")
    targets: Targets = body.targets
    if targets.target_loss is None and swept.target_loss is not None:
        targets = targets.model_copy(update={"target_loss": swept.target_loss})
    seed = targets.seed if targets.seed is not None else uuid.UUID(ctx.job_id).int % (2**31)
    recommendation = make_plan(
        measurements, targets, seed=seed, flags=command_flags(body.model, dataset.name)
    )
    ctx.report_progress(1.0, "planning", "recommendation ready")
    peak, peak_source = _peak_memory(result)
    return AnalyzeResult(
        # the stored form: the bulky arrays as references into the output artifacts
        measurements=EngineMeasurements.model_validate(slim),
        intermediate_gradient_noise=noise,
        planner_inputs=_inline_planner_inputs(fields, outputs, result),
        artifacts={name: uuid.UUID(artifact) for name, artifact in outputs.items()},
        notes=notes,
        sweeps_used={k: [uuid.UUID(i) for i in ids] for k, ids in swept.used.items()},
        recommendation=recommendation,
        peak_memory_bytes=peak,
        peak_memory_source=peak_source,
    )


def command_flags(model: ModelSpec | HuggingFaceModel, eval_name: str | None) -> CommandFlags:
    """The flags the budget's next-step commands repeat: `--model MODEL_DIR` for a Hugging
    Face model, `--spec model.json` for a reference spec; the evaluation sample by its name."""
    if isinstance(model, HuggingFaceModel):
        return CommandFlags.huggingface(eval_name)
    return CommandFlags.reference(eval_name)


def _peak_memory(result: EngineMeasurements) -> tuple[int | None, str]:
    """The attempt's peak memory over all its stages and what measured it: CUDA peak
    allocated on the engine's device, else the process's peak resident memory
    (docs/numerics.md#memory-plan)."""
    import torch

    from curvplan_worker.curvature.memory import peak_memory

    value, source = peak_memory(torch.device(result.device or "cpu"))
    return value, source


def _tokens_per_example(model: ModelSpec | HuggingFaceModel) -> float | None:
    """Loss terms per example of a reference causal LM (its sequence length); None otherwise
    (a Hugging Face model's comes from the engine's measurements)."""
    if isinstance(model, ModelSpec) and isinstance(model.task, CausalLMTask):
        return float(model.task.seq_len)
    return None


def worker_machine(settings: Settings) -> MachineSettings:
    """This worker's machine settings; a misconfigured worker fails the job saying which."""
    try:
        return settings.machine_settings()
    except ValueError as exc:
        raise JobError(
            "worker-misconfigured", "The worker's machine settings are invalid", str(exc)[:300]
        ) from None


def _measurements(fields: dict[str, Any]) -> Measurements:
    """The planner's inputs, validated as a plan job's would be."""
    try:
        return Measurements.model_validate(fields)
    except ValueError as exc:
        raise JobError(
            "invalid-measurements",
            "The engine's measurements do not fit the planner",
            str(exc)[:300],
        ) from None


def _inline_planner_inputs(
    fields: dict[str, Any], outputs: dict[str, str], result: EngineMeasurements
) -> PlannerInputs:
    """The planner's inputs without the bulky arrays, which are referenced by artifact id.

    A re-plan (``plan`` with ``from_job``) rebuilds the full ``Measurements`` from these and
    the artifacts.
    """
    bulky = ("per_sample_losses", "per_sample_groups", "perturbed_losses")
    inline = {k: v for k, v in fields.items() if k not in bulky}
    refs: dict[str, PlannerArray] = {}
    for key, tensor in (
        ("per_sample_losses", "per_sample.losses"),
        ("per_sample_groups", "per_sample.groups"),
    ):
        if key in fields:
            refs[key] = PlannerArray(artifact_id=outputs["per_sample_losses"], tensor=tensor)
    perturbed = fields.get("perturbed_losses")
    if perturbed is not None:
        records = result.per_sample.perturbed if result.per_sample is not None else []
        index = next(i for i, r in enumerate(records) if r.kind == perturbed["kind"])
        refs["perturbed_losses"] = PlannerArray(
            artifact_id=outputs["perturbed_losses"],
            tensor=f"per_sample.perturbed.{index}.losses",
            radius=perturbed["radius"],
            kind=perturbed["kind"],
        )
    return PlannerInputs(fields=inline, arrays=refs)


def measure_engine(
    spec: ModelSpec | HuggingFaceModel,
    checkpoint_path: str | list[str],
    data_path: str,
    options: AnalysisOptions,
    machine: MachineSettings,
    ctx: JobContext,
    *,
    devices: int = 1,
    lease_seconds: float = 30.0,
    only: BlockShare | None = None,
    measured: MeasuredBlocks | None = None,
) -> EngineMeasurements:
    """The engine's ``measure`` with its errors turned into job errors (on ``devices``
    data-parallel ranks when more than one; a lost rank ends this process as a crash).
    ``only``: the blocks and pairs of one fan-out child; ``measured``: the children's records,
    in the fan-in; every rank gets them, so all ranks run the same products. The spec and
    options go to the engine as they are (typed, never parsed again); the other ranks get
    them as JSON and parse them once each."""
    import torch

    from curvplan_worker.curvature import analyze as curvature_analysis

    ranks: Any = contextlib.nullcontext()
    if devices > 1:
        from curvplan_worker.analyze.ranks import group_timeout, rank_zero

        visible = torch.cuda.device_count()
        if machine.device != "cpu" and torch.cuda.is_available() and visible < devices:
            raise JobError(
                "worker-misconfigured",
                "The worker has fewer GPUs than it offers",
                f"resources.devices: {devices} asked for, {visible} CUDA devices visible to "
                "the worker (CURVPLAN_WORKER_DEVICES is above what the machine has)",
            )

        task: RankTask = {
            "spec": spec.model_dump(mode="json"),
            "checkpoint": checkpoint_path,
            "data": data_path,
            "options": options.model_dump(mode="json"),
            "machine": machine.model_dump(),
        }
        task.update(curvature_analysis.fan_out_task(only, measured))
        ranks = rank_zero(devices, task, group_timeout(lease_seconds))
    eta = EtaTracker(ctx.limits, options)
    with engine_errors(), ranks as distributed:
        result = curvature_analysis.measure(
            spec,
            checkpoint_path,
            data_path,
            options,
            progress=_engine_progress(ctx, eta),
            should_cancel=_should_cancel(ctx),
            machine=machine,
            distributed=distributed,
            only=only,
            measured=measured,
            limits=ctx.limits,
        )
    assert result is not None  # this process is rank 0
    record = eta.record()
    if record is not None:  # docs/operations.md#cost-model-and-eta
        result.cost_estimate = record
    return result


@contextmanager
def engine_errors() -> Iterator[None]:
    """The curvature engine's errors as job errors naming the field (and cancel as cancel)."""
    import torch

    from curvplan.types.spec import SpecError
    from curvplan_worker.curvature import analyze as curvature_analysis
    from curvplan_worker.curvature.checkpoint import CheckpointError, CheckpointMismatch
    from curvplan_worker.curvature.data import DataError
    from curvplan_worker.curvature.hf import HFModelError
    from curvplan_worker.curvature.limits import TooLarge
    from curvplan_worker.curvature.memory import OutOfDeviceMemory

    try:
        yield
    except curvature_analysis.Cancelled:
        raise JobCancelled() from None
    except CheckpointMismatch as exc:
        raise JobError(
            "checkpoint-mismatch",
            "The checkpoint does not match the model spec",
            _mismatch_detail(exc, "checkpoint"),
        ) from None
    except CheckpointError as exc:
        raise JobError("invalid-checkpoint", "The checkpoint cannot be read", str(exc)) from None
    except DataError as exc:
        raise JobError(
            "dataset-mismatch", "The dataset does not match the model's task", str(exc)
        ) from None
    except (SpecError, HFModelError) as exc:
        raise JobError("invalid-model-spec", "The model spec is invalid", str(exc)) from None
    except curvature_analysis.OptionsError as exc:
        raise JobError("invalid-options", "The analysis options are invalid", str(exc)) from None
    except TooLarge as exc:  # docs/operations.md#memory-limit
        raise JobError(
            "too-large", "The analysis cannot fit the worker's memory", str(exc)
        ) from None
    except OutOfDeviceMemory as exc:  # retried down to micro-batch 1 (docs/numerics.md#oom-retry)
        raise JobError("out-of-memory", "One example does not fit in memory", str(exc)) from None
    except torch.cuda.OutOfMemoryError as exc:
        raise JobError(
            "out-of-memory",
            "The GPU ran out of memory",
            f"{str(exc)[:200]}; try a smaller eval_batch_size or fewer examples",
        ) from None
    except ValueError as exc:  # the engine's input checks name the field in the message
        raise JobError(
            "invalid-analysis-input", "The analysis cannot run on these inputs", str(exc)[:300]
        ) from None


def _mismatch_detail(exc: Any, field: str) -> str:
    """``field``: each offending tensor (name, problem, expected, found); no file path."""
    parts = []
    for issue in exc.issues:
        text = f"{issue.name} {issue.problem}"
        if issue.expected is not None or issue.found is not None:
            text += f" (expected {issue.expected}, found {issue.found})"
        parts.append(text)
    return f"{field}: " + "; ".join(parts)


def _fanned_in(
    children: list[ChildOutcome[AnalyzeBlocksJobCreate, AnalyzeBlocksResult]],
) -> tuple[MeasuredBlocks, FanOut]:
    """The children's block and pair records (for the engine's fan-in run) and the fan-out's
    record; a child that did not succeed fails the job naming its blocks and pairs."""
    from curvplan_worker.curvature.analyze import MeasuredBlocks

    failed = [c for c in children if not c.succeeded]
    if failed:
        parts = []
        for child in failed:
            names = ["|".join(p) for p in child.request.pairs]
            error = f": {child.error.type}" if child.error is not None else ""
            parts.append(
                f"{child.name or child.id} ({child.id}) {child.status}{error}"
                f" — blocks {child.request.blocks}" + (f", pairs {names}" if names else "")
            )
        raise JobError(
            "block-group-failed",
            "A block group of the fan-out failed",
            ("; ".join(parts))[:2000],
        )
    blocks: list[BlockSpectrum] = []
    pairs: list[BlockPair] = []
    record: list[FanOutChild] = []
    for child in children:
        assert child.result is not None  # succeeded
        measurements = child.result.measurements
        # each block and pair as the child's engine wrote it (the same models)
        blocks += measurements.blocks or []
        pairs += measurements.off_diagonal or []
        record.append(
            FanOutChild(
                job_id=child.id,
                name=child.name,
                blocks=child.request.blocks,
                pairs=[list(p) for p in child.request.pairs],
                estimated_cost=child.request.estimated_cost,
                elapsed_s=measurements.elapsed_s,
                attempt=child.attempt,
            )
        )
    return MeasuredBlocks(blocks=blocks, off_diagonal=pairs), FanOut(children=record)


STEP_METADATA_KEYS = ("step", "global_step")
LOSS_METADATA_KEY = "loss"


def _checkpoint_metadata(path: str) -> dict[str, str]:
    from curvplan_core.artifacts.safetensors_format import validate_file

    try:
        return validate_file(path).metadata
    except Exception:  # the checkpoint itself was validated when resolved; no metadata then
        return {}


def checkpoint_step(path: str) -> int | None:
    """The training step a checkpoint file declares in its safetensors ``__metadata__``
    (``step`` or ``global_step``, a non-negative integer); None when it declares none."""
    metadata = _checkpoint_metadata(path)
    for key in STEP_METADATA_KEYS:
        value = metadata.get(key, "").strip()
        if value.isdigit():
            return int(value)
    return None


def checkpoint_logged_loss(path: str) -> float | None:
    """The training loss a checkpoint file declares in its safetensors ``__metadata__``
    (``loss``, as ``curvplan.integrations.huggingface.CurvplanCallback`` writes it: the run's
    last logged loss); None when it declares none or not a finite non-negative number."""
    try:
        value = float(_checkpoint_metadata(path).get(LOSS_METADATA_KEY, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _declared_logs(body: AnalyzeJobCreate) -> list[tuple[int | None, float | None]]:
    """(step, logged loss) the request gives for each intermediate checkpoint (None: not
    given; the checkpoint file's metadata is read then)."""
    n = len(body.intermediate_checkpoints)
    steps = body.intermediate_steps or [None] * n
    losses = body.intermediate_logged_losses or [None] * n
    return list(zip(steps, losses, strict=True))


def checkpoint_label(shards: list[Any], step: int | None) -> str:
    """How reports and progress name an intermediate checkpoint: its file name (the uploaded
    name; a sharded one by its first shard and the count) and its training step when its
    metadata declares one, e.g. ``step_25.safetensors (step 25)``; the artifact id only for
    an artifact without a name."""
    first = shards[0]
    name = first.name or first.id
    if len(shards) > 1:
        name = f"{name} (+{len(shards) - 1} shards)"
    return f"{name} (step {step})" if step is not None else str(name)


def _intermediate_noise(
    spec: ModelSpec | HuggingFaceModel,
    intermediates: list[Any],
    data_path: str,
    options: AnalysisOptions,
    machine: MachineSettings,
    ctx: JobContext,
    declared: list[tuple[int | None, float | None]] | None = None,
) -> list[GradientNoiseEstimate]:
    """Gradient-noise statistics at each intermediate checkpoint (McCandlish et al. 2018 §2.2).

    In the order the checkpoints were given (oldest first: the planner reports the trend).
    Adaptive by default (``noise_adaptive``): gradient examples are added until the intervals
    of B_simple and B_noise are within a factor 2 or ``noise_max_examples`` are spent. Each
    point carries its training step and the training loss the run logged there when the
    request gives them (``declared``: ``intermediate_steps``, ``intermediate_logged_losses``)
    or the checkpoint's safetensors metadata names them (``checkpoint_step``,
    ``checkpoint_logged_loss``).
    Uses the STATS helper's ``gradient_noise_from_sample`` on the same evaluation sample,
    with the same precision, device and seed as the main analysis.
    """
    if not intermediates:
        return []
    import torch

    from curvplan_worker.curvature.cancel import Cancelled, cancel_scope
    from curvplan_worker.curvature.checkpoint import CheckpointError, CheckpointMismatch
    from curvplan_worker.curvature.device import resolve_device, resolve_dtype
    from curvplan_worker.curvature.gradient_noise import gradient_noise_from_sample
    from curvplan_worker.curvature.measured import clean
    from curvplan_worker.curvature.sources import load_source

    device = resolve_device(machine.device)
    dtype = resolve_dtype(options.precision)
    out: list[GradientNoiseEstimate] = []
    n = len(intermediates)
    for i, shards in enumerate(intermediates):
        field = shards[0].field.rsplit(".", 1)[0] if len(shards) > 1 else shards[0].field
        given_step, given_loss = declared[i] if declared else (None, None)
        step = given_step if given_step is not None else checkpoint_step(str(shards[0].path))
        logged_loss = (
            given_loss if given_loss is not None else checkpoint_logged_loss(str(shards[0].path))
        )
        label = checkpoint_label(shards, step)
        ctx.report_progress(
            0.85 + 0.08 * i / n,
            f"gradient noise (intermediate {i + 1}/{n})",
            f"checkpoint {label}",
        )
        try:
            source = load_source(spec, [str(a.path) for a in shards], data_path, dtype=dtype)
        except CheckpointMismatch as exc:
            raise JobError(
                "checkpoint-mismatch",
                "An intermediate checkpoint does not match the model spec",
                _mismatch_detail(exc, field),
            ) from None
        except CheckpointError as exc:
            raise JobError(
                "invalid-checkpoint", "A checkpoint cannot be read", f"{field}: {exc}"
            ) from None
        model = source.module
        if source.data is None:
            raise JobError(
                "dataset-mismatch", "The dataset does not fit the model", "dataset: no data"
            )
        data = source.data.to(device, dtype)
        objective = source.objective
        micro_batch = source.micro_batch(options.eval_batch_size)
        model = model.to(device=device, dtype=dtype)
        if len(data) < 3:
            raise JobError(
                "dataset-too-small",
                "The dataset is too small for gradient noise",
                "dataset: needs at least 3 examples (2 for gradients, 1 for the Hessian)",
            )
        try:
            with cancel_scope(_should_cancel(ctx)):  # checked inside its loops too
                stats = gradient_noise_from_sample(
                    model,
                    objective,
                    data.inputs,
                    data.targets,
                    n_grad=options.noise_grad_examples,
                    n_hessian=options.noise_hessian_examples,
                    seed=options.seed,
                    batch_size=micro_batch or 32,
                    adaptive=options.noise_adaptive,
                    max_examples=options.noise_max_examples,
                    max_groups=options.noise_max_groups,
                )
        except Cancelled:
            raise JobCancelled() from None
        stats = clean(stats)
        stats.pop("grad_indices", None)
        stats.pop("hessian_indices", None)
        record = GradientNoiseEstimate.model_validate(stats)
        with torch.no_grad():
            losses, counts = objective.example_losses(model, data.inputs, data.targets)
            record.loss = clean(float(losses.sum() / counts.sum()))
        record.checkpoint = label  # by file or step: what the user gave, not an artifact id
        record.checkpoint_artifact = shards[0].id if len(shards) == 1 else [a.id for a in shards]
        if step is not None:
            record.step = step
        if logged_loss is not None:
            record.logged_loss = logged_loss
        out.append(record)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out
