"""The budget: one place that says how much data and which batch size (docs/budget.md).

What leads, in order:

* data — the data-sweep size for the target loss, L(D) = E + A·D^(−β) solved for D
  (Kaplan et al. 2020 eq. 1.4 form), when a data sweep (or loss_vs_data pilot runs) exists;
  "unreachable" only when the target is below E's lower confidence end. Otherwise
  `not_available`, with the `curvplan sweep --type data` command and its cost. The
  evaluation-set size k = z²σ²_eff/ε² (docs/numbers.md) and Petrov et al. (2025)'s k*(ε) are
  shown beside it, never as the training-set size.
* batch — for a target run of targets.target_tokens, B_crit(D) = c·D^γ fitted to batch sweeps
  at several token counts (Zhang et al. 2024; Bergsma et al. 2025); else B_crit from a batch
  sweep (S = S_min(1 + B_crit/B), McCandlish et al. 2018 eq. 2.11); else the noise-scale
  trend over intermediate checkpoints evaluated at the target loss (B_crit ≈ B_noise,
  McCandlish et al. 2018 §2.2); else not available, with the reason.
  A single checkpoint's noise scale is never used as a constant for the whole run.
* learning rate — 2/λ_max of the whole-model Hessian, the gradient-descent sharpness
  threshold (Cohen et al. 2021): not a divergence limit, nor a limit for SGD or Adam.
"""

from __future__ import annotations

import itertools
import math
import shlex
from dataclasses import dataclass
from typing import Literal, TypedDict

import numpy as np
from scipy import stats

from curvplan.types.planner import (
    DEFAULT_TOLERANCE_RATIO,
    BatchSizeSection,
    BCrit,
    Budget,
    BudgetBatch,
    BudgetData,
    BudgetDefaults,
    BudgetLearningRate,
    CurvatureSection,
    DataSweepNextStep,
    EvaluationSetSize,
    Interval,
    LandscapeStabilisation,
    LossPoint,
    Measurements,
    NoiseTrendPoint,
    NotComputed,
    SampleSizeSection,
    SampleSizeValue,
    ScalingSection,
    Targets,
)
from curvplan.types.sweep import OptimizerSpec, SweepSettings, data_steps
from curvplan_core import cost_model
from curvplan_core.planner import formulas
from curvplan_core.planner.batch_scaling_section import batch_from_scaling_law
from curvplan_core.planner.batch_section import finite_or_none
from curvplan_core.planner.branched_batch import branch_budget_batch
from curvplan_core.planner.critical_batch import nearest_power_of_two
from curvplan_core.planner.data_rounds import (
    EXTRAPOLATION_LIMIT,
    NextRound,
    extrapolation_side,
    next_round,
)
from curvplan_core.planner.gradient_noise import NOISE_SCALE_FIELDS, TREND_SCALE_ORDER
from curvplan_core.planner.scaling_section import DataForTarget

TARGET_LOSS_RULE = (
    "without targets.target_loss the target is the mean loss at w* (the loss the analysed "
    "checkpoint reached): the budget then answers 'how much data and which batch size to get "
    "back to this loss'"
)
STEPS_FORMULA = formulas.BUDGET_EXPECTED_STEPS
TREND_FORMULA = formulas.BUDGET_NOISE_TREND


def default_targets(measurements: Measurements, targets: Targets) -> tuple[Targets, BudgetDefaults]:
    """Targets with the documented defaults filled in, and what was assumed."""
    losses = measurements.per_sample_losses
    mean_loss = float(np.mean(losses)) if losses else None
    update: dict[str, object] = {}
    if targets.tolerances is None and mean_loss is not None and mean_loss > 0:
        update["tolerances"] = [DEFAULT_TOLERANCE_RATIO * mean_loss]
    if targets.target_loss is None and mean_loss is not None:
        update["target_loss"] = mean_loss
    effective = targets.model_copy(update=update) if update else targets
    defaults = BudgetDefaults(
        tolerances_given=targets.tolerances is not None,
        tolerance_ratio=DEFAULT_TOLERANCE_RATIO,
        mean_loss_at_w_star=mean_loss,
        tolerances=list(effective.tolerances or []),
        target_loss_given=targets.target_loss is not None,
        target_loss=effective.target_loss,
        target_loss_rule=TARGET_LOSS_RULE,
    )
    return effective, defaults


def _available(measurements: Measurements, targets: Targets) -> int | None:
    value = getattr(targets, "available_samples", None)
    return value if value is not None else measurements.available_samples


def _tokens_per_example(measurements: Measurements) -> float | None:
    return getattr(measurements, "tokens_per_example", None)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


# The next step without a data sweep: `curvplan sweep --type data` with the CLI's defaults
# (curvplan/commands/client.py `sweep`; SweepSettings and OptimizerSpec in
# curvplan/types/sweep.py, whose defaults these are).
SWEEP_BATCH_SIZE = 32
SWEEP_DEFAULT_RUNS = 6  # the service's default sizes: training-data size down to 1/32 of it
SWEEP_SIZE_FACTOR = 2
_SWEEP = SweepSettings(type="data")
_OPTIMIZER = OptimizerSpec()


def sweep_data_sizes(available: int | None, batch_size: int = SWEEP_BATCH_SIZE) -> list[int] | None:
    """Nested subset sizes for a data sweep: the available data and halvings of it, at least
    3 and at most SWEEP_DEFAULT_RUNS sizes, none below the batch size (None: unknown size)."""
    if available is None:
        return None
    sizes = [available // SWEEP_SIZE_FACTOR**k for k in range(SWEEP_DEFAULT_RUNS)]
    sizes = sorted({d for d in sizes if d >= max(2, batch_size)})
    return sizes if len(sizes) >= 3 else None


def sweep_steps_rule(settings: SweepSettings) -> str:
    """The data sweep's steps per size, in words (its result states the same rule)."""
    return (
        f"steps = min({settings.max_steps:,}, max({settings.min_steps:,}, "
        f"ceil({settings.epochs:g} epochs × D / batch {settings.batch_size}))): each size "
        "trains its own decayed schedule to the end"
    )


@dataclass(frozen=True)
class CommandFlags:
    """The flags a next-step command repeats from how the analysis was submitted: the model
    (a reference spec, or a Hugging Face directory or Trainer run folder) and the data files.
    A plan job (no model) gets the reference-spec placeholders."""

    sweep_model: str = "--spec model.json"
    analyze_model: str = "--spec model.json --checkpoint checkpoint.safetensors"
    train: str = "train.safetensors"
    eval: str = "eval.safetensors"

    @classmethod
    def huggingface(cls, eval_file: str | None = None) -> CommandFlags:
        """A Hugging Face model: `--model MODEL_DIR` (the save_pretrained directory or Trainer
        output folder the analysis was given); the evaluation sample by its uploaded name."""
        return cls(
            sweep_model="--model MODEL_DIR",
            analyze_model="--model MODEL_DIR",
            eval=shlex.quote(eval_file) if eval_file else cls.eval,
        )

    @classmethod
    def reference(cls, eval_file: str | None = None) -> CommandFlags:
        """A reference model spec: `--spec model.json`, the evaluation sample by its name."""
        return cls(eval=shlex.quote(eval_file) if eval_file else cls.eval)

    def applied(self, step: DataSweepNextStep | None) -> DataSweepNextStep | None:
        """``step`` with the reference placeholders of its commands replaced by these flags
        (:func:`data_sweep_next_step` writes the placeholders, whichever round it is)."""
        if step is None or self == DEFAULT_FLAGS:
            return step
        default = DEFAULT_FLAGS
        prefix = f"{default.sweep_model} --train {default.train} --eval {default.eval}"
        command = step.command.replace(
            prefix, f"{self.sweep_model} --train {self.train} --eval {self.eval}", 1
        )
        cost = step.estimated_cost.replace(
            "`curvplan analyze … ",
            f"`curvplan analyze {self.analyze_model} --data {self.eval} ",
        )
        return step.model_copy(update={"command": command, "estimated_cost": cost})


DEFAULT_FLAGS = CommandFlags()


def data_sweep_next_step(
    target_loss: float | None,
    available: int | None,
    tokens: float | None,
    *,
    sizes: list[int] | None = None,
    model_parameters: int | None = None,
    next_round: str | None = None,
    new_sizes: list[int] | None = None,
) -> DataSweepNextStep:
    """The `curvplan sweep --type data …` command that gets a data-sweep L(D) (or, with
    ``sizes``, its next round), and what its first round costs: every size at every lr-grid
    multiplier, each run the steps of the epoch rule (:func:`curvplan.types.sweep.data_steps`),
    and the training time from the cost model's FLOPs prior (``cost_model.training_seconds``)."""
    if sizes is None:
        sizes = sweep_data_sizes(available)
    grid = len(_OPTIMIZER.lr_grid)
    settings = _SWEEP
    parts = [
        f"curvplan sweep --type data {DEFAULT_FLAGS.sweep_model} --train {DEFAULT_FLAGS.train} "
        f"--eval {DEFAULT_FLAGS.eval}"
    ]
    if target_loss is not None:
        parts.append(f"--target-loss {target_loss:.6g}")
    if sizes is not None:
        parts.append("--data-sizes " + ",".join(str(d) for d in sizes))
    parts.append(f"--batch-size {SWEEP_BATCH_SIZE} --wait")
    if sizes is not None:
        steps = [
            data_steps(d, SWEEP_BATCH_SIZE, settings.epochs, settings.min_steps, settings.max_steps)
            for d in sizes
        ]
        runs = len(sizes) * grid
    else:  # the service picks the sizes from the training data's size: bound by the cap
        steps = [settings.max_steps] * SWEEP_DEFAULT_RUNS
        runs = SWEEP_DEFAULT_RUNS * grid
    examples = grid * sum(steps) * SWEEP_BATCH_SIZE
    seconds = (
        None
        if model_parameters is None
        else cost_model.training_seconds(model_parameters, tokens or 1.0, examples)
    )
    bound = "" if sizes is not None else "at most "
    later = (
        f"if the first round does not bracket the target, later rounds halve below or double "
        f"above it: at most {settings.max_rounds} rounds and {settings.max_runs} runs in all "
        "(--max-rounds, --max-runs)"
    )
    cost = (
        f"{runs} training runs (one child job each: {runs // grid} sizes × {grid} lr-grid "
        f"multipliers) of {sweep_steps_rule(settings)}; {bound}{examples:,} examples processed"
        + ("" if tokens is None else f" ({examples * tokens:,.0f} tokens)")
        + (
            f", {cost_model.format_duration(seconds)} of training on one worker "
            "(cost-model FLOPs prior; evaluations not included)"
            if seconds is not None
            else "; time unknown (model size not given)"
        )
        + f"; {later}; "
        + (
            "then `curvplan analyze … --sweep <sweep job id>` puts its L(D) in budget.data"
            if next_round is None or new_sizes is None
            else "then analyze with both sweeps: `curvplan analyze … --sweep OLD --sweep NEW` "
            "(OLD: the sweep(s) this analysis used; their L(D) tables are combined, a size "
            "both measured averaged)"
        )
    )
    if next_round is not None:
        cost = f"next round ({next_round}): {cost}"
    return DataSweepNextStep(
        command=" ".join(parts),
        data_sizes=sizes,
        next_round_sizes=new_sizes,
        training_runs=runs,
        lr_grid_runs=grid,
        batch_size=SWEEP_BATCH_SIZE,
        max_steps_per_run=max(steps),
        steps_rule=sweep_steps_rule(settings),
        max_examples_processed=examples,
        max_tokens_processed=None if tokens is None else examples * tokens,
        estimated_seconds=seconds,
        later_rounds=later,
        estimated_cost=cost,
    )


ROUND_COMMAND_SIZES = 4
"""A next round's command trains at least this many sizes (a sweep's own fit needs 4), all of
them sizes not measured yet."""


def round_command_sizes(new: list[int], measured: list[float], side: str) -> list[int]:
    """The ``--data-sizes`` of a next round's command: its new sizes and, while fewer than
    ROUND_COMMAND_SIZES, the geometric midpoint of the widest ratio gap between them and the
    nearest measured size (new sizes too, between the round's and the measured range: the
    sweep fits on its own and no measured size is trained again, since an analysis given both
    sweeps combines their L(D), docs/budget.md#data-sweep). Only when the gaps are too narrow
    for distinct whole sizes are the nearest measured sizes added instead."""
    ordered = sorted({int(d) for d in measured})
    edge = ordered[0] if side == "below" else ordered[-1]
    chain = sorted(set(new) | {edge})
    while len(chain) - 1 < ROUND_COMMAND_SIZES:
        gaps = sorted(
            ((b / a, a, b) for a, b in itertools.pairwise(chain) if b - a > 1), reverse=True
        )
        if not gaps:
            break
        _, a, b = gaps[0]
        middle = round(math.sqrt(a * b))  # strictly between a and b when b − a ≥ 2
        if middle in chain:
            break
        chain = sorted({*chain, middle})
    sizes = [d for d in chain if d != edge]
    near = ordered if side == "below" else ordered[::-1]
    for d in near[: max(0, ROUND_COMMAND_SIZES - len(sizes))]:
        sizes.append(d)  # gaps too narrow: measured sizes (the analysis averages repeats)
    return sorted(set(sizes))


def _next_round_step(
    further: NextRound | None,
    sizes: list[float],
    target_loss: float | None,
    available: int | None,
    tokens: float | None,
    params: int | None,
) -> DataSweepNextStep:
    """next_step: the next round's command when the measured sizes call for one, else the
    first-round command."""
    if further is None or not further.sizes:
        return data_sweep_next_step(
            target_loss,
            available,
            tokens,
            model_parameters=params,
            next_round=None if further is None else further.reason,
        )
    return data_sweep_next_step(
        target_loss,
        available,
        tokens,
        sizes=round_command_sizes(further.sizes, sizes, further.side),
        model_parameters=params,
        next_round=further.reason,
        new_sizes=further.sizes,
    )


def _evaluation_set_size(
    sample_size: SampleSizeSection | object, confidence: float
) -> EvaluationSetSize | None:
    if not isinstance(sample_size, SampleSizeSection) or not sample_size.per_tolerance:
        return None
    first = sample_size.per_tolerance[0]
    value = first.evaluation_set_size
    if not isinstance(value, SampleSizeValue) or value.k is None:
        return None
    corr = sample_size.loss_correlation
    method = corr.variance_method if corr is not None else "iid"
    eps = first.tolerance
    drawn = (
        "drawn as whole groups like the measured ones"
        if method == "cluster_robust"
        else "drawn independently like the measured ones"
    )
    guarantee = (
        f"An evaluation set of {value.k:,} examples {drawn} measures the average loss at these "
        f"weights to within ±{eps:.3g} nats of its population value with probability ≈ "
        f"{confidence:.0%}. It is an evaluation-set size: it does not say how much training "
        "data reaches a loss."
    )
    if corr is not None and corr.correlated and method == "iid":
        guarantee += (
            " The measured losses look correlated (consecutive windows): with correlated "
            "draws this size under-covers; give per_sample_groups for a cluster-robust one."
        )
    return EvaluationSetSize(
        examples=value.k,
        ci=value.ci,
        tolerance=eps,
        confidence=confidence,
        variance_method=method,
        design_effect=None if corr is None else corr.design_effect,
        correlated=None if corr is None else corr.correlated,
        guarantee=guarantee,
        formula=value.formula,
    )


_TargetStatus = Literal["reachable", "uncertain", "unreachable"]


def _target_status(scaling: ScalingSection) -> _TargetStatus | None:
    """reachable / uncertain / unreachable (docs/budget.md): unreachable only below the lower
    confidence end of E, not below its point estimate."""
    target = scaling.target_loss
    if target is None:
        return None
    if target > scaling.E:
        return "reachable"
    lower = scaling.E_ci[0] if scaling.E_ci is not None else None
    if lower is not None and target < lower:
        return "unreachable"
    return "uncertain"


class _SweepFields(TypedDict, total=False):
    """budget.data's fields from the data sweep (its fit, its measured sizes)."""

    target_loss: float | None
    target_status: _TargetStatus | None
    irreducible_loss: float | None
    irreducible_loss_ci: Interval | None
    measured_sizes: tuple[float, float] | None


class _Beside(TypedDict):
    """budget.data's fields shown beside its answer, whatever leads it."""

    tolerance: float | None
    evaluation_set_size: EvaluationSetSize | None
    landscape_stabilisation: LandscapeStabilisation | None
    available_samples: int | None


class _BlockThreshold(TypedDict, total=False):
    """budget.learning_rate's fields from the largest block."""

    lambda_max_block: float
    lambda_max_block_name: str
    block_threshold: float


def build_data(
    measurements: Measurements,
    targets: Targets,
    sample_size: SampleSizeSection | object,
    scaling: ScalingSection | object,
    solved: DataForTarget,
    flags: CommandFlags | None = None,
) -> tuple[BudgetData, list[str]]:
    """budget.data: the data sweep's L(D) solved at the target loss (``solved``) leads;
    nothing else does (docs/budget.md#data). ``flags``: the next step's commands repeat how
    the analysis was submitted (default: the reference-spec placeholders)."""
    warnings: list[str] = []
    available = _available(measurements, targets)
    tokens = _tokens_per_example(measurements)
    conf = targets.confidence
    common = _data_beside(sample_size, available, conf)
    sweep = scaling if isinstance(scaling, ScalingSection) else None
    status = _target_status(sweep) if sweep is not None else None
    sweep_fields: _SweepFields = {"target_loss": targets.target_loss}
    if sweep is not None:
        sweep_fields = {
            "target_loss": sweep.target_loss,
            "target_status": status,
            "irreducible_loss": sweep.E,
            "irreducible_loss_ci": sweep.E_ci,
        }
    params = getattr(measurements, "model_parameters", None)
    points = measurements.loss_vs_data or []
    sizes = [p.n_samples for p in points]
    if sizes:
        sweep_fields["measured_sizes"] = (min(sizes), max(sizes))
    n = solved.examples
    if sweep is not None and status == "reachable" and n is not None:
        data = _data_from_sweep(sweep, solved, tokens, conf, sweep_fields, common)
        side = extrapolation_side(n, sizes) if sizes else None
        if side is not None:
            _mark_extrapolated(data, side, sizes, points, available, tokens, params, warnings)
        _assess_available(data, warnings)
        if flags is not None and data.next_step is not None:
            data = data.model_copy(update={"next_step": flags.applied(data.next_step)})
        return data, warnings
    further = (
        next_round(
            sizes,
            [p.loss for p in points],
            targets.target_loss,
            None,
            min_size=SWEEP_BATCH_SIZE,
            max_size=available,
        )
        if sizes
        else None
    )
    if further is not None and not further.sizes:
        further = None  # nothing to train toward it: the first-round command instead
    next_step: DataSweepNextStep | None = _next_round_step(
        further, sizes, targets.target_loss, available, tokens, params
    )
    if flags is not None:
        next_step = flags.applied(next_step)
    reason, guarantee = _why_no_data_size(sweep, status, scaling, conf, warnings)
    return (
        BudgetData(
            recommended_examples=None,
            source="not_available",
            criterion="nothing predictive to lead with: the evaluation-set size and k*(ε) are "
            "shown beside, but neither is a training-set size",
            guarantee=guarantee,
            reason=reason,
            next_step=next_step,
            available_note=None
            if available is None
            else f"you have {available:,} examples; without a data sweep there is no "
            "training-set size to compare them with",
            **sweep_fields,
            **common,
        ),
        warnings,
    )


def _data_beside(
    sample_size: SampleSizeSection | object, available: int | None, conf: float
) -> _Beside:
    """Step 1: what budget.data shows beside its answer, whatever leads it: the first
    tolerance, the evaluation-set size, landscape stabilisation k*(ε), the examples you have."""
    first = None
    if isinstance(sample_size, SampleSizeSection) and sample_size.per_tolerance:
        first = sample_size.per_tolerance[0]
    evaluation = _evaluation_set_size(sample_size, conf)
    stab = None
    if first is not None and isinstance(first.empirical, SampleSizeValue):
        stab = LandscapeStabilisation(
            examples=first.empirical.k,
            ci=first.empirical.ci,
            tolerance=first.tolerance,
            label="landscape stabilisation k*(ε) (Petrov et al. 2025): beyond it one more "
            "example changes the average loss by about ε or less; it is neither the accuracy "
            "of the loss (evaluation_set_size) nor a prediction of training",
        )
    return {
        "tolerance": None if first is None else first.tolerance,
        "evaluation_set_size": evaluation,
        "landscape_stabilisation": stab,
        "available_samples": available,
    }


def _data_from_sweep(
    sweep: ScalingSection,
    solved: DataForTarget,
    tokens: float | None,
    conf: float,
    sweep_fields: _SweepFields,
    beside: _Beside,
) -> BudgetData:
    """Step 2: the answer when the sweep's L(D) reaches the target loss: the size it solves
    for (docs/budget.md#data)."""
    n = solved.examples
    assert n is not None and sweep.target_loss is not None
    ci = solved.ci
    rec = math.ceil(n) if math.isfinite(n) else None
    return BudgetData(
        recommended_examples=rec,
        recommended_examples_ci=ci,
        recommended_tokens=None if tokens is None or rec is None else rec * tokens,
        source="data_sweep",
        criterion="data sweep: the size at which the fitted L(D) = E + A·D^(−β) reaches the "
        f"target loss ({formulas.formula_id(formulas.BUDGET_DATA_SWEEP)}); it is the only "
        "number here that predicts how low training on that much data gets the loss",
        guarantee=f"Training on about {_fmt(n)} examples is predicted to reach a held-out "
        f"loss of {sweep.target_loss:.4g} (nats per token); the {conf:.0%} interval of the "
        "size reflects the fit's uncertainty. It holds for the same model, optimizer, "
        "schedule and data distribution as the sweep, inside the swept sizes (beyond them "
        "it extrapolates the power law).",
        **sweep_fields,
        **beside,
    )


def _mark_extrapolated(
    data: BudgetData,
    side: str,
    sizes: list[float],
    points: list[LossPoint],
    available: int | None,
    tokens: float | None,
    params: int | None,
    warnings: list[str],
) -> None:
    """The fitted size lies more than 1.5× outside the measured sizes: shown as
    ``extrapolated``, its interval open on that side, a warning, and the next round's sizes in
    next_step (docs/budget.md#data-sweep)."""
    n = data.recommended_examples
    assert n is not None
    lo, hi = min(sizes), max(sizes)
    ci = data.recommended_examples_ci
    low, high = ci if ci is not None else (None, None)
    data.recommended_examples_ci = (None, high) if side == "below" else (low, None)
    data.source = "extrapolated"
    edge = f"{EXTRAPOLATION_LIMIT:g}× " + (
        f"below the smallest measured size {lo:,.0f}"
        if side == "below"
        else f"above the largest measured size {hi:,.0f}"
    )
    further = next_round(
        sizes,
        [p.loss for p in points],
        data.target_loss,
        float(n),
        min_size=SWEEP_BATCH_SIZE,
        max_size=available,
    )
    round_sizes = further.sizes if further is not None and further.sizes else None
    if further is not None and round_sizes is None:
        data.reason = further.reason
    data.criterion = (
        f"extrapolated: the fitted L(D) reaches the target at {n:,} examples, more than {edge}; "
        "a power law is not evidence that far outside its data"
    )
    data.guarantee = (
        f"None yet: {n:,} examples is the fit's extrapolation, not a measured answer; the "
        "interval is open on the extrapolated side. Run the next round (next_step) to bracket "
        "the target."
    )
    data.next_step = (
        None  # nothing trainable toward it: `reason` says why (more data, or no smaller subset)
        if round_sizes is None
        else _next_round_step(further, sizes, data.target_loss, available, tokens, params)
    )
    warnings.append(
        f"data: the size for the target ({n:,} examples) is extrapolated, more than {edge}; "
        + (
            f"the next round trains {', '.join(f'{d:,}' for d in round_sizes)}"
            if round_sizes is not None
            else (further.reason if further is not None else "no next round can be trained")
        )
    )


def _why_no_data_size(
    sweep: ScalingSection | None,
    status: str | None,
    scaling: ScalingSection | object,
    conf: float,
    warnings: list[str],
) -> tuple[str, str]:
    """Step 3: why no training-set size leads budget.data; (reason, guarantee)."""
    if sweep is not None and status == "unreachable":
        assert sweep.target_loss is not None and sweep.E_ci is not None
        reason = (
            f"the target loss {sweep.target_loss:.4g} is below the lower {conf:.0%} confidence "
            f"end {sweep.E_ci[0]:.4g} of the fitted irreducible loss E = {sweep.E:.4g}: more "
            "data alone does not reach it with this model and training setup"
        )
        warnings.append(f"data: {reason}")
        return reason, "unreachable: no training-set size reaches the target loss"
    if sweep is not None and status == "uncertain":
        lo = "n/a" if sweep.E_ci is None else f"{sweep.E_ci[0]:.4g}"
        assert sweep.target_loss is not None
        reason = (
            f"the target loss {sweep.target_loss:.4g} lies inside the interval of the fitted "
            f"irreducible loss E = {sweep.E:.4g} (lower end {lo}): the sweep cannot tell whether "
            "it is reachable; a data sweep that reaches larger sizes (or a higher target) "
            "settles it"
        )
        warnings.append(f"data: {reason}")
        return reason, "no training-set size: the target may or may not be reachable"
    if sweep is not None and sweep.target_loss is None:
        return "the data sweep has no target loss to solve L(D) for", "no training-set size"
    if sweep is not None:
        return (
            "the data sweep's L(D) gives no finite size for the target loss",
            "no training-set size",
        )
    why = (
        scaling.reason
        if isinstance(scaling, NotComputed)
        else "measurements.loss_vs_data not given"
    )
    reason = (
        f"no data sweep ({why}): only training on subsets of the data predicts how much "
        "data reaches a loss; run the command in next_step"
    )
    return reason, "no training-set size"


def _assess_available(data: BudgetData, warnings: list[str]) -> None:
    """available_is_enough: the examples you have against the data sweep's size (conservative:
    the upper end of its interval)."""
    available = data.available_samples
    rec = data.recommended_examples
    if available is None:
        data.available_note = "targets.available_samples not given: enough data is not assessed"
        return
    if rec is None:
        return
    ci = data.recommended_examples_ci
    upper = ci[1] if ci is not None else rec
    if upper is not None and available >= upper:
        data.available_is_enough = True
    elif available < rec:
        data.available_is_enough = False
    data.available_note = (
        f"you have {available:,} training examples; the data sweep predicts {rec:,} for the "
        "target"
        + (
            f" (up to {_fmt(upper)} at the interval's upper end)"
            if upper is not None
            else " (the interval's upper end is unbounded)"
        )
    )
    if data.available_is_enough is False:
        warnings.append(f"data: {data.available_note}: not enough data")
    elif data.available_is_enough is None:
        data.available_note += ": enough at the point value, not at the interval's upper end"


def _trend_at_target(
    points: list[NoiseTrendPoint], target: float | None, confidence: float
) -> tuple[float, tuple[float | None, float | None] | None, str] | str:
    """(B, interval, which) from the trend at the target loss; or the reason it is missing."""
    if target is None:
        return "no target loss"
    rows: list[tuple[float, float, float | None]] = []
    which = "B_noise"
    z = float(stats.norm.ppf((1 + confidence) / 2))
    for name in TREND_SCALE_ORDER:  # the leading scale is one named constant
        num, den = NOISE_SCALE_FIELDS[name]
        rows = []
        for p in points:
            a, b = getattr(p, num), getattr(p, den)
            if p.loss is None or a is None or b is None or a <= 0 or b <= 0:
                continue
            a_se, b_se = getattr(p, f"{num}_se"), getattr(p, f"{den}_se")
            if b_se is not None and b <= z * b_se:
                continue  # the denominator is not significantly positive: ratio undefined
            se = getattr(p, "log_b_noise_se" if name == "B_noise" else "log_b_simple_se", None)
            if se is None and a_se is not None and b_se is not None:
                se = math.hypot(a_se / a, b_se / b)  # delta method on log(a/b)
            rows.append((p.loss, math.log(a / b), se))
        which = name
        if len(rows) >= 2:
            break
    if len(rows) < 2:
        return (
            "the noise scale is defined (significantly positive |G|² or GᵀHG), with a loss, at "
            "fewer than 2 intermediate checkpoints; "
            "a single checkpoint's value is not used as a constant for the whole run"
        )
    loss = np.array([r[0] for r in rows])
    logb = np.array([r[1] for r in rows])
    se = np.array([r[2] if r[2] else np.nan for r in rows])
    if np.unique(loss).size < 2:
        return "the intermediate checkpoints have the same loss"
    w = np.where(np.isfinite(se) & (se > 0), 1.0 / np.maximum(se, 1e-6) ** 2, 1.0)
    x = np.column_stack([np.ones_like(loss), loss])
    xtw = x.T * w
    cov_unscaled = np.linalg.inv(xtw @ x)
    beta = cov_unscaled @ (xtw @ logb)
    x0 = np.array([1.0, target])
    center = float(x0 @ beta)
    n = loss.size
    ci = None
    if n >= 3:
        resid = logb - x @ beta
        s2 = float((w * resid**2).sum() / (n - 2))
        var = float(x0 @ cov_unscaled @ x0) * s2
        t = float(stats.t.ppf((1 + confidence) / 2, n - 2))
        half = t * math.sqrt(max(var, 0.0))
        ci = (math.exp(center - half), math.exp(center + half))
    elif np.isfinite(se).all():
        var = float(x0 @ cov_unscaled @ x0)
        z = float(stats.norm.ppf((1 + confidence) / 2))
        ci = (math.exp(center - z * math.sqrt(var)), math.exp(center + z * math.sqrt(var)))
    return math.exp(center), ci, which


BatchSource = Literal["batch_scaling_law", "batch_sweep", "noise_scale_trend", "branch_sweep"]

#: Which source leads budget.batch, in order (docs/budget.md#which-source-leads). Decided by
#: the predictive benchmark against a brute-force B_crit on real text (2 seeds, pooled fit
#: 13.8 at the target 2.62, seeds 18.1 and 10.2;
#: ``benchmarks/results/predictive-full-20261204-0627-next-step-pool8000.md``): the batch sweep's
#: B_crit 12.9 (0.93×) and the noise-scale trend 19.7 (1.42×) predict it; the
#: branch sweep's lead number at the latest checkpoint (the ε-crossing) said 29.9 (2.16×), its
#: ladder CBS 16 (1.16×) but 8 (0.37×) on the earlier truth (``…-0659-full-r25b.md``), its
#: efficiency fit 27–79 (2.0–5.7×). The branch sweep leads only when nothing else is given,
#: and its warm-up schedule and estimates are always reported beside the lead. The batch
#: scaling law leads first, and only when targets.target_tokens names a target run: the other
#: sources measure the pilots' own B_crit, the law the target run's (B_crit grows with the
#: tokens trained on; ``benchmarks/results/batch-scaling-law-zhang2024.txt`` holds its check).
BATCH_SOURCE_ORDER: tuple[BatchSource, ...] = (
    "batch_scaling_law",
    "batch_sweep",
    "noise_scale_trend",
    "branch_sweep",
)


def build_batch(
    measurements: Measurements,
    targets: Targets,
    batch: BatchSizeSection | object,
    *,
    seed: int = 0,
) -> tuple[BudgetBatch, list[str]]:
    """budget.batch from the first available source of ``BATCH_SOURCE_ORDER`` (today: the
    batch scaling law at targets.target_tokens, else the batch sweep's B_crit, else the
    noise-scale trend at the target loss, else a branch sweep's critical batch), else
    not_available (docs/budget.md). A branch sweep that does not lead
    still gives its warm-up schedule and its estimates."""
    warnings: list[str] = []
    tokens = _tokens_per_example(measurements)
    bcrit = batch.b_crit if isinstance(batch, BatchSizeSection) else None
    branched = getattr(measurements, "branched_critical_batch", None)
    from_branch = (
        None
        if branched is None
        else branch_budget_batch(
            branched,
            target_loss=targets.target_loss,
            tokens_per_example=tokens,
            batch_sweep=bcrit if isinstance(bcrit, BCrit) else None,
            expected_steps_formula=STEPS_FORMULA,
        )
    )
    trend = list(getattr(measurements, "gradient_noise_trend", None) or [])
    found = _trend_at_target(trend, targets.target_loss, targets.confidence) if trend else None

    def from_source(source: BatchSource) -> BudgetBatch | None:
        if source == "batch_scaling_law":
            answer, notes = batch_from_scaling_law(measurements, targets, seed)
            warnings.extend(notes)
            return answer
        if source == "batch_sweep":
            if isinstance(bcrit, BCrit) and getattr(bcrit, "unit", "examples") == "examples":
                swept = measurements.steps_to_target_loss
                return _batch_from_sweep(bcrit, tokens, targets, swept, warnings)
            return None
        if source == "noise_scale_trend":
            if isinstance(found, tuple):
                return _batch_from_trend(found, trend, tokens, targets, warnings)
            return None
        return None if from_branch is None else from_branch[0]

    for source in BATCH_SOURCE_ORDER:
        answer = from_source(source)
        if answer is None:
            continue
        if source == "branch_sweep" or from_branch is None or from_branch[0] is None:
            # the branch sweep's own warnings: when it leads, or when it measured nothing
            said = from_branch[1] if from_branch is not None else []
            return answer, warnings + said
        branch_answer = from_branch[0]
        crit = branch_answer.critical
        warnings.append(
            f"batch: the branch sweep's critical batch {'—' if crit is None else f'{crit:.4g}'} "
            f"({branch_answer.critical_method}) does not lead; the "
            f"{source.replace('_', ' ')} does, as the predictive benchmark decided "
            "(docs/budget.md#which-source-leads); the branch sweep's warm-up schedule and "
            "estimates are in budget.batch"
        )
        update = {
            "warmup_schedule": branch_answer.warmup_schedule,
            "branch_estimates": branch_answer.branch_estimates,
        }
        return answer.model_copy(update=update), warnings
    unmeasured = from_branch is not None and from_branch[0] is None
    answer = _no_batch(measurements, targets, bcrit, tokens, trend, found)
    if unmeasured:
        assert from_branch is not None and answer.reason is not None
        reason = "the branch sweep measured no CBS at any checkpoint (see the warnings); "
        answer = answer.model_copy(update={"reason": reason + answer.reason})
    return answer, warnings + (from_branch[1] if from_branch is not None else [])


def _no_batch(
    measurements: Measurements,
    targets: Targets,
    bcrit: object,
    tokens: float | None,
    trend: list[NoiseTrendPoint],
    found: object,
) -> BudgetBatch:
    """budget.batch when no source is available: not_available with the reason."""
    if trend or measurements.gradient_noise is not None:
        reason = (
            found
            if isinstance(found, str)
            else (
                "only one checkpoint's noise scale was measured; its late value is not used as a "
                "constant for the whole run: give intermediate checkpoints or run a batch sweep"
            )
        )
    else:
        reason = (
            "no batch sweep (measurements.steps_to_target) and no noise-scale trend "
            "(intermediate checkpoints): run a batch sweep, or analyze with "
            "intermediate_checkpoints (a Hugging Face Trainer output folder gives them: "
            "--model RUN_DIR with its checkpoint-<step> subfolders)"
        )
    if isinstance(bcrit, BCrit):
        reason = "B_crit is in tokens and tokens_per_example is unknown; " + reason
    return BudgetBatch(
        recommended=None,
        critical=None,
        tokens_per_example=tokens,
        source="not_available",
        basis="not available",
        target_loss=targets.target_loss,
        reason=reason,
    )


def _in_tokens(x: float | None, tokens: float | None) -> float | None:
    return None if x is None or tokens is None else x * tokens


def _ci_in_tokens(ci: Interval | None, tokens: float | None) -> Interval | None:
    if ci is None or tokens is None:
        return None
    return (_in_tokens(ci[0], tokens), _in_tokens(ci[1], tokens))


def _batch_from_sweep(
    bcrit: BCrit,
    tokens: float | None,
    targets: Targets,
    swept: float | None,
    warnings: list[str],
) -> BudgetBatch:
    """Step 1: the batch sweep's B_crit, its power of two and the steps S(B) expected there;
    it answers the loss its sweep trained to (``swept``), whatever targets.target_loss says."""
    rec = nearest_power_of_two(bcrit.value)
    steps = steps_ci = None
    if rec is not None:
        steps = bcrit.s_min * (1 + bcrit.value / rec)
        if bcrit.s_min_ci is not None and bcrit.ci is not None:
            lo_s, hi_s = bcrit.s_min_ci
            lo_b, hi_b = bcrit.ci
            if lo_s is not None and hi_s is not None and lo_b is not None and hi_b is not None:
                ends = (lo_s * (1 + lo_b / rec), hi_s * (1 + hi_b / rec))
                steps_ci = (finite_or_none(ends[0]), finite_or_none(ends[1]))
    lo, hi = bcrit.measured_range or (None, None)
    answers = swept if swept is not None else targets.target_loss
    if swept is not None and targets.target_loss is not None and swept != targets.target_loss:
        warnings.append(
            f"targets: budget.batch answers the batch sweep's loss {swept:.4g}, budget.data "
            f"the target loss {targets.target_loss:.4g} (they differ)"
        )
    if lo is not None and hi is not None and not lo <= bcrit.value <= hi:
        warnings.append(
            f"batch: B_crit = {bcrit.value:.4g} lies outside the swept batch sizes "
            f"{lo}–{hi}: extrapolated"
        )
    return BudgetBatch(
        recommended=rec,
        recommended_tokens=_in_tokens(rec, tokens),
        critical=bcrit.value,
        critical_ci=bcrit.ci,
        critical_tokens=_in_tokens(bcrit.value, tokens),
        critical_tokens_ci=_ci_in_tokens(bcrit.ci, tokens),
        tokens_per_example=tokens,
        source="batch_sweep",
        basis="B_crit = E_min/S_min fitted to the batch sweep's steps to the target loss "
        "(S(B) = S_min·(1 + B_crit/B), McCandlish et al. 2018, eq. 2.11)",
        target_loss=answers,
        expected_steps=steps,
        expected_steps_ci=steps_ci,
        expected_steps_formula=STEPS_FORMULA,
        expected_examples=None if steps is None or rec is None else steps * rec,
    )


def _batch_from_trend(
    found: tuple[float, tuple[float | None, float | None] | None, str],
    trend: list[NoiseTrendPoint],
    tokens: float | None,
    targets: Targets,
    warnings: list[str],
) -> BudgetBatch:
    """Step 2: the noise-scale trend over the checkpoints evaluated at the target loss."""
    value, ci, which = found
    losses = [p.loss for p in trend if p.loss is not None]
    target = targets.target_loss
    if target is not None and losses and not min(losses) <= target <= max(losses):
        warnings.append(
            f"batch: the target loss {target:.4g} is outside the checkpoints' losses "
            f"{min(losses):.4g}–{max(losses):.4g}: the noise-scale trend is extrapolated"
        )
    rec = nearest_power_of_two(value)
    return BudgetBatch(
        recommended=rec,
        recommended_tokens=_in_tokens(rec, tokens),
        critical=value,
        critical_ci=ci,
        critical_tokens=_in_tokens(value, tokens),
        critical_tokens_ci=_ci_in_tokens(ci, tokens),
        tokens_per_example=tokens,
        source="noise_scale_trend",
        basis=f"{which} trend over {len(trend)} intermediate checkpoints evaluated at "
        f"the target loss ({TREND_FORMULA}); B_crit ≈ B_noise (McCandlish et al. 2018 "
        "§2.2; B_simple is its proxy when the Hessian terms are missing)",
        target_loss=target,
        reason="expected steps need S_min, which only a batch sweep measures",
    )


SHARPNESS_MEANING = (
    "2/λ_max of the whole-model Hessian is the gradient-descent sharpness threshold: with a "
    "full-batch GD step size above it the loss stops decreasing monotonically and the "
    "sharpness λ_max adjusts itself to about 2/η (edge of stability, Cohen et al. 2021); "
    "training usually goes on. It is not a divergence limit, and not a limit for SGD "
    "(noisy steps) or Adam (preconditioned steps)"
)


def build_learning_rate(
    measurements: Measurements, curvature: CurvatureSection | object
) -> BudgetLearningRate:
    """budget.learning_rate: 2/λ_max(full model) (Cohen et al. 2021, the sharpness
    threshold 2/η of §3), the largest block λ_max beside it (docs/budget.md#learning-rate)."""
    label = "gradient-descent sharpness threshold 2/λ_max(full Hessian) (Cohen et al. 2021)"
    blocks = curvature.blocks if isinstance(curvature, CurvatureSection) else []
    positive = [b for b in blocks if b.lambda_max > 0]
    top = max(positive, key=lambda b: b.lambda_max) if positive else None
    block_fields: _BlockThreshold = {}
    if top is not None:
        block_fields = {
            "lambda_max_block": top.lambda_max,
            "lambda_max_block_name": top.name,
            "block_threshold": 2.0 / top.lambda_max,
        }
    full = measurements.full_model
    if full is None or full.lambda_max <= 0:
        reason = (
            "measurements.full_model (λ_max of the whole-model Hessian) not given: analyze "
            "measures it"
            if full is None
            else f"the whole-model λ_max is {full.lambda_max:.4g} ≤ 0: no threshold"
        )
        if top is not None:
            reason += (
                "; 2/λ_max of the largest block is an upper bound on the threshold "
                "(block_threshold)"
            )
        return BudgetLearningRate(
            meaning=SHARPNESS_MEANING, label=label, reason=reason, **block_fields
        )
    return BudgetLearningRate(
        gd_sharpness_threshold=2.0 / full.lambda_max,
        lambda_max_full=full.lambda_max,
        lambda_max_full_products=full.n_products,
        lambda_max_full_converged=full.converged,
        meaning=SHARPNESS_MEANING,
        label=label,
        reason=None
        if full.converged is not False
        else "the whole-model Lanczos did not converge: λ_max may be under-estimated, so the "
        "threshold may be too high",
        **block_fields,
    )


def build_budget(
    measurements: Measurements,
    targets: Targets,
    defaults: BudgetDefaults,
    *,
    sample_size: object,
    batch_size: object,
    scaling: object,
    solved: DataForTarget,
    curvature: object,
    seed: int = 0,
    flags: CommandFlags | None = None,
) -> Budget:
    """The budget from the plan's sections (``targets`` with defaults already filled in);
    ``solved``: the scaling fit's size at the target loss; ``flags``: how the analysis was
    submitted, for the next-step commands."""
    data, w1 = build_data(measurements, targets, sample_size, scaling, solved, flags)
    batch, w2 = build_batch(measurements, targets, batch_size, seed=seed)
    warnings = w1 + w2
    if not defaults.tolerances_given and defaults.tolerances:
        warnings.append(
            f"defaults: tolerance ε = {defaults.tolerances[0]:.4g} nats = "
            f"{defaults.tolerance_ratio:g} × the mean loss at w* (targets.tolerances not given)"
        )
    if not defaults.target_loss_given and defaults.target_loss is not None:
        warnings.append(
            f"defaults: target loss = {defaults.target_loss:.4g} nats, the mean loss at w* "
            "(targets.target_loss not given)"
        )
    return Budget(
        data=data,
        batch=batch,
        learning_rate=build_learning_rate(measurements, curvature),
        defaults=defaults,
        warnings=warnings,
    )
