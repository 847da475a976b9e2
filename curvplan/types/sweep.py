"""Sweeps: training runs the workers do to measure what the budget's formulas need.

A ``sweep`` job fans out one ``sweep_point`` child job per training run and fits the
results when they have all ended (see ``docs/budget.md``):

* **batch sweep** — from a start checkpoint (or a seeded initialisation) train at a ladder
  of power-of-two batch sizes until the evaluation loss reaches ``target_loss`` or the step
  cap; fit S/S_min − 1 = (E/E_min − 1)⁻¹ (McCandlish et al. 2018, eq. 2.11) for S_min, E_min
  and B_crit; measure B_simple with the two-batch estimator (McCandlish et al. 2018, App. A)
  from the training gradients of the same runs.
* **data sweep** — train on nested subsets of geometric sizes D_i, each for its own steps
  (``data_steps``: ``epochs`` passes with a floor and a cap) with a decayed schedule over
  exactly those steps (cosine, or warmup-stable-decay with a cooldown: Hägele et al. 2024) at
  the learning rate chosen by a grid on the smallest and largest subsets; the best held-out
  loss of each run is L(D_i); fit L(D) = E + A·D^(−β) and size the dataset for
  ``target_loss``. While the fitted size lies more than 1.5× outside the measured sizes, the
  fan-in queues another round below or above them (``max_rounds``, ``max_runs``).
* **branch sweep** — branched training (Merrill et al. 2025, "Critical Batch Size Revisited",
  arXiv 2505.23971): from each given checkpoint, one branch per batch size B trains the same
  token window (constant learning rate by ``optimizer.lr_rule``); the critical batch size at
  the checkpoint is the largest B whose loss stays within ``tolerance`` of the smallest
  batch's. Over the checkpoints this gives a batch-size warm-up schedule.

Batch sizes are in **examples** (rows of the dataset: sequences for a language model); the
results also give them in tokens.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from curvplan.types.field_errors import field_error
from curvplan.types.model_source import ModelSource
from curvplan.types.planner import (
    MAX_BRANCH_CHECKPOINTS,
    BatchWarmupStage,
    BCrit,
    BranchedBatchEstimate,
    BranchPointStatus,
    LossPoint,
    NotComputed,
    ReferenceReach,
    ScalingSection,
    StepsPoint,
)

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
MAX_POINTS = 64
#: The batch sizes of a batch or branch sweep without ``batch_sizes`` (examples).
DEFAULT_BATCH_SIZES: tuple[int, ...] = (8, 16, 32, 64, 128)
#: Distinct sizes each sweep needs for its fit (the API refuses fewer, the worker's fit
#: relies on them): S/S_min − 1 = (E/E_min − 1)⁻¹ has two parameters and a residual (batch),
#: L(D) = E + A·D^(−β) three and a residual (data), a branch compares two batches at least.
MIN_POINTS: dict[str, int] = {"batch": 3, "data": 4, "branch": 2}


def tokens_per_example(model: ModelSource | None) -> float | None:
    """Loss terms ("tokens") one example counts in a sweep: ``seq_len`` for a causal LM and a
    per-token regression, 1 for a classification (as the objective counts them); None for a
    Hugging Face model, whose tokens per example are the data's, not known from the request."""
    task = getattr(model, "task", None)
    if task is None:
        return None
    seq_len = getattr(task, "seq_len", None)
    return float(seq_len) if task.type != "classification" and seq_len else 1.0


def branch_window_examples(
    window_tokens: int, tokens_per_example: float, window_evals: int, largest_batch: int
) -> tuple[int, int]:
    """A branch sweep's window in examples, and the examples between its evaluations:
    ``window_tokens`` rounded up so that each of the ``window_evals`` evaluations falls on a
    whole step of the largest batch (batch sizes are powers of two: of every batch then)."""
    wanted = math.ceil(window_tokens / tokens_per_example)
    per_eval = math.ceil(wanted / window_evals / largest_batch) * largest_batch
    return per_eval * window_evals, per_eval


DATA_MAX_STEPS = 50_000
"""A data sweep's default step cap per run (``sweep.max_steps`` when the request gives none):
far above what the epoch rule asks of the default sizes, so that it is a safety bound and not
a horizon that flattens L(D) (docs/budget.md#data-sweep)."""
MAX_SWEEP_RUNS = 240
"""The most training runs (child jobs) a data sweep may queue over all its rounds."""


def data_steps(data_size: int, batch_size: int, epochs: float, min_steps: int, cap: int) -> int:
    """Steps of a data-sweep run on ``data_size`` examples: ``epochs`` passes over its subset,
    at least ``min_steps``, at most ``cap`` (``sweep.max_steps``):
    ``min(cap, max(min_steps, ceil(epochs · D / batch_size)))``. The run's decayed schedule
    spans exactly these steps, so every size trains to the end of its own decay."""
    return int(min(cap, max(min_steps, math.ceil(epochs * data_size / batch_size))))


class OptimizerSpec(BaseModel):
    """The optimizer every point of a sweep uses, at ``lr`` for ``base_batch_size`` examples."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["adamw", "sgd"] = Field(default="adamw", description="AdamW or plain SGD.")
    lr: PosFloat = Field(default=3e-3, description="Learning rate at base_batch_size.")
    base_batch_size: Annotated[int, Field(ge=1)] = Field(
        default=32, description="The batch size (examples) at which `lr` is the learning rate."
    )
    warmup_steps: Annotated[int, Field(ge=0, le=100_000)] = Field(
        default=10, description="Linear warm-up from 0 to the point's learning rate (steps)."
    )
    weight_decay: Annotated[float, Field(ge=0, le=1)] = 0.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.0, description="SGD momentum (ignored by AdamW)."
    )
    lr_rule: Literal["sqrt", "linear", "constant", "grid"] = Field(
        default="sqrt",
        description="Learning rate at batch B: sqrt: lr·√(B/B₀); linear: lr·B/B₀; constant: lr; "
        "grid: the sqrt rule times each of `lr_grid`, keeping the run that reaches the "
        "target in the fewest steps.",
    )
    lr_grid: Annotated[list[PosFloat], Field(min_length=1, max_length=5)] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0],
        description="Multipliers of the sqrt-rule learning rate tried by the grid rule. A data "
        "sweep always tunes on this grid: the multiplier with the best held-out loss on the "
        "smallest and on the largest subset, log-linearly interpolated in log D between them "
        "for the other subsets (the nearest grid run is used).",
    )


class SweepSettings(BaseModel):
    """What a sweep measures and how long each run may be."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["batch", "data", "branch"] = Field(
        description="Batch-size sweep, dataset-size sweep, or branched critical-batch sweep "
        "(from the request's `checkpoints`)."
    )
    target_loss: PosFloat | None = Field(
        default=None,
        description="Evaluation loss (mean per-token loss, nats) a batch-sweep run trains to; "
        "the loss a data sweep sizes the dataset for. Batch sweep: required.",
    )
    batch_sizes: Annotated[list[Annotated[int, Field(ge=2)]], Field(max_length=12)] | None = Field(
        default=None,
        description="Batch and branch sweep: powers of two, in examples (default 8 … 128).",
    )
    data_sizes: Annotated[list[Annotated[int, Field(ge=2)]], Field(max_length=12)] | None = Field(
        default=None,
        description="Data sweep: the first round's nested subset sizes D_i in examples "
        "(default: geometric, factor 2, from the training-data size down to 1/32 of it).",
    )
    epochs: Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)] = Field(
        default=10.0,
        description="Data sweep: passes over its subset each size trains for (steps = "
        "min(max_steps, max(min_steps, ceil(epochs·D/batch_size)))): steps grow with the size, "
        "and every run's decayed schedule spans its own steps.",
    )
    min_steps: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=200,
        description="Data sweep: the fewest steps of a run (small subsets; max_steps wins).",
    )
    max_rounds: Annotated[int, Field(ge=1, le=6)] = Field(
        default=3,
        description="Data sweep: the most rounds. After a round, while the fitted size for "
        "target_loss lies more than 1.5× outside the measured sizes (or every measured loss "
        "is on one side of the target), the next round halves below the smallest size or "
        "doubles above the largest (docs/budget.md#data-sweep).",
    )
    max_runs: Annotated[int, Field(ge=1, le=MAX_SWEEP_RUNS)] = Field(
        default=36,
        description="Data sweep: the most training runs (child jobs, every lr-grid multiplier "
        "counted) over all rounds; a round that does not fit is trimmed, or not queued.",
    )
    round_sizes: Annotated[int, Field(ge=1, le=6)] = Field(
        default=3,
        description="Data sweep: the most new sizes a later round adds (halvings or doublings, "
        "as many as reach the fitted size).",
    )
    batch_size: Annotated[int, Field(ge=2)] = Field(
        default=32, description="Data sweep: the batch size of every run (examples)."
    )
    max_steps: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=2000,
        description="Step cap of a run; a run that hits it is censored. Branch sweep: the most "
        "steps the smallest batch may need for the window (more: the sweep is refused). Data "
        f"sweep: default {DATA_MAX_STEPS:,}, the cap of the epoch rule (a size it cuts is "
        "named in the result).",
    )
    eval_every: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=5, description="Evaluate (and check the target / early stopping) every n steps."
    )
    patience: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=5,
        description="Unused since data sweeps run their decayed schedule to its end (kept so "
        "that older requests stay valid).",
    )
    schedule: Literal["cosine", "wsd"] = Field(
        default="wsd",
        description="Data sweep: the decayed learning-rate schedule of every run over its "
        "own steps: cosine to 0, or warmup-stable-decay with a 1−sqrt cooldown over the last "
        "cooldown_fraction of the steps (Hägele et al. 2024).",
    )
    cooldown_fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.2, description="Data sweep, wsd: the share of the steps spent cooling down."
    )
    init_seed: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Seed of the initialisation (no checkpoint) and the batch order."
    )
    window_tokens: Annotated[int, Field(ge=1, le=10**12)] | None = Field(
        default=None,
        description="Branch sweep (required): tokens every branch trains for from its "
        "checkpoint (a causal-LM example counts seq_len tokens, any other one 1). Rounded up "
        "so that each of the window_evals evaluations falls on a whole step of the largest "
        "batch; the result gives the window used.",
    )
    window_evals: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4,
        description="Branch sweep: evaluations of every branch, equally spaced in tokens over "
        "the window (all branches are evaluated at the same token counts).",
    )
    tolerance: PosFloat = Field(
        default=0.01,
        description="Branch sweep: ε, nats per token. A batch B is within tolerance when its "
        "evaluation loss is at most the smallest batch's + ε (at the compared points).",
    )
    compare: Literal["end", "window"] = Field(
        default="end",
        description="Branch sweep: compare the losses at the end of the window (end) or at "
        "every evaluation of the window (window: B must stay within ε throughout).",
    )
    moment_warmup_steps: Annotated[int, Field(ge=0, le=10_000)] = Field(
        default=20,
        description="Branch sweep: optimizer steps at learning rate 0 on the branch's own "
        "batches (batch size B, drawn apart from the window's examples) that fill the "
        "optimizer's moments before the window counts; the weights do not move. Not used for "
        "a checkpoint given with its optimizer state (`optimizer_states`); 0: a fresh optimizer. "
        "Other sweeps ignore it.",
    )
    checkpoint_steps: (
        Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_BRANCH_CHECKPOINTS)]
        | None
    ) = Field(
        default=None,
        description="Branch sweep: the training step of each checkpoint, in the order of "
        "`checkpoints` (default: the `step` the checkpoint file declares in its metadata, as "
        "`curvplan example` and save_checkpoint write it).",
    )

    @model_validator(mode="before")
    @classmethod
    def _data_step_cap(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") == "data" and "max_steps" not in data:
            return {**data, "max_steps": DATA_MAX_STEPS}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SweepSettings:
        if self.type != "branch" and self.checkpoint_steps is not None:
            raise ValueError("checkpoint_steps is for a branch sweep")
        if self.type == "branch" and self.window_tokens is None:
            raise ValueError(
                "window_tokens is required for a branch sweep: the tokens each branch "
                "trains for from its checkpoint"
            )
        if self.type in ("batch", "branch"):
            if self.type == "batch" and self.target_loss is None:
                raise ValueError("target_loss is required for a batch sweep")
            for b in self.batch_sizes or []:
                if b & (b - 1):
                    raise ValueError(f"batch_sizes must be powers of two, got {b}")
            need = MIN_POINTS[self.type]
            if self.batch_sizes is not None and len(set(self.batch_sizes)) < need:
                raise field_error(
                    type(self).__name__,
                    ("batch_sizes",),
                    f"a {self.type} sweep needs at least {need} distinct batch sizes to fit",
                    "too_few_points",
                )
        if self.data_sizes is not None and len(set(self.data_sizes)) < MIN_POINTS["data"]:
            raise field_error(
                type(self).__name__,
                ("data_sizes",),
                f"a data sweep needs at least {MIN_POINTS['data']} distinct sizes: the L(D) "
                "fit has three parameters",
                "too_few_points",
            )
        return self

    def window_problem(self, model: ModelSource | None) -> tuple[str, str] | None:
        """Why a branch sweep of ``model`` cannot run, as ``(field, message)`` (None when it
        can): a Hugging Face model has no known tokens per example yet, and a window longer
        than ``max_steps`` steps of the smallest batch is refused (the worker's rule too)."""
        if self.type != "branch" or self.window_tokens is None or model is None:
            return None  # without a model the request's own validators answer
        tpe = tokens_per_example(model)
        if tpe is None:
            return (
                "model",
                "a branch sweep needs a reference model spec for now; a Hugging Face model "
                "runs batch and data sweeps",
            )
        sizes = self.ladder()
        examples, _ = branch_window_examples(self.window_tokens, tpe, self.window_evals, sizes[-1])
        steps = examples // sizes[0]
        if steps <= self.max_steps:
            return None
        return (
            "window_tokens",
            f"the window of {examples} examples needs {steps} steps at batch {sizes[0]}, more "
            f"than max_steps ({self.max_steps}): shorten the window or raise max_steps",
        )

    def ladder(self) -> list[int]:
        """The batch sizes a batch or branch sweep runs: ``batch_sizes`` (default
        :data:`DEFAULT_BATCH_SIZES`), distinct and ascending."""
        return sorted(set(self.batch_sizes or DEFAULT_BATCH_SIZES))


Runner = Literal["builtin", "agent"]
"""Who trains a sweep's points: the service's workers (``builtin``, curvplan's own AdamW/SGD
loop on the uploaded data) or ``curvplan agent`` processes running the team's own training
command (``agent``; docs/budget.md#sweeps-with-your-own-trainer)."""

_BUILTIN_INPUTS = {
    "model": "the model",
    "train_data": "the training data",
    "eval_data": "the evaluation data",
}


class _SweepBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runner: Runner = Field(
        default="builtin",
        description="Who trains the points: `builtin` (the service's workers, on `model`, "
        "`train_data` and `eval_data`) or `agent` (`curvplan agent` processes of the project "
        "run your own training command for each point and report its eval losses; the "
        "service's workers never claim these points). An agent sweep takes no model or data: "
        "your command has its own.",
    )
    model: ModelSource | None = Field(
        default=None,
        validate_default=True,
        description="The model: a reference spec, or a Hugging Face causal LM's config "
        '(`{"source": "huggingface", "config": {…config.json…}}`), as an analyze job takes it. '
        "Required for the built-in runner.",
    )
    checkpoint: uuid.UUID | None = Field(
        default=None,
        description="Artifact id of the start checkpoint (an early one; for a Hugging Face "
        "model its parameters under their own names); null: a seeded initialisation "
        "(sweep.init_seed).",
    )
    train_data: uuid.UUID | None = Field(
        default=None,
        validate_default=True,
        description="Artifact id of the training data (dataset). Required for the built-in runner.",
    )
    eval_data: uuid.UUID | None = Field(
        default=None,
        validate_default=True,
        description="Artifact id of the held-out evaluation data (dataset): the target loss "
        "and early stopping are measured on it. Required for the built-in runner.",
    )
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)

    @field_validator("model", "train_data", "eval_data", "checkpoint")
    @classmethod
    def _inputs_of_the_runner(cls, value: object, info: ValidationInfo) -> object:
        runner = info.data.get("runner", "builtin")
        name = str(info.field_name)
        if runner == "builtin" and value is None and name in _BUILTIN_INPUTS:
            raise ValueError(
                f"Field required: {_BUILTIN_INPUTS[name]} the service's workers train on "
                '(or submit the sweep with "runner": "agent" to train with your own command)'
            )
        if runner == "agent" and value is not None:
            raise ValueError(
                f"an agent sweep (runner: agent) trains with your own command on its own model "
                f"and data; drop {name}"
            )
        return value


class PointSettings(BaseModel):
    """One training run of a sweep (what a ``sweep_point`` job does)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["batch", "data", "branch"]
    batch_size: Annotated[int, Field(ge=2)]
    lr: PosFloat = Field(description="This run's peak learning rate (after the rule).")
    lr_multiplier: PosFloat = 1.0
    data_size: Annotated[int, Field(ge=2)] | None = Field(
        default=None, description="Data sweep: train on the first data_size examples."
    )
    target_loss: PosFloat | None = None
    max_steps: Annotated[int, Field(ge=1, le=1_000_000)]
    eval_every: Annotated[int, Field(ge=1)]
    patience: Annotated[int, Field(ge=1)] = 5
    seed: Annotated[int, Field(ge=0)] = 0
    schedule: Literal["constant", "cosine", "wsd"] = Field(
        default="constant",
        description="Learning rate after warm-up: constant (batch sweep: train to the target; "
        "branch sweep: the window), or decayed over max_steps (data sweep).",
    )
    cooldown_fraction: Annotated[float, Field(gt=0, le=1)] = 0.2
    moment_warmup_steps: Annotated[int, Field(ge=0, le=10_000)] = Field(
        default=0,
        description="Steps at learning rate 0 that fill the optimizer's moments on this run's "
        "batch size before it counts (branch sweep without an optimizer state).",
    )
    checkpoint_step: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Branch sweep: the training step of the checkpoint the branch starts from "
        "(for the warm-up schedule; the run does not use it).",
    )
    round: Annotated[int, Field(ge=1, le=6)] = Field(
        default=1, description="Data sweep: the round that queued this run."
    )


class PointResult(BaseModel):
    """What one run measured."""

    batch_size: int = Field(description="Examples per step.")
    batch_size_tokens: float | None = Field(description="Loss terms (tokens) per step.")
    lr: float
    lr_multiplier: float = 1.0
    data_size: int | None = None
    reached_target: bool
    censored: bool = Field(description="Hit the step cap before the target: not in the fit.")
    steps: float = Field(
        description="Steps to the target, interpolated between evaluations (or run, when "
        "censored; data sweep: the best evaluation's step)."
    )
    examples: float = Field(description="steps × batch_size: examples processed.")
    best_eval_loss: float
    best_step: int
    eval_steps: list[int]
    eval_losses: list[float]
    two_batch: TwoBatchWindows | None = None
    optimizer_start: str | None = Field(
        default=None,
        description="How the optimizer's state started: fresh, warmed at learning rate 0, or "
        "the checkpoint's own moments (an optimizer-state artifact).",
    )
    seconds: float


class TwoBatchWindows(BaseModel):
    """Squared norms of training gradients at two batch sizes, per evaluation window.

    At every step the batch of b_big examples is split into two halves of b_small: their
    gradients g₁, g₂ give |G_small|² = (|g₁|²+|g₂|²)/2 and the step's gradient
    |G_big|² = |(g₁+g₂)/2|² (McCandlish et al. 2018, App. A)."""

    b_small: int
    b_big: int
    window_end_steps: list[int]
    window_eval_losses: list[float] = Field(description="Eval loss at the window's start.")
    grad_sq_norm_small: list[list[float]]
    grad_sq_norm_big: list[list[float]]


PointResult.model_rebuild()


class SweepPointOut(BaseModel):
    """A point of a finished sweep: its child job, outcome, and whether the fit used it."""

    job_id: str
    name: str | None
    status: str
    used_in_fit: bool
    excluded_reason: str | None = Field(
        default=None, description="Why the fit left it out (censored, failed, worse lr, …)."
    )
    error_type: str | None = None
    result: PointResult | None = None


class NoiseScaleAtLoss(BaseModel):
    """The two-batch B_simple of the training gradients of the runs, at a band of eval loss."""

    eval_loss_low: float
    eval_loss_high: float
    value: float | None = Field(description="B_simple = tr Σ / |G|² in examples (null: undefined).")
    ci: tuple[float | None, float | None] | None = None
    value_tokens: float | None = None
    n_steps: int
    undefined_reason: str | None = None
    formula: str


class BatchSweepFit(BaseModel):
    """S = S_min(1 + B_crit/B), i.e. S/S_min − 1 = (E/E_min − 1)⁻¹ (McCandlish et al. 2018,
    eq. 2.11), fitted by the planner to the uncensored points (batch sizes in examples)."""

    fit: BCrit | NotComputed
    b_crit_tokens: float | None = Field(default=None, description="B_crit in tokens.")
    steps_at: list[StepsPoint] = Field(
        default_factory=list, description="The (batch size, steps) table the fit used."
    )
    n_points: int


class DataSweepFit(BaseModel):
    """L(D) = E + A·D^(−β) fitted by the planner to the best held-out loss of each subset
    size (D in examples); the size for the target loss is the result's
    ``recommendation.budget.data`` (one number per question)."""

    fit: ScalingSection | NotComputed
    loss_vs_data: list[LossPoint] = Field(default_factory=list)
    n_points: int
    schedule: str | None = Field(
        default=None, description="The training protocol of every subset, in words."
    )
    lr_rule: str | None = Field(
        default=None, description="How the learning rate of each subset was chosen, in words."
    )
    lr_multipliers: dict[str, float] = Field(
        default_factory=dict,
        description="The learning-rate multiplier of the run used for each subset size.",
    )
    steps_rule: str | None = Field(
        default=None, description="How many steps each size trained, in words (the rule)."
    )
    steps_per_size: dict[str, int] = Field(
        default_factory=dict, description="The steps each subset size trained for."
    )
    capped_sizes: list[int] = Field(
        default_factory=list,
        description="Sizes whose epoch rule asked for more than sweep.max_steps: trained to the "
        "cap (fewer epochs), their L(D) may sit above the converged value.",
    )
    rounds: list[DataSweepRound] = Field(
        default_factory=list, description="The rounds run, in order."
    )
    bracketed: bool | None = Field(
        default=None,
        description="The fitted size for the target lies within 1.5× of the measured sizes "
        "(null: no target or no finite size).",
    )
    next_round_sizes: list[int] | None = Field(
        default=None,
        description="Sizes a next round would train (the sweep stopped before them: the "
        "round or run cap, or the training data's size); null: none needed.",
    )


class DataSweepRound(BaseModel):
    """One round of a data sweep: its new sizes and why it was queued."""

    round: int
    data_sizes: list[int]
    runs: int = Field(description="Training runs of the round (sizes × lr-grid multipliers).")
    reason: str


DataSweepFit.model_rebuild()


class BranchCurve(BaseModel):
    """One branch's loss against the tokens it trained on since its checkpoint."""

    name: str | None = Field(default=None, description="The point's name (its child job).")
    batch_size: int = Field(description="Examples per step.")
    lr: float
    lr_multiplier: float = 1.0
    tokens: list[float] = Field(
        description="Tokens processed since the checkpoint at each evaluation (0 first)."
    )
    losses: list[float] = Field(description="Evaluation loss at each of `tokens` (nats).")
    excess: float | None = Field(
        description="Loss above the smallest batch's at the compared points (the largest "
        "excess over them; nats per token; 0 for the smallest batch)."
    )
    within_tolerance: bool | None = Field(
        description="Its loss kept within ε of the smallest batch's (null: not judged, the "
        "checkpoint's CBS is not measured)."
    )
    reference_examples: float | None = Field(
        default=None,
        description="e_B: examples the smallest batch needed to reach this branch's loss at "
        "the end of the window (its curve interpolated linearly; clipped to [0, window]).",
    )
    reference_reach: ReferenceReach | None = Field(
        default=None,
        description="inside: the smallest batch reached it within the window; kept_up: not "
        "before the window's end (e_B ≥ window); not_reached: the branch ended at or above "
        "the checkpoint's loss (e_B = 0).",
    )


class BranchCheckpoint(BaseModel):
    """The branches from one checkpoint and the critical batch size they give."""

    checkpoint: str = Field(description="The checkpoint's artifact id.")
    step: int | None = Field(description="Its training step (null: not declared).")
    loss: float | None = Field(description="Evaluation loss at the checkpoint (nats).")
    reference_batch: int = Field(description="The smallest swept batch: the reference curve.")
    critical_batch: int | None = Field(
        description="CBS, examples (null: the reference branch failed, or status not_measured)."
    )
    critical_batch_tokens: float | None = None
    status: BranchPointStatus | None = Field(
        default=None,
        description="As in the planner's BranchedBatchPoint; not_measured: the reference "
        "branch made no progress over the window (the notes give its losses).",
    )
    next_batch: int | None = Field(
        default=None, description="The next swept batch above the CBS (its bracket's end)."
    )
    efficiency: BranchedBatchEstimate | None = Field(
        default=None,
        description="B_c of the token-efficiency fit E/e_B = (B_c + B)/(B_c + B₀) (McCandlish "
        "et al. 2018, eq. 2.11), beside the ladder CBS.",
    )
    crossing: BranchedBatchEstimate | None = Field(
        default=None, description="The ε-crossing interpolated in log B, beside the ladder CBS."
    )
    curves: list[BranchCurve] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class BranchResult(BaseModel):
    """A branch sweep's critical batch size per checkpoint and the warm-up schedule they give
    (Merrill et al. 2025, arXiv 2505.23971; docs/budget.md#branch-sweep)."""

    rule: str = Field(description="The CBS rule with its tolerance and comparison, in words.")
    formula: str
    tolerance: float = Field(description="ε, nats per token.")
    compare: Literal["end", "window"]
    window_tokens: float = Field(description="Tokens each branch trained (after rounding).")
    window_examples: int = Field(description="Examples each branch trained.")
    batch_sizes: list[int]
    lr_rule: str = Field(description="How each branch's learning rate was set, in words.")
    checkpoints: list[BranchCheckpoint]
    warmup_schedule: list[BatchWarmupStage] = Field(
        default_factory=list,
        description="From which step on to use which batch: at each checkpoint's step the "
        "batch of the leading estimate (the ladder CBS, or the power of two nearest the "
        "ε-crossing or the efficiency fit: BRANCH_LEAD), in step order, consecutive equal "
        "batches merged.",
    )
    schedule_note: str | None = None
    examples_processed: int = Field(description="Examples all branches trained on (the cost).")
    tokens_processed: float | None = Field(description="… in tokens.")


class SweepResult(BaseModel):
    """What a finished sweep job returns under ``result.sweep``."""

    type: Literal["batch", "data", "branch"]
    target_loss: float | None
    optimizer: OptimizerSpec
    tokens_per_example: float | None
    points: list[SweepPointOut]
    points_total: int
    points_used: int
    failed_points: list[str] = Field(
        default_factory=list, description="Names of the points whose job failed."
    )
    batch: BatchSweepFit | None = None
    b_simple_at_target: NoiseScaleAtLoss | None = None
    b_simple_trend: list[NoiseScaleAtLoss] = Field(default_factory=list)
    data: DataSweepFit | None = None
    branch: BranchResult | None = None
    notes: list[str] = Field(default_factory=list)
