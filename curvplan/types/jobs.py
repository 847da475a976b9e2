"""Request and response models of the job resource, and the registry of job kinds.

The create body is a discriminated union on ``kind``. A kind is declared once, by its
create model: to add one, define ``XJobCreate`` with ``kind: Literal["x"]`` and its hooks as
class variables —

- ``queue``: the queue its jobs wait in;
- ``artifact_fields``: the body fields that name artifacts, with the artifact kind each must
  be (the API checks them at submission, 422 naming the field, and records them in the
  ``job_artifact`` table, which keeps them from deletion while the job is live);
- ``client_submittable``: False for an internal kind that only a fan-out creates (a client's
  ``POST /v1/jobs`` of it is a 422);
- ``result_type``: the model of a succeeded job's ``result`` (``curvplan.types.results``):
  what the kind's ``run`` returns, validated by the worker before it is written, and what the
  API answers;
- ``time_limit``: the seconds an attempt may run before it is killed (error type
  ``timeout``); None: the service's default. The operator overrides it per kind
  (``CURVPLAN_JOB_TIME_LIMITS``, :func:`job_time_limit`);
- ``fail_fast``: for a child kind, the error its waiting parent fails with as soon as one
  child fails (:class:`FailFast`; None: a failed child only counts as failed);

append it to :data:`JOB_CREATE_TYPES` (the unions, the OpenAPI schema, :data:`QUEUE_OF_KIND`
and the API's validation follow), and write its handler as the module
``curvplan_worker.kinds.x`` exposing ``run`` (the worker derives it from the name). Checks
that need the database or the service's settings (model size, tensor layouts, re-plans) and
a fan-out at submission are the server's, declared for the create model in
``curvplan_server.jobs.submission`` (a ``KindSubmission`` of it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import reduce
from itertools import pairwise
from operator import or_
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_args

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    UrlConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from curvplan.types.artifact_inputs import CheckpointRef
from curvplan.types.field_errors import field_error
from curvplan.types.model_source import ModelSource
from curvplan.types.options import (  # pydantic only, like the spec
    STORED_REQUEST,
    AnalysisOptions,
    is_stored_request,
)
from curvplan.types.planner import (
    MAX_BRANCH_CHECKPOINTS,
    Measurements,
    PlanInputError,
    Targets,
    check_workload,
)
from curvplan.types.results import (
    AnalyzeBlocksResult,
    AnalyzeResult,
    JobResult,
    PlanResult,
    SweepJobResult,
    SweepPointJobResult,
)
from curvplan.types.sweep import PointSettings, SweepSettings, _SweepBase

TagKey = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-/]+$")]
TagValue = Annotated[str, Field(max_length=256)]
MAX_TAGS = 32


ArtifactKind = Literal["checkpoint", "dataset"]
Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class ArtifactField:
    """A top-level body field of a kind that names artifacts of ``artifact_kind``.

    Its value is an artifact id, a list of ids (the shards of one checkpoint), a list of
    those (intermediate checkpoints), or null (names nothing).
    """

    name: str
    artifact_kind: ArtifactKind


@dataclass(frozen=True, slots=True)
class ArtifactReference:
    """One artifact id a job body names: where (``field``, e.g. ``("checkpoint", 1)`` for a
    checkpoint's second shard), which, and the artifact kind it must have."""

    field: Loc
    artifact_id: uuid.UUID
    kind: ArtifactKind

    @property
    def path(self) -> str:
        """The field as a dotted path without the ``body`` prefix: ``checkpoint.1``."""
        return ".".join(map(str, self.field))


class JobStatus(StrEnum):
    """A job's status: the values of the ``job.status`` column and of the API's ``status``.

    ``queued`` → ``running`` → ``succeeded`` | ``failed``; a cancel goes through
    ``cancelling`` (a running attempt stops cooperatively) to ``cancelled``.
    """

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


JOB_STATUSES: tuple[str, ...] = tuple(s.value for s in JobStatus)
TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING})


@dataclass(frozen=True, slots=True)
class FailFast:
    """A child kind whose failure dooms its waiting parent: the parent fails at once with
    ``error_type`` and ``title`` and its other children are cancelled
    (``curvplan_core.jobs.lifecycle.fail_parent_fast``)."""

    error_type: str
    title: str


class _JobCreateBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # The kind's hooks (the module docstring; the registries below derive from them).
    queue: ClassVar[str]
    artifact_fields: ClassVar[tuple[ArtifactField, ...]] = ()
    client_submittable: ClassVar[bool] = True
    result_type: ClassVar[type[BaseModel]]
    time_limit: ClassVar[float | None] = None
    fail_fast: ClassVar[FailFast | None] = None

    name: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="A label to find the job by (not unique)."
    )
    tags: Annotated[dict[TagKey, TagValue], Field(max_length=MAX_TAGS)] = Field(
        default_factory=dict, description="Free-form string labels, filterable as tag=key:value."
    )
    max_attempts: Annotated[int, Field(ge=1, le=10)] | None = Field(
        default=None, description="Attempts before the job fails for good (default: server's)."
    )
    webhook_url: Annotated[AnyHttpUrl, UrlConstraints(max_length=2000)] | None = Field(
        default=None,
        description="POSTed a signed JSON event when the job succeeds, fails or is cancelled "
        "(Standard Webhooks signature headers; docs/integrations.md). The host must be on the "
        "operator's allow-list.",
    )


class PlanJobCreate(_JobCreateBase):
    """Plan a data budget from measurements the client already has (CPU, seconds).

    Or re-plan a finished analysis with new targets: ``from_job`` names a succeeded
    ``analyze`` job of the project, whose measurements the API copies into the job.
    """

    queue: ClassVar[str] = "cpu"
    result_type: ClassVar[type[BaseModel]] = PlanResult
    time_limit: ClassVar[float | None] = 900.0
    kind: Literal["plan"]
    from_job: uuid.UUID | None = Field(
        default=None, description="A succeeded analyze job whose measurements to re-plan."
    )
    measurements: Measurements | None = Field(
        default=None, validate_default=True, description="Required unless from_job is given."
    )
    targets: Targets = Field(default_factory=Targets)

    @field_validator("measurements")
    @classmethod
    def _one_source(cls, value: Measurements | None, info: ValidationInfo) -> Measurements | None:
        from_job = info.data.get("from_job")
        if value is None and from_job is None:
            raise ValueError("Field required (or give from_job to re-plan an analyze job)")
        if is_stored_request(info):
            if value is None:  # the API completes a re-plan with the analysis's measurements
                raise ValueError("Field required (a stored re-plan holds its measurements)")
            return value
        if value is not None and from_job is not None:
            raise ValueError("give measurements or from_job, not both")
        return value

    @field_validator("targets")
    @classmethod
    def _within_workload_cap(cls, value: Targets, info: ValidationInfo) -> Targets:
        measurements = info.data.get("measurements")
        if measurements is not None:
            try:
                check_workload(measurements, value)
            except PlanInputError as exc:
                raise ValueError(str(exc)) from None
        return value


class Resources(BaseModel):
    """What one job needs of a worker's machine (the machine settings stay the worker's)."""

    model_config = ConfigDict(extra="forbid")

    devices: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1,
        description="Devices (GPUs, or CPU processes on a CPU worker) the analysis runs on in "
        "data parallel, one process each. Only workers started with at least this many "
        "(`curvplan worker --devices`) claim the job; it waits until one is live. Above the "
        "service's CURVPLAN_MAX_JOB_DEVICES it is refused (docs/operations.md).",
    )


class AnalyzeJobCreate(_JobCreateBase):
    """Measure a checkpoint's curvature on a data sample, then plan (GPU queue)."""

    queue: ClassVar[str] = "gpu"
    artifact_fields: ClassVar[tuple[ArtifactField, ...]] = (
        ArtifactField("dataset", "dataset"),
        ArtifactField("checkpoint", "checkpoint"),
        ArtifactField("intermediate_checkpoints", "checkpoint"),
    )
    result_type: ClassVar[type[BaseModel]] = AnalyzeResult
    time_limit: ClassVar[float | None] = 86400.0
    kind: Literal["analyze"]
    model: ModelSource = Field(
        description="The reference model spec, or {source: huggingface, config: <config.json>} "
        "(GPT-2, Llama, Mistral, Qwen2 causal LMs; remote code is refused)."
    )
    checkpoint: CheckpointRef = Field(
        description="Artifact id of the checkpoint at w*, or the ids of its shards (one per "
        "safetensors file of a sharded save_pretrained checkpoint)."
    )
    dataset: uuid.UUID = Field(
        description="Artifact id of the evaluation sample: {inputs, targets} or "
        "{input_ids[, attention_mask][, labels]} (Hugging Face conventions)."
    )
    intermediate_checkpoints: Annotated[list[CheckpointRef], Field(max_length=32)] = Field(
        default_factory=list,
        description="Checkpoints before convergence (each an id or a list of shard ids), for "
        "the gradient-noise scale (undefined at a converged w*).",
    )
    intermediate_steps: (
        Annotated[list[Annotated[int, Field(ge=0)] | None], Field(max_length=32)] | None
    ) = Field(
        default=None,
        description="The training step of each intermediate checkpoint, in the same order "
        "(increasing; null for one not known), e.g. from a Hugging Face Trainer's "
        "trainer_state.json. Default: the step each checkpoint file declares in its "
        "safetensors metadata (`step` or `global_step`).",
    )
    intermediate_logged_losses: (
        Annotated[list[Annotated[float, Field(ge=0, allow_inf_nan=False)] | None],
                  Field(max_length=32)]
        | None
    ) = Field(
        default=None,
        description="The training loss the run logged at each intermediate checkpoint, in the "
        "same order (null for one not logged), e.g. trainer_state.json's log_history. Shown "
        "beside the trend; the trend itself uses the loss measured on the evaluation sample. "
        "Default: the `loss` each checkpoint file declares in its safetensors metadata.",
    )  # fmt: skip
    options: AnalysisOptions = Field(default_factory=AnalysisOptions)
    resources: Resources = Field(default_factory=Resources)
    targets: Targets = Field(default_factory=Targets)
    sweeps: Annotated[list[uuid.UUID], Field(max_length=8)] = Field(
        default_factory=list,
        description="Succeeded sweep jobs of the project whose fits the budget uses: a batch "
        "sweep's steps to target (B_crit), a data sweep's L(D) (the data size for the target "
        "loss) and a branch sweep's critical batch per checkpoint (its warm-up schedule; it "
        "leads budget.batch only without a batch sweep and a noise-scale trend). Without "
        "targets.target_loss the data sweep's target loss is "
        "used (else the batch sweep's); budget.batch answers the batch sweep's own target "
        "(budget.batch.target_loss), budget.data the target loss (budget.data.target_loss).",
    )

    @field_validator("intermediate_steps", "intermediate_logged_losses")
    @classmethod
    def _one_per_intermediate(cls, value: list[Any] | None, info: ValidationInfo) -> Any:
        if value is None or "intermediate_checkpoints" not in info.data:
            return value  # intermediate_checkpoints failed: its own error names it
        count = len(info.data["intermediate_checkpoints"])
        if len(value) != count:
            raise ValueError(
                f"{info.field_name} has {len(value)} entries for {count} intermediate "
                "checkpoints: give one per checkpoint (null where unknown), in the same order"
            )
        if info.field_name == "intermediate_steps":
            known = [s for s in value if s is not None]
            if any(b <= a for a, b in pairwise(known)):
                raise ValueError(
                    f"intermediate_steps {value} must increase: the intermediate checkpoints "
                    "are given oldest first"
                )
        return value


BlockName = Annotated[str, Field(min_length=1, max_length=200)]


class AnalyzeBlocksJobCreate(_JobCreateBase):
    """One group of an analysis's block fan-out (internal: only an ``analyze`` creates these;
    GPU queue).

    Loads the same checkpoint and dataset with the same options as its parent and measures
    only ``blocks`` (spectra, trace, GGN parts) and ``pairs`` (off-diagonal σ_max); its result
    is ``{measurements: {blocks, off_diagonal, …}}``, which the parent assembles
    (docs/numerics.md#block-fan-out).
    """

    queue: ClassVar[str] = "gpu"
    artifact_fields: ClassVar[tuple[ArtifactField, ...]] = (
        ArtifactField("dataset", "dataset"),
        ArtifactField("checkpoint", "checkpoint"),
    )
    client_submittable: ClassVar[bool] = False
    result_type: ClassVar[type[BaseModel]] = AnalyzeBlocksResult
    # An analysis needs every block group: one failed group fails it at once.
    fail_fast: ClassVar[FailFast | None] = FailFast(
        "block-group-failed", "A block group of the fan-out failed"
    )
    kind: Literal["analyze_blocks"]
    model: ModelSource
    checkpoint: CheckpointRef
    dataset: uuid.UUID
    options: AnalysisOptions = Field(default_factory=AnalysisOptions)
    resources: Resources = Field(
        default_factory=Resources, description="The parent's devices per job, copied."
    )
    blocks: Annotated[list[BlockName], Field(max_length=4096)] = Field(
        default_factory=list, description="The blocks whose spectra this job measures."
    )
    pairs: Annotated[list[tuple[BlockName, BlockName]], Field(max_length=100_000)] = Field(
        default_factory=list, description="The off-diagonal pairs [row, col] it measures."
    )
    estimated_cost: float | None = Field(
        default=None,
        ge=0,
        description="The group's estimated seconds (the cost model's products of its blocks "
        "and pairs × the prior milliseconds per product) the parent balanced the groups by.",
    )


_SWEEP_ARTIFACTS = (
    ArtifactField("checkpoint", "checkpoint"),
    ArtifactField("train_data", "dataset"),
    ArtifactField("eval_data", "dataset"),
)


class SweepJobCreate(_JobCreateBase, _SweepBase):
    """Train at a ladder of batch sizes or dataset sizes and fit the budget's curves.

    The job fans out one ``sweep_point`` child per run (listed as ``children``), waits for
    them (stage ``waiting for children``, progress = points done / total) and fits the
    results: S_min, E_min, B_crit and the two-batch B_simple (batch sweep),
    L(D) = E + A·D^(−β) and the size for the target loss (data sweep), or the critical batch
    size at each of ``checkpoints`` by branched training (branch sweep, Merrill et al. 2025:
    one point per checkpoint and batch size). The fit runs on the cpu queue, the training
    runs on the gpu queue (CUDA when the worker has it).
    """

    queue: ClassVar[str] = "cpu"
    artifact_fields: ClassVar[tuple[ArtifactField, ...]] = (
        *_SWEEP_ARTIFACTS,
        ArtifactField("checkpoints", "checkpoint"),
        ArtifactField("optimizer_states", "checkpoint"),
    )
    result_type: ClassVar[type[BaseModel]] = SweepJobResult
    kind: Literal["sweep"]
    sweep: SweepSettings

    @field_validator("sweep")
    @classmethod
    def _agent_sweep_settings(cls, value: SweepSettings, info: ValidationInfo) -> SweepSettings:
        if info.data.get("runner") != "agent":
            return value
        if value.type == "branch":
            raise ValueError(
                "sweep.type: an agent sweep (runner: agent) is a batch or data sweep; a branch "
                "sweep resumes from the service's checkpoints, which your command does not read"
            )
        if value.type == "data" and value.data_sizes is None:
            raise ValueError(
                "sweep.data_sizes: required for an agent data sweep (the service does not see "
                "your training data, so it cannot choose the subset sizes)"
            )
        return value

    checkpoints: Annotated[list[uuid.UUID], Field(max_length=MAX_BRANCH_CHECKPOINTS)] = Field(
        default_factory=list,
        validate_default=True,
        description="Branch sweep (required, at least one): artifact ids of the checkpoints of "
        "one training run to branch from, e.g. its saved steps (docs/budget.md#branch-sweep). "
        "Other sweeps start from `checkpoint`.",
    )
    optimizer_states: Annotated[
        list[uuid.UUID | None], Field(max_length=MAX_BRANCH_CHECKPOINTS)
    ] = Field(
        default_factory=list,
        description="Branch sweep, AdamW: for each of `checkpoints` (same order; null: none) "
        "the artifact id of its optimizer state, a safetensors file with `exp_avg.<parameter>` "
        "and `exp_avg_sq.<parameter>` for every parameter and its `step` in the metadata "
        "(never a pickle; docs/budget.md#branch-sweep). Its branches start from these "
        "moments; a checkpoint without one warms them (sweep.moment_warmup_steps).",
    )

    @field_validator("sweep")
    @classmethod
    def _first_round_within_max_runs(cls, value: SweepSettings, info: ValidationInfo) -> Any:
        optimizer = info.data.get("optimizer")
        if value.type != "data" or value.data_sizes is None or optimizer is None:
            return value
        runs = len(set(value.data_sizes)) * len(optimizer.lr_grid)
        if runs > value.max_runs:
            raise ValueError(
                f"max_runs: the first round alone is {runs} training runs "
                f"({len(set(value.data_sizes))} data_sizes × {len(optimizer.lr_grid)} "
                f"optimizer.lr_grid multipliers), more than max_runs = {value.max_runs}"
            )
        return value

    @model_validator(mode="after")
    def _runnable(self) -> SweepJobCreate:
        # What the worker's planner would refuse (SweepSettings.window_problem), refused here.
        problem = self.sweep.window_problem(self.model)
        if problem is not None:
            field, message = problem
            loc = ("model",) if field == "model" else ("sweep", field)
            raise field_error(type(self).__name__, loc, message, "sweep_not_runnable")
        return self

    @field_validator("checkpoints")
    @classmethod
    def _checkpoints_for_branch(
        cls, value: list[uuid.UUID], info: ValidationInfo
    ) -> list[uuid.UUID]:
        sweep = info.data.get("sweep")
        if sweep is None:
            return value  # the sweep settings failed: their own error names them
        if sweep.type != "branch":
            if value:
                raise ValueError(
                    f"only a branch sweep takes checkpoints (this is a {sweep.type} sweep); "
                    "give its start checkpoint as `checkpoint`"
                )
            return value
        if not value:
            raise ValueError(
                "Field required for a branch sweep: the checkpoints to branch from (at least one)"
            )
        if info.data.get("checkpoint") is not None:
            raise ValueError("a branch sweep branches from `checkpoints`; drop `checkpoint`")
        steps = sweep.checkpoint_steps
        if steps is not None and len(steps) != len(value):
            raise ValueError(
                f"sweep.checkpoint_steps gives {len(steps)} steps for {len(value)} checkpoints: "
                "give one step per checkpoint, in the same order"
            )
        return value

    @field_validator("optimizer_states")
    @classmethod
    def _one_state_per_checkpoint(
        cls, value: list[uuid.UUID | None], info: ValidationInfo
    ) -> list[uuid.UUID | None]:
        if not value:
            return value
        checkpoints = info.data.get("checkpoints")
        if checkpoints is None:
            return value  # the checkpoints failed: their own error names them
        if len(value) != len(checkpoints):
            raise ValueError(
                f"{len(value)} optimizer states for {len(checkpoints)} checkpoints: give one "
                "per checkpoint, in the same order (null where there is none)"
            )
        optimizer = info.data.get("optimizer")
        if optimizer is not None and optimizer.name != "adamw" and any(value):
            raise ValueError(
                "an optimizer state holds AdamW's moments (exp_avg, exp_avg_sq): "
                f"optimizer.name is {optimizer.name!r}"
            )
        return value


class SweepPointJobCreate(_JobCreateBase, _SweepBase):
    """One training run of a sweep (internal: only a ``sweep`` creates these; a client
    submits the sweep, not its points)."""

    queue: ClassVar[str] = "gpu"
    artifact_fields: ClassVar[tuple[ArtifactField, ...]] = (
        *_SWEEP_ARTIFACTS,
        ArtifactField("optimizer_state", "checkpoint"),
    )
    client_submittable: ClassVar[bool] = False
    # A sweep fits the points that finished: a failed point only counts as failed.
    result_type: ClassVar[type[BaseModel]] = SweepPointJobResult
    kind: Literal["sweep_point"]
    point: PointSettings
    optimizer_state: uuid.UUID | None = Field(
        default=None,
        description="Branch sweep: the checkpoint's optimizer state (AdamW moments, "
        "safetensors) the run starts from.",
    )


AGENT_QUEUE = "agent"
"""The queue of the points of an agent sweep (``runner: agent``): only ``curvplan agent``
processes of the job's project claim from it (``POST /v1/agents/{id}/claim``); it is not one of
:data:`QUEUES`, so a worker is never started on it."""


def queue_of(kind: str, request: Mapping[str, Any]) -> str:
    """The queue a job of ``kind`` with this (stored) request waits in: its kind's
    (:data:`QUEUE_OF_KIND`), except a point of an agent sweep, which waits for agents
    (:data:`AGENT_QUEUE`)."""
    if kind == "sweep_point" and request.get("runner") == "agent":
        return AGENT_QUEUE
    return QUEUE_OF_KIND[kind]


#: Any kind's create model (what the API validated, what the worker runs).
JobCreateModel = _JobCreateBase

JOB_CREATE_TYPES: tuple[type[_JobCreateBase], ...] = (
    PlanJobCreate,
    AnalyzeJobCreate,
    SweepJobCreate,
    SweepPointJobCreate,
    AnalyzeBlocksJobCreate,
)


def attempt_text(
    attempt: int, max_attempts: int, status: str, children_statuses: list[str] | None
) -> str:
    """A job's attempts for people: ``1/3``; for a fan-out whose fan-in attempt ran,
    ``1/3 + fan-in``. The fan-in is an attempt of its own (queueing it raises max_attempts by
    one, docs/layout.md "One job's life"), so a clean fan-out reads 1/3, not 2/4."""
    done = bool(children_statuses) and all(s in TERMINAL_STATUSES for s in children_statuses or [])
    if done and attempt >= 2 and status not in (JobStatus.CANCELLED, JobStatus.CANCELLING):
        return f"{attempt - 1}/{max_attempts - 1} + fan-in"
    return f"{attempt}/{max_attempts}"


def kind_name(create_type: type[_JobCreateBase]) -> str:
    """The ``kind`` literal a create model accepts."""
    (name,) = get_args(create_type.model_fields["kind"].annotation)
    return str(name)


#: kind → its create model: what the API validates a body with and the worker parses the
#: stored request into (:func:`parse_stored_request`).
CREATE_TYPE_OF_KIND: dict[str, type[_JobCreateBase]] = {kind_name(t): t for t in JOB_CREATE_TYPES}
#: kind → queue: the registry the API (validation, queueing) and the worker derive from.
QUEUE_OF_KIND: dict[str, str] = {kind_name(t): t.queue for t in JOB_CREATE_TYPES}
JOB_KINDS: tuple[str, ...] = tuple(QUEUE_OF_KIND)
#: kind → the body fields that name artifacts (checked at submission, locked while live).
ARTIFACT_FIELDS_OF_KIND: dict[str, tuple[ArtifactField, ...]] = {
    kind_name(t): t.artifact_fields for t in JOB_CREATE_TYPES
}
#: The kinds a client may submit, and the internal ones only a fan-out creates.
CLIENT_JOB_CREATE_TYPES: tuple[type[_JobCreateBase], ...] = tuple(
    t for t in JOB_CREATE_TYPES if t.client_submittable
)
CLIENT_JOB_KINDS: tuple[str, ...] = tuple(kind_name(t) for t in CLIENT_JOB_CREATE_TYPES)
INTERNAL_JOB_KINDS: tuple[str, ...] = tuple(k for k in JOB_KINDS if k not in CLIENT_JOB_KINDS)
QUEUES: tuple[str, ...] = tuple(sorted(set(QUEUE_OF_KIND.values())))


def job_time_limit(kind: str, overrides: Mapping[str, float], default: float) -> float:
    """The seconds an attempt of ``kind`` may run: the operator's override for the kind
    (``CURVPLAN_JOB_TIME_LIMITS``), else the kind's declared :attr:`time_limit`, else
    ``default`` (``CURVPLAN_DEFAULT_JOB_TIME_LIMIT``; also for a kind not declared here)."""
    if kind in overrides:
        return float(overrides[kind])
    create_type = CREATE_TYPE_OF_KIND.get(kind)
    declared = create_type.time_limit if create_type is not None else None
    return float(default if declared is None else declared)


def _union(types: tuple[type[_JobCreateBase], ...]) -> Any:
    if len(types) == 1:
        return types[0]
    return Annotated[reduce(or_, types), Field(discriminator="kind")]


#: Every kind's body (what the worker validates a fan-out's children with).
JobCreate = _union(JOB_CREATE_TYPES)
JOB_CREATE_ADAPTER: TypeAdapter[Any] = TypeAdapter(JobCreate)
#: The body of ``POST /v1/jobs``: the kinds a client may submit (the OpenAPI ``JobCreate``).
ClientJobCreate = _union(CLIENT_JOB_CREATE_TYPES)
CLIENT_JOB_CREATE_ADAPTER: TypeAdapter[Any] = TypeAdapter(ClientJobCreate)


CreateT = TypeVar("CreateT", bound=BaseModel)


def parse_stored_request(create_type: type[CreateT], stored: str | bytes) -> CreateT:
    """A job's request as the API stored it (the create model's JSON), parsed back into
    ``create_type`` — once, by the worker that runs the job.

    JSON semantics (arrays are valid for tuple fields), in the :data:`STORED_REQUEST`
    context: a re-plan holds both ``from_job`` and the measurements the API copied, and the
    machine settings that older API versions accepted as options are dropped. Raises
    pydantic's ``ValidationError``.
    """
    return create_type.model_validate_json(stored, context=STORED_REQUEST)


def _artifact_ids(loc: Loc, value: object) -> list[tuple[Loc, uuid.UUID]]:
    """The ids in a field's value (an id, a list of ids, a list of those), with their locs."""
    if value is None:
        return []
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _artifact_ids((*loc, i), item)]
    if isinstance(value, uuid.UUID):
        return [(loc, value)]
    return [(loc, uuid.UUID(str(value)))]


def artifact_references(
    kind: str, body: JobCreateModel | Mapping[str, object]
) -> list[ArtifactReference]:
    """Every artifact a validated body of ``kind`` names (its create model, or its JSON), in
    the order of the kind's :attr:`artifact_fields`; ``[]`` for a kind that names none."""

    def value(name: str) -> object:
        return body.get(name) if isinstance(body, Mapping) else getattr(body, name, None)

    return [
        ArtifactReference(loc, artifact_id, field.artifact_kind)
        for field in ARTIFACT_FIELDS_OF_KIND.get(kind, ())
        for loc, artifact_id in _artifact_ids((field.name,), value(field.name))
    ]


class StageMark(BaseModel):
    """When the job's attempt entered a stage (the worker records every stage change)."""

    stage: str
    started_at: datetime


class Progress(BaseModel):
    """Where a running job is: fraction in [0, 1], stage name, human message, and the
    stages the current attempt went through so far (a client that polls less often than
    stages change still sees them all)."""

    fraction: float | None = None
    stage: str | None = None
    message: str | None = None
    stages: list[StageMark] | None = None
    points_done: int | None = Field(
        default=None, description="A fan-out waiting for its children: children ended."
    )
    points_total: int | None = Field(default=None, description="… and children in all.")
    points_failed: int | None = Field(default=None, description="… and children failed.")
    eta_seconds: float | None = Field(
        default=None,
        description="Seconds the attempt still needs by its own estimate (an analysis: its "
        "stages at the measured milliseconds per product, updated as blocks converge; "
        "docs/operations.md#cost-model-and-eta); null before the estimate.",
    )


class JobError(BaseModel):
    """Why a job failed: a stable type (e.g. ``worker-lost``), a title, a detail."""

    type: str
    title: str | None = None
    detail: str | None = None


class JobChild(BaseModel):
    """A child job of a fan-out (e.g. one point of a sweep), as its parent lists it."""

    id: uuid.UUID
    kind: str
    name: str | None
    status: JobStatus
    attempt: int
    error_type: str | None = Field(default=None, description="error.type of a failed child.")
    stage: str | None = Field(
        default=None, description="progress.stage of a running child (null once it ended)."
    )
    eta_seconds: float | None = Field(
        default=None,
        description="progress.eta_seconds of a running child: its own estimate of the seconds "
        "it still needs (null without one, and once it ended).",
    )
    links: dict[str, str]


class JobLinks(BaseModel):
    self: str
    cancel: str
    recommendation: str


class JobOut(BaseModel):
    """The job resource as the API returns it."""

    id: uuid.UUID
    parent_id: uuid.UUID | None = Field(
        default=None, description="The job that created this one by fanning out (else null)."
    )
    kind: str
    queue: str
    status: JobStatus
    name: str | None
    tags: dict[str, str]
    progress: Progress | None
    attempt: int
    max_attempts: int
    cancel_requested: bool
    result: JobResult | None = Field(
        description="The kind's result once the job succeeded (plan: PlanResult, analyze: "
        "AnalyzeResult, analyze_blocks: AnalyzeBlocksResult, sweep: SweepJobResult, "
        "sweep_point: SweepPointJobResult); null before."
    )
    error: JobError | None
    # The body as stored (any kind's create model as JSON; one stored by an older version
    # may not validate as today's): passed through as JSON.
    request: dict[str, JsonValue] | None = Field(
        default=None, description="The validated body (omitted in list pages)."
    )
    children: list[JobChild] | None = Field(
        default=None,
        description="Child jobs of a fan-out (sweep points), oldest first; omitted in list "
        "pages and for jobs without children. While they run the job is `running` at stage "
        "`waiting for children` and its progress counts points done / total.",
    )
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: JobLinks

    @field_validator("result", mode="before")
    @classmethod
    def _result_of_kind(cls, value: Any, info: ValidationInfo) -> Any:
        """The result model is the job kind's (an analyze result is also a valid plan one)."""
        create_type = CREATE_TYPE_OF_KIND.get(info.data.get("kind", ""))
        if isinstance(value, dict) and create_type is not None:
            return create_type.result_type.model_validate(value)
        return value


class JobPage(BaseModel):
    """One page of jobs, newest first; pass ``next_page_token`` back to get the next."""

    items: list[JobOut]
    next_page_token: str | None


class WorkerOut(BaseModel):
    """A worker process and whether its heartbeat is fresh."""

    id: str
    hostname: str
    pid: int
    queues: list[str]
    devices: int = Field(default=1, description="Devices the worker gives one job.")
    status: str
    live: bool
    started_at: datetime
    last_heartbeat_at: datetime
    current_job_id: uuid.UUID | None


class WorkerList(BaseModel):
    items: list[WorkerOut]
