"""Input and output models of the planner (docs/openapi.json; the field names are an API contract).

Inputs (`Measurements`, `Targets`) are validated strictly: unknown fields, NaN/inf, negative
counts, empty arrays, mismatched lengths and non-positive tolerances raise a pydantic
`ValidationError` whose `loc` names the failing field. Cross-field checks are field validators
on the later field, so the error points at the field that disagrees with an earlier one.

The output (`Recommendation`) holds, for every section, either values or a `NotComputed`
object with the reason; every number carries the formula that produced it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

# --------------------------------------------------------------------------- scalar types
#: The magnitudes a measured or target number may have: |x| ≤ 1e100, and a strictly
#: positive quantity (a tolerance, a step count, a radius of perturbation: what the planner
#: divides by) at least 1e-100. Products and ratios of a few of them stay within float64 (a
#: tolerance of 1e-200 squared underflowed to 0 and the loss-accuracy size divided by it);
#: every physical quantity a plan takes lies far inside the range.
MIN_MAGNITUDE = 1e-100
MAX_MAGNITUDE = 1e100
FiniteFloat = Annotated[float, Field(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, le=MAX_MAGNITUDE, allow_inf_nan=False)]
PosFloat = Annotated[float, Field(gt=0, ge=MIN_MAGNITUDE, le=MAX_MAGNITUDE, allow_inf_nan=False)]
PosInt = Annotated[int, Field(gt=0)]
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]

#: The largest loss (and loss_bound) accepted: sums of up to MAX_PER_SAMPLE_LOSSES losses and
#: squares of the bound stay finite in float64 (1e308 × 3 overflowed the mean to inf).
MAX_LOSS_VALUE = 1e150
LossValue = Annotated[float, Field(ge=0, le=MAX_LOSS_VALUE, allow_inf_nan=False)]
LossBound = Annotated[float, Field(gt=0, le=MAX_LOSS_VALUE, allow_inf_nan=False)]

MAX_ORDERINGS = 10_000
MAX_BOOTSTRAP = 100_000
# Input size caps (the planner's cost is linear in losses × orderings; 1e6 × 100 is the benchmark).
MAX_PER_SAMPLE_LOSSES = 10_000_000
MAX_PERTURBED_LOSSES = 20_000_000  # P × N over all perturbed points
MAX_LOSS_EVALUATIONS = 200_000_000  # (N + P × N) × orderings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- measurements
class PerturbedLosses(_Strict):
    """Per-sample losses at P perturbed points w* + r·u (docs/formulas.md#sample-size)."""

    radius: PosFloat
    losses: Annotated[list[Annotated[list[LossValue], Field(min_length=1)]], Field(min_length=1)]
    kind: Literal["random", "top_eigenspace"] = "random"

    @field_validator("losses")
    @classmethod
    def _rows_same_length(cls, rows: list[list[float]]) -> list[list[float]]:
        n = len(rows[0])
        if len(rows) * n > MAX_PERTURBED_LOSSES:
            raise ValueError(
                f"{len(rows)} points × {n} samples = {len(rows) * n} losses exceeds the cap of "
                f"{MAX_PERTURBED_LOSSES}"
            )
        for i, row in enumerate(rows):
            if len(row) != n:
                raise ValueError(
                    f"every perturbed point needs one loss per sample: row {i} has "
                    f"{len(row)} losses, row 0 has {n}"
                )
        return rows


class DirectNoiseStats(_Strict):
    """Direct gradient-noise statistics (McCandlish et al. 2018, §2.2 / eq. 2.6-2.8).

    B_simple needs `grad_sq_norm` and `trace_sigma`; B_noise needs `gHg` and `trace_h_sigma`.
    The four values are unbiased estimates and may be negative (near w* the unbiased |G|² often
    is: docs/numerics.md#negative-estimates, never clamp); the planner then reports the ratio
    undefined.
    Standard errors (`*_se`) give intervals; without them the values are reported as points.
    `n_samples` (how many independent estimates the statistics average) switches the interval
    and significance quantiles from normal to Student-t with n_samples − 1 degrees of freedom.

    From the engine (docs/numbers.md): `log_b_simple_se` / `log_b_noise_se` are jackknife
    standard errors of log B_simple / log B_noise on the SAME gradients (numerator and
    denominator are correlated; the planner then uses them, with `jackknife_groups` − 1 degrees
    of freedom); `b_*_p_defined` and `b_*_median_ratio` are the selection bias of the ratio (a
    bootstrap at the measured statistics: probability that it is defined, median
    estimate/truth when it is); `stop_reason` says why the engine stopped adding examples.
    Σ is the covariance of PER-EXAMPLE gradients (one row of the dataset, not one token).
    """

    grad_sq_norm: FiniteFloat | None = None
    trace_sigma: FiniteFloat | None = None
    gHg: FiniteFloat | None = None
    trace_h_sigma: FiniteFloat | None = None
    grad_sq_norm_se: NonNegFloat | None = None
    trace_sigma_se: NonNegFloat | None = None
    gHg_se: NonNegFloat | None = None
    trace_h_sigma_se: NonNegFloat | None = None
    n_samples: PosInt | None = None
    log_b_simple_se: NonNegFloat | None = None
    log_b_noise_se: NonNegFloat | None = None
    jackknife_groups: Annotated[int, Field(ge=3)] | None = None
    b_simple_p_defined: Probability | None = None
    b_simple_median_ratio: PosFloat | None = None
    b_noise_p_defined: Probability | None = None
    b_noise_median_ratio: PosFloat | None = None
    stop_reason: Literal["precise", "significant", "budget", "fixed"] | None = None

    @model_validator(mode="after")
    def _pairs_complete(self) -> DirectNoiseStats:
        simple = (self.grad_sq_norm, self.trace_sigma)
        noise = (self.gHg, self.trace_h_sigma)
        if all(v is None for v in (*simple, *noise)):
            raise ValueError(
                "direct gradient_noise needs grad_sq_norm and trace_sigma (B_simple) "
                "and/or gHg and trace_h_sigma (B_noise)"
            )
        for a, b, na, nb in (
            (*simple, "grad_sq_norm", "trace_sigma"),
            (*noise, "gHg", "trace_h_sigma"),
        ):
            if (a is None) != (b is None):
                raise ValueError(f"{na} and {nb} must be given together")
        return self


class NoiseTrendPoint(DirectNoiseStats):
    """Gradient-noise statistics at one intermediate checkpoint (`checkpoint` names it, `step`
    is its training step when known); the list is ordered oldest first."""

    checkpoint: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    step: Annotated[int, Field(ge=0)] | None = None
    loss: NonNegFloat | None = Field(
        default=None,
        description="Mean evaluation loss at this checkpoint (nats per token): the budget "
        "evaluates the noise-scale trend at the target loss from it.",
    )
    logged_loss: NonNegFloat | None = Field(
        default=None,
        description="The training loss the run itself logged at this checkpoint (a Hugging "
        "Face Trainer's log_history, or the checkpoint's safetensors metadata `loss`): shown "
        "beside `loss`, not used by the trend (a training-batch average, not the evaluation "
        "sample's loss).",
    )


MAX_TREND_POINTS = 1000


class TwoBatchNoiseSeries(_Strict):
    """Series of squared gradient norms at two batch sizes (McCandlish et al. 2018, App. A).

    `grad_sq_norm_small[t]` is |G_{B_small}|² (mean over micro-batches) and
    `grad_sq_norm_big[t]` is |G_{B_big}|² at the same step t. Optional `gHg_small/gHg_big`
    series of G_Bᵀ H G_B (H from an independent batch) give B_noise (docs/formulas.md#batch-size).
    """

    b_small: PosInt
    b_big: PosInt
    grad_sq_norm_small: Annotated[list[NonNegFloat], Field(min_length=1)]
    grad_sq_norm_big: Annotated[list[NonNegFloat], Field(min_length=1)]
    gHg_small: Annotated[list[FiniteFloat], Field(min_length=1)] | None = None
    gHg_big: Annotated[list[FiniteFloat], Field(min_length=1)] | None = None

    @field_validator("b_big")
    @classmethod
    def _distinct_batch_sizes(cls, b_big: int, info: ValidationInfo) -> int:
        if info.data.get("b_small") == b_big:
            raise ValueError(
                "b_big must differ from b_small (the estimator divides by B_big − B_small)"
            )
        return b_big

    @field_validator("grad_sq_norm_big", "gHg_small", "gHg_big")
    @classmethod
    def _same_length(cls, series: list[float] | None, info: ValidationInfo) -> list[float] | None:
        ref = info.data.get("grad_sq_norm_small")
        if series is not None and ref is not None and len(series) != len(ref):
            raise ValueError(
                f"{info.field_name} has {len(series)} entries but grad_sq_norm_small has "
                f"{len(ref)}: the series must be paired step by step"
            )
        return series

    @model_validator(mode="after")
    def _ghg_pair(self) -> TwoBatchNoiseSeries:
        if (self.gHg_small is None) != (self.gHg_big is None):
            raise ValueError("gHg_small and gHg_big must be given together")
        return self


_TWO_BATCH_KEYS = frozenset(TwoBatchNoiseSeries.model_fields)


def _noise_form(value: object) -> str:
    if isinstance(value, dict):
        return "two_batch" if _TWO_BATCH_KEYS & set(value) else "direct"
    return "two_batch" if isinstance(value, TwoBatchNoiseSeries) else "direct"


class StepsPoint(_Strict):
    batch_size: PosInt
    steps: PosFloat
    steps_uncertainty: NonNegFloat | None = Field(
        default=None,
        description="How far before `steps` the target may have been reached: the steps "
        "between the last evaluation above the target and the first at or below it (the "
        "logging interval; the crossing lies in (steps − steps_uncertainty, steps]). Optional; "
        "a row where it exceeds 20 % of the steps is warned about "
        "(`steps_to_target_coarse`): log the evaluation loss more often.",
    )

    @model_validator(mode="after")
    def _uncertainty_within_steps(self) -> StepsPoint:
        if self.steps_uncertainty is not None and self.steps_uncertainty > self.steps:
            raise ValueError(
                f"steps_uncertainty {self.steps_uncertainty} exceeds steps {self.steps}: the "
                "crossing lies in (steps − steps_uncertainty, steps], after step 0"
            )
        return self


#: At most this many batch sweeps (token counts) in one plan (each costs one steps fit).
MAX_BATCH_SWEEPS = 32
#: The largest token count accepted (a sweep's or the target run's): 1e30 tokens.
MAX_TOKENS = 1e30
TokenCount = Annotated[float, Field(gt=0, le=MAX_TOKENS, allow_inf_nan=False)]
#: At most this many batch sizes in one sweep's steps-to-target table.
MAX_SWEEP_BATCH_SIZES = 64


def _check_unique_batch_sizes(value: list[StepsPoint], field: str) -> list[StepsPoint]:
    sizes = [p.batch_size for p in value]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"{field} lists a batch_size twice; give one row each")
    return value


class BatchSweep(_Strict):
    """One batch sweep of pilot runs that each trained on ``tokens`` tokens: its steps to the
    target loss per batch size (batch sizes in the unit of measurements.steps_to_target_unit).
    Its B_crit comes from S = S_min(1 + B_crit/B) (docs/budget.md#batch)."""

    tokens: TokenCount = Field(description="Tokens each run of this sweep trained on (D).")
    steps_to_target: Annotated[
        list[StepsPoint], Field(min_length=3, max_length=MAX_SWEEP_BATCH_SIZES)
    ] = Field(description="Steps to the target loss at 3 or more distinct batch sizes.")

    @field_validator("steps_to_target")
    @classmethod
    def _unique_batch_sizes(cls, value: list[StepsPoint]) -> list[StepsPoint]:
        return _check_unique_batch_sizes(value, "steps_to_target")


class LossPoint(_Strict):
    n_samples: PosFloat
    loss: NonNegFloat


class BlockCurvature(_Strict):
    """Per-block Hessian curvature at w* from the engine (docs/formulas.md#curvature)."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    lambda_max: FiniteFloat
    lambda_min: FiniteFloat
    spectral_norm: NonNegFloat
    trace: FiniteFloat | None = None

    @field_validator("lambda_min")
    @classmethod
    def _ordered(cls, lambda_min: float, info: ValidationInfo) -> float:
        lambda_max = info.data.get("lambda_max")
        if lambda_max is not None and lambda_min > lambda_max:
            raise ValueError(f"lambda_min ({lambda_min}) exceeds lambda_max ({lambda_max})")
        return lambda_min


class FullModelCurvature(_Strict):
    """λ_max of the Hessian over ALL parameters at w*, from one Lanczos run on the whole-model
    operator (docs/numerics.md); a block's λ_max is only a lower bound on it (Cauchy
    interlacing: a block is a principal submatrix)."""

    lambda_max: FiniteFloat
    residual: NonNegFloat | None = Field(
        default=None, description="‖Hv − λv‖ of the Ritz pair (loss / parameter² units)."
    )
    converged: bool | None = None
    n_products: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Hessian-vector products the Lanczos run used (its cost)."
    )


class TheoryApplicability(_Strict):
    """Whether the model lies inside the assumptions of Petrov et al. 2025 (single head, post-LN,
    ReLU, no biases/W_O, MSE…; docs/formulas.md#bounds), as the analysis judged it."""

    applicable: bool
    reasons: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=500)]], Field(max_length=100)
    ] = Field(default_factory=list)


BRANCH_STATUSES = ("measured", "at_least", "at_most")
BranchStatus = Literal["measured", "at_least", "at_most"]
BranchPointStatus = Literal["measured", "at_least", "at_most", "not_measured"]
"""A checkpoint's CBS status: a BranchStatus, or not_measured (the reference batch made no
progress over the window, so "within ε" says nothing)."""
MAX_BRANCH_CHECKPOINTS = 16


BranchEstimateMethod = Literal["ladder", "efficiency_fit", "eps_crossing"]
ReferenceReach = Literal["inside", "kept_up", "not_reached"]


class BranchedBatchEstimate(_Strict):
    """One critical-batch number at a checkpoint from the branches' curves, with its bound
    status and bracket (docs/budget.md#branch-sweep): the ladder CBS (Merrill et al. 2025),
    the token-efficiency fit (McCandlish et al. 2018, eq. 2.11) or the ε-crossing in log B."""

    method: BranchEstimateMethod = Field(
        description="ladder: the largest swept batch within ε; efficiency_fit: B_c of "
        "E/e_B = (B_c + B)/(B_c + B₀) fitted over the swept batches; eps_crossing: the batch "
        "where the excess over the smallest batch crosses ε, interpolated in log B."
    )
    value: PosFloat = Field(
        description="Examples. measured: the estimate; at_least: its lower bound; at_most: "
        "its upper bound."
    )
    status: BranchStatus = Field(
        description="measured: inside the swept range; at_least / at_most: only a bound."
    )
    low: PosFloat | None = Field(
        default=None,
        description="Lower end of the bracket, examples (null: unbounded below). ladder and "
        "eps_crossing: the swept batch below; efficiency_fit: the fit with every larger "
        "batch's final loss ε higher. Not a confidence interval.",
    )
    high: PosFloat | None = Field(
        default=None,
        description="Upper end of the bracket, examples (null: unbounded above). "
        "efficiency_fit: the fit with every larger batch's final loss ε lower.",
    )
    formula: Annotated[str, Field(min_length=1, max_length=500)]
    rms_residual: NonNegFloat | None = Field(
        default=None,
        description="efficiency_fit: rms of the fit's residuals in e_B/E (0: the curves follow "
        "the model exactly).",
    )


class BranchedBatchPoint(_Strict):
    """The critical batch size measured by branched training at one checkpoint (Merrill et
    al. 2025): the largest swept batch whose loss over the branch window stayed within the
    tolerance of the smallest swept batch's (docs/budget.md#branch-sweep)."""

    checkpoint: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="The checkpoint's artifact id (or a label)."
    )
    step: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="The training step the checkpoint was saved at."
    )
    loss: NonNegFloat | None = Field(
        default=None, description="Evaluation loss at the checkpoint (nats per token)."
    )
    critical_batch: PosInt | None = Field(
        description="CBS, examples: the largest swept batch within the tolerance (status "
        "at_most: the smallest swept batch, the only one within it); null exactly when "
        "status is not_measured."
    )
    status: BranchPointStatus = Field(
        description="measured: CBS ≤ the true value < next_batch; at_least: even the largest "
        "swept batch stayed within (CBS ≥ it); at_most: no batch above the smallest did "
        "(CBS < next_batch); not_measured: the smallest batch made no progress over the "
        "window (its loss fell by ε or less), so every batch is trivially within ε (`reason` "
        "gives the losses)."
    )
    reason: Annotated[str, Field(min_length=1, max_length=1000)] | None = Field(
        default=None, description="Why the CBS is not measured here (status not_measured)."
    )
    next_batch: PosInt | None = Field(
        default=None, description="The next swept batch above critical_batch (null: none)."
    )
    efficiency: BranchedBatchEstimate | None = Field(
        default=None,
        description="The token-efficiency fit at this checkpoint (method efficiency_fit).",
    )
    crossing: BranchedBatchEstimate | None = Field(
        default=None,
        description="The ε-crossing interpolated in log B at this checkpoint (eps_crossing).",
    )

    @model_validator(mode="after")
    def _not_measured_has_no_number(self) -> BranchedBatchPoint:
        unmeasured = self.status == "not_measured"
        if unmeasured != (self.critical_batch is None):
            raise ValueError(
                "critical_batch is null exactly when status is not_measured "
                f"(got status {self.status!r}, critical_batch {self.critical_batch!r})"
            )
        if unmeasured and (self.efficiency is not None or self.crossing is not None):
            raise ValueError("a not_measured checkpoint carries no efficiency or crossing")
        return self


class BranchedCriticalBatch(_Strict):
    """A branch sweep's critical batch sizes over training (``sweep.branch`` of a ``sweep``
    job, passed to an analysis through ``sweeps``)."""

    checkpoints: Annotated[
        list[BranchedBatchPoint], Field(min_length=1, max_length=MAX_BRANCH_CHECKPOINTS)
    ]
    tolerance: PosFloat = Field(description="ε of the CBS rule, nats per token.")
    compare: Literal["end", "window"] = Field(
        description="end: the losses at the end of the window are compared; window: at every "
        "evaluation of the window."
    )
    window_tokens: PosFloat | None = Field(
        default=None, description="Tokens every branch trained for from its checkpoint."
    )
    batch_sizes: Annotated[list[PosInt], Field(min_length=2, max_length=12)] = Field(
        description="The swept batch sizes, examples."
    )
    lr_rule: Annotated[str, Field(max_length=500)] | None = Field(
        default=None, description="How each branch's learning rate was set, in words."
    )


class Measurements(_Strict):
    """The `measurements` object of a plan job (docs/openapi.json). Every group is optional."""

    per_sample_losses: (
        Annotated[list[LossValue], Field(min_length=1, max_length=MAX_PER_SAMPLE_LOSSES)] | None
    ) = None
    per_sample_groups: (
        Annotated[list[int], Field(min_length=1, max_length=MAX_PER_SAMPLE_LOSSES)] | None
    ) = Field(
        default=None,
        description="Group id of every per-sample loss (e.g. its document), same order and "
        "length as per_sample_losses: the loss-accuracy variance is then cluster-robust over "
        "groups (docs/numbers.md#evaluation-set-size).",
    )
    perturbed_losses: PerturbedLosses | None = None
    loss_bound: LossBound | None = None
    hessian_norm_bound: NonNegFloat | None = None
    per_sample_hessian_norms: Annotated[list[NonNegFloat], Field(min_length=1)] | None = None
    gradient_noise: (
        Annotated[
            Annotated[DirectNoiseStats, Tag("direct")]
            | Annotated[TwoBatchNoiseSeries, Tag("two_batch")],
            Discriminator(_noise_form),
        ]
        | None
    ) = None
    steps_to_target: Annotated[list[StepsPoint], Field(min_length=1)] | None = None
    steps_to_target_loss: NonNegFloat | None = Field(
        default=None,
        description="The loss the steps_to_target runs trained to (a batch sweep's target, "
        "nats per token): budget.batch answers this loss; null: targets.target_loss.",
    )
    loss_vs_data: Annotated[list[LossPoint], Field(min_length=1)] | None = None
    blocks: Annotated[list[BlockCurvature], Field(min_length=1)] | None = None
    full_model: FullModelCurvature | None = Field(
        default=None,
        description="λ_max of the whole-model Hessian (one Lanczos over all parameters): the "
        "gradient-descent sharpness threshold 2/λ_max comes from it (docs/budget.md).",
    )
    gradient_norm_at_w_star: NonNegFloat | None = None
    per_sample_gradient_rms: NonNegFloat | None = None
    available_samples: PosInt | None = Field(
        default=None,
        description="deprecated: use targets.available_samples (still accepted, with the "
        "warning 'deprecated_field')",
    )
    theory: TheoryApplicability | None = None
    gradient_noise_trend: (
        Annotated[list[NoiseTrendPoint], Field(min_length=1, max_length=MAX_TREND_POINTS)] | None
    ) = None
    tokens_per_example: PosFloat | None = None
    model_parameters: PosInt | None = Field(
        default=None,
        description="Parameters of the model: prices a data sweep's training time in "
        "budget.data.next_step (an analysis fills it in).",
    )
    steps_to_target_unit: Literal["examples", "tokens"] = "examples"
    batch_sweeps: (
        Annotated[list[BatchSweep], Field(min_length=2, max_length=MAX_BATCH_SWEEPS)] | None
    ) = Field(
        default=None,
        description="Batch sweeps at 2 or more distinct token counts: B_crit(D) = c·D^γ is "
        "fitted to their critical batches and answers budget.batch for targets.target_tokens "
        "(docs/budget.md#batch).",
    )
    branched_critical_batch: BranchedCriticalBatch | None = Field(
        default=None,
        description="A branch sweep's critical batch per checkpoint (Merrill et al. 2025): "
        "its batch-size warm-up schedule is in budget.batch; it leads budget.batch only when "
        "no batch sweep and no noise-scale trend is given (docs/budget.md).",
    )

    @field_validator("per_sample_groups")
    @classmethod
    def _groups_match_losses(
        cls, value: list[int] | None, info: ValidationInfo
    ) -> list[int] | None:
        if value is None or "per_sample_losses" not in info.data:
            return value  # per_sample_losses itself failed: its own error names it
        losses = info.data["per_sample_losses"]
        if losses is None:
            raise ValueError("per_sample_groups needs per_sample_losses (one group id per loss)")
        if len(value) != len(losses):
            raise ValueError(
                f"per_sample_groups has {len(value)} group ids but per_sample_losses has "
                f"{len(losses)} losses: give one group id per loss, in the same order"
            )
        return value

    @field_validator("perturbed_losses")
    @classmethod
    def _perturbed_matches_n(
        cls, value: PerturbedLosses | None, info: ValidationInfo
    ) -> PerturbedLosses | None:
        losses = info.data.get("per_sample_losses")
        if value is not None and losses is not None and len(value.losses[0]) != len(losses):
            raise ValueError(
                f"perturbed_losses rows have {len(value.losses[0])} losses but "
                f"per_sample_losses has {len(losses)}: they must be the same samples"
            )
        return value

    @field_validator("loss_bound")
    @classmethod
    def _bound_covers_losses(cls, value: float | None, info: ValidationInfo) -> float | None:
        losses = info.data.get("per_sample_losses")
        if value is not None and losses is not None and max(losses) > value:
            raise ValueError(
                f"loss_bound {value} is below the largest per-sample loss {max(losses)}; "
                "Theorem 7 needs 0 ≤ l_i ≤ ℓ_max"
            )
        return value

    @field_validator("per_sample_hessian_norms")
    @classmethod
    def _norms_within_bound(
        cls, value: list[float] | None, info: ValidationInfo
    ) -> list[float] | None:
        bound = info.data.get("hessian_norm_bound")
        if value is not None and bound is not None and max(value) > bound:
            raise ValueError(
                f"a per-sample Hessian norm ({max(value)}) exceeds hessian_norm_bound ({bound})"
            )
        return value

    @field_validator("steps_to_target")
    @classmethod
    def _unique_batch_sizes(cls, value: list[StepsPoint] | None) -> list[StepsPoint] | None:
        return None if value is None else _check_unique_batch_sizes(value, "steps_to_target")

    @field_validator("batch_sweeps")
    @classmethod
    def _distinct_sweep_tokens(cls, value: list[BatchSweep] | None) -> list[BatchSweep] | None:
        if value is not None:
            tokens = [sweep.tokens for sweep in value]
            if len(set(tokens)) != len(tokens):
                raise ValueError(
                    "batch_sweeps lists a token count twice; give each sweep its own tokens "
                    "(the law needs 2 or more distinct token counts)"
                )
        return value

    @field_validator("blocks")
    @classmethod
    def _unique_block_names(cls, value: list[BlockCurvature] | None) -> list[BlockCurvature] | None:
        if value is not None:
            names = [b.name for b in value]
            if len(set(names)) != len(names):
                raise ValueError("block names must be unique")
        return value


# --------------------------------------------------------------------------- targets
class Targets(_Strict):
    """The `targets` object of a plan job (docs/openapi.json)."""

    tolerances: Annotated[list[PosFloat], Field(min_length=1)] | None = None
    radius: NonNegFloat | None = None
    target_loss: NonNegFloat | None = None
    confidence: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] = 0.95
    orderings: Annotated[int, Field(ge=2, le=MAX_ORDERINGS)] = 100
    bootstrap: Annotated[int, Field(ge=0, le=MAX_BOOTSTRAP)] = 1000
    fit_window: Annotated[list[PosInt], Field(min_length=2, max_length=2)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    available_samples: PosInt | None = Field(
        default=None,
        description="examples you have (or would buy); 'enough data' compares against it "
        "(docs/numbers.md)",
    )
    target_tokens: TokenCount | None = Field(
        default=None,
        description="Tokens the target run will train on: with measurements.batch_sweeps, "
        "budget.batch answers its batch from B_crit(D) = c·D^γ (docs/budget.md#batch).",
    )

    @field_validator("fit_window")
    @classmethod
    def _window_ordered(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and value[0] >= value[1]:
            raise ValueError("fit_window must be [k_min, k_max] with k_min < k_max")
        return value


# --------------------------------------------------------------------------- input size cap
class PlanInputError(ValueError):
    """Bad plan input found across measurements and targets; `field` names the failing field
    (dotted, e.g. "targets.orderings") for a 422-style answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def loss_evaluations(measurements: Measurements, targets: Targets) -> int:
    """Losses visited by the Δ_k curves: (N + P·N) × orderings (the planner's cost driver)."""
    n = len(measurements.per_sample_losses or [])
    perturbed = measurements.perturbed_losses
    p_n = len(perturbed.losses) * len(perturbed.losses[0]) if perturbed is not None else 0
    return (n + p_n) * targets.orderings


def check_workload(measurements: Measurements, targets: Targets) -> None:
    """Raise PlanInputError naming `targets.orderings` when (N + P·N) × orderings exceeds
    MAX_LOSS_EVALUATIONS (an input size cap; the benchmark size 1e6 × 100 is half of it).

    The job API should call this in its request validation so the client gets a 422."""
    total = loss_evaluations(measurements, targets)
    if total <= MAX_LOSS_EVALUATIONS:
        return
    per_ordering = total // targets.orderings
    allowed = MAX_LOSS_EVALUATIONS // per_ordering
    hint = (
        f"use at most {allowed} orderings"
        if allowed >= 2
        else "subsample measurements.per_sample_losses / perturbed_losses"
    )
    raise PlanInputError(
        "targets.orderings",
        f"{per_ordering} losses × {targets.orderings} orderings = {total} loss evaluations "
        f"exceeds the cap of {MAX_LOSS_EVALUATIONS}; {hint}",
    )


# --------------------------------------------------------------------------- recommendation
class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ReadsStored(_Out):
    """An output model some of whose fields were removed or renamed (README, "Breaking
    changes"): a recommendation stored before is read with the removed ones dropped and the
    renamed ones under their new name, so that it still validates and no answer comes back
    twice. ``REMOVED`` and ``RENAMED`` (old → new) name them; no old name is in the schema."""

    REMOVED: ClassVar[frozenset[str]] = frozenset()
    RENAMED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _read_stored_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if cls.REMOVED.isdisjoint(data) and not any(old in data for old in cls.RENAMED):
            return data
        kept = {key: value for key, value in data.items() if key not in cls.REMOVED}
        for old, new in cls.RENAMED.items():
            if old in kept:
                value = kept.pop(old)
                kept.setdefault(new, value)
        return kept


Interval = tuple[float | None, float | None]


class NotComputed(_Out):
    status: Literal["not_computed"] = "not_computed"
    reason: str


class Missing(_Out):
    item: str
    reason: str


WarningCode = Literal[
    "b_simple_undefined",
    "b_noise_undefined",
    "fit_window_too_short",
    "alpha_far_from_theory",
    "target_below_irreducible_loss",
    "negative_curvature",
    "assumption1_gradient_norm",
    "insufficient_samples",
    "poor_fit",
    "available_samples_insufficient",
    "b_crit_outside_measured_range",
    "b_crit_cross_check_disagrees",
    "extrapolation",
    "noise_estimate_negative",
    "theory_assumptions_not_met",
    "few_orderings",
    "deprecated_field",
    "noise_scale_conditional_bias",
    "noise_scale_trend",
    "batch_unit_mismatch",
    "correlated_losses",
    "steps_to_target_coarse",
]


class PlanWarning(_Out):
    code: WarningCode
    section: str
    detail: str


class PowerLawFit(_Out):
    """Δ_k ≈ C·k^(−α) fitted in log space; intervals are bootstrap percentiles over orderings
    combined with the data-sampling error of drawing the N samples (formulas.FIT_INTERVALS)."""

    C: float
    alpha: float
    C_ci: Interval | None = None
    alpha_ci: Interval | None = None
    r2: float
    window: tuple[int, int]
    n_points: int
    theory_alpha: float
    formula: str


class Curve(_Out):
    """Mean over orderings of Δ_k and Δ_k² per log-spaced k-bin (k = bin's geometric mean)."""

    k: list[int]
    delta: list[float]
    delta_sq: list[float]
    formula: str


class SampleSizeValue(_Out):
    k: int | None
    ci: tuple[int | None, int | None] | None = None
    formula: str
    note: str | None = None
    meaning: str | None = None


class PerTolerance(_ReadsStored):
    REMOVED = frozenset(
        {"loss_accuracy", "available_is_enough", "available_is_enough_stabilisation"}
    )

    tolerance: float
    empirical: SampleSizeValue | NotComputed
    theoretical: SampleSizeValue | NotComputed
    theoretical_tight: SampleSizeValue | NotComputed
    squared: SampleSizeValue | NotComputed
    squared_rms: SampleSizeValue | NotComputed
    evaluation_set_size: SampleSizeValue | NotComputed | None = Field(
        default=None,
        description="Examples an evaluation set needs so that its average loss at w* is within "
        "±ε of the population loss with probability ≈ confidence (k = z²σ²_eff/ε², σ²_eff "
        "cluster-robust when per_sample_groups is given). Not a training-set size.",
    )
    loss_accuracy_squared: SampleSizeValue | NotComputed | None = None
    loss_error_at_empirical: float | None = None


class BoundValue(_Out):
    value: float
    source: str
    formula: str


class OffMinimumFit(_Out):
    radius: float
    kind: str
    n_points: int
    fit: PowerLawFit | NotComputed
    fit_squared: PowerLawFit | NotComputed
    theorem7_C: float | None = None
    theorem7_C_tight: float | None = None
    tightness: float | None = None
    theorem7_formula: str | None = None


class LossVarianceOut(_Out):
    """σ² of the per-example losses at w* with its interval (docs/numbers.md)."""

    value: float
    ci: Interval | None = None
    se: float | None = None
    formula: str


class LossCorrelation(_Out):
    """Whether the measured per-example losses look correlated, and the variance the
    evaluation-set size uses (docs/numbers.md#evaluation-set-size)."""

    variance_method: Literal["iid", "cluster_robust"] = Field(
        description="iid: the sample variance s²; cluster_robust: n × the cluster-robust "
        "variance of the mean over per_sample_groups (CR1)."
    )
    effective_variance: float = Field(
        description="σ²_eff: the per-example variance k = z²σ²_eff/ε² uses (loss² units)."
    )
    effective_variance_ci: Interval | None = None
    n_groups: int | None = Field(default=None, description="Distinct group ids.")
    mean_group_size: float | None = Field(
        default=None, description="Size-weighted mean group size Σn_g²/n (Kish), examples."
    )
    design_effect: float | None = Field(
        default=None, description="σ²_eff / s²: how much the grouping inflates the variance."
    )
    design_effect_ci: Interval | None = None
    intra_cluster_correlation: float | None = Field(
        default=None, description="ρ from design_effect = 1 + (m̄ − 1)·ρ (Kish 1965)."
    )
    adjacent_correlation: float | None = Field(
        default=None,
        description="Lag-1 correlation of consecutive per-example losses in file order "
        "(windows of one document sit next to each other).",
    )
    correlated: bool = Field(description="The sample looks correlated (see `rule`).")
    rule: str = Field(description="When `correlated` is true.")
    note: str
    formula: str


class SampleSizeSection(_ReadsStored):
    REMOVED = frozenset({"recommended_criterion", "recommended_criterion_reason"})

    status: Literal["computed"] = "computed"
    n_losses: int
    orderings: int
    bootstrap: int
    confidence: float
    fit: PowerLawFit | NotComputed
    fit_squared: PowerLawFit | NotComputed
    curve: Curve | None = None
    loss_bound: BoundValue | None = None
    hessian_norm_bound: BoundValue | None = None
    radius: float | None = None
    available_samples: int | None = None
    available_samples_source: Literal["targets", "measurements (deprecated)"] | None = None
    loss_variance: LossVarianceOut | None = None
    loss_correlation: LossCorrelation | None = None
    off_minimum: list[OffMinimumFit] = Field(default_factory=list)
    per_tolerance: list[PerTolerance] = Field(default_factory=list)
    missing: list[Missing] = Field(default_factory=list)


class Estimate(_Out):
    value: float
    ci: Interval | None = None
    se: float | None = None
    formula: str
    dof: int | None = None


class NoiseReliability(_Out):
    """Selection bias of a noise-scale ratio (docs/numbers.md): `p_defined` is the probability
    that a re-measurement is defined, `median_ratio` the median estimate/truth among those."""

    p_defined: float
    median_ratio: float | None = None
    formula: str


class NoiseTrendOut(_Out):
    """B_simple / B_noise at one intermediate checkpoint (oldest first)."""

    checkpoint: str | None = None
    step: int | None = None
    b_simple: Estimate | NotComputed
    b_noise: Estimate | NotComputed
    b_simple_reliability: NoiseReliability | None = None


class BCrit(_Out):
    value: float
    ci: Interval | None = None
    s_min: float
    s_min_ci: Interval | None = None
    e_min: float
    e_min_ci: Interval | None = None
    r2: float | None = None
    formula: str
    cross_check: dict[str, float | str] | None = None
    b_20pct_overhead: float | None = None
    b_20pct_overhead_ci: Interval | None = None
    b_20pct_overhead_formula: str | None = None
    measured_range: tuple[int, int] | None = None
    input_unit: Literal["examples", "tokens"] = "examples"
    unit: Literal["examples", "tokens"] = "examples"


class LrScaling(_Out):
    formula: str
    b_noise: float
    epsilon_max: float | None = None
    factor_at_recommended: float | None = Field(
        default=None,
        description="1/(1 + B_noise/B) at B = budget.batch.recommended (null: the budget "
        "recommends no batch, or the batch section is in tokens).",
    )
    epsilon_opt_at_recommended: float | None = Field(
        default=None, description="ε_max × factor_at_recommended (learning-rate units)."
    )
    note: str | None = None


class BatchSizeSection(_ReadsStored):
    """The gradient-noise and batch-sweep measurements behind budget.batch (evidence: the
    batch to train at is budget.batch.recommended, and only there)."""

    REMOVED = frozenset(
        {"recommended", "recommended_basis", "recommended_formula", "recommended_tokens"}
    )

    status: Literal["computed"] = "computed"
    grad_sq_norm: Estimate | NotComputed | None = None
    trace_sigma: Estimate | NotComputed | None = None
    gHg: Estimate | NotComputed | None = None
    trace_h_sigma: Estimate | NotComputed | None = None
    source: Literal["direct", "two_batch"] | None = None
    b_simple: Estimate | NotComputed
    b_noise: Estimate | NotComputed
    b_crit: BCrit | NotComputed
    lr_scaling: LrScaling | NotComputed
    unit: Literal["examples", "tokens"] = "examples"
    tokens_per_example: float | None = None
    b_simple_reliability: NoiseReliability | None = None
    b_noise_reliability: NoiseReliability | None = None
    trend: list[NoiseTrendOut] = Field(default_factory=list)
    trend_note: str | None = None
    missing: list[Missing] = Field(default_factory=list)


class ScalingSection(_ReadsStored):
    """The evidence of the data sweep's fit L(D) = E + A·D^(−β); the size it solves for at
    the target loss is budget.data's answer, and only there."""

    REMOVED = frozenset({"n_for_target_loss", "n_for_target_loss_ci", "n_for_target_loss_formula"})

    status: Literal["computed"] = "computed"
    E: float
    A: float
    beta: float
    E_ci: Interval | None = None
    A_ci: Interval | None = None
    beta_ci: Interval | None = None
    r2: float | None = None
    n_points: int
    formula: str
    target_loss: float | None = None
    missing: list[Missing] = Field(default_factory=list)


class BlockSummary(_ReadsStored):
    RENAMED = {"lr_ceiling": "block_threshold"}

    name: str
    spectral_norm: float
    lambda_max: float
    lambda_min: float
    share_of_total_norm: float
    block_threshold: float | None = Field(
        description="2/λ_max of this block alone: an upper bound on the whole model's GD "
        "sharpness threshold (budget.learning_rate), not a learning rate to use."
    )
    negative_curvature: bool
    trace: float | None = None


class CurvatureSection(_ReadsStored):
    RENAMED = {"lr_ceiling_formula": "block_threshold_formula"}

    status: Literal["computed"] = "computed"
    blocks: list[BlockSummary] = Field(default_factory=list)
    top_blocks: list[str] = Field(default_factory=list)
    heterogeneity_ratio: float | None = None
    heterogeneity_formula: str | None = None
    block_threshold_formula: str | None = None
    gradient_norm_at_w_star: float | None = None
    assumption1_ratio: float | None = None
    assumption1_formula: str | None = None
    assumption1_mean_gradient_ratio: float | None = None
    per_sample_gradient_rms: float | None = None
    missing: list[Missing] = Field(default_factory=list)


# --------------------------------------------------------------------------- the budget
DEFAULT_TOLERANCE_RATIO = 0.01
"""Without ``targets.tolerances`` the tolerance is r × the mean loss at w*, r = 1 %."""


class BudgetInterval(_Out):
    low: float | None
    high: float | None


class LandscapeStabilisation(_Out):
    """k*(ε) of Petrov et al. (2025): beyond it one more example changes the average loss by
    about ε or less. A per-example increment, NOT the accuracy of the loss (docs/numbers.md)."""

    examples: int | None = Field(description="k*(ε), examples.")
    ci: tuple[int | None, int | None] | None = None
    tolerance: float = Field(description="ε, loss units (nats per token).")
    label: str


class EvaluationSetSize(_Out):
    """How many examples MEASURE the loss at w* to ±ε: an evaluation-set size, not a
    training-set size (docs/numbers.md#evaluation-set-size)."""

    examples: int | None = Field(description="k = ⌈z²σ²_eff/ε²⌉, examples.")
    ci: tuple[int | None, int | None] | None = Field(
        default=None, description="Interval of k from σ²_eff's interval, examples."
    )
    tolerance: float = Field(description="ε, loss units (nats per token).")
    confidence: float
    variance_method: Literal["iid", "cluster_robust"]
    design_effect: float | None = Field(
        default=None, description="σ²_eff / s² (1 for i.i.d. losses)."
    )
    correlated: bool | None = Field(
        default=None,
        description="The measured sample looks correlated (sample_size.loss_correlation says why).",
    )
    guarantee: str
    formula: str


class DataSweepNextStep(_Out):
    """The command that gets a predictive data number, and what it costs."""

    command: str = Field(description="The `curvplan sweep --type data …` command line.")
    data_sizes: list[int] | None = Field(
        default=None,
        description="Nested subset sizes the command trains on (null: the service's default, "
        "geometric from the training-data size down to 1/32 of it), examples.",
    )
    next_round_sizes: list[int] | None = Field(
        default=None,
        description="After a data sweep that does not bracket the target: the sizes the next "
        "round adds (halvings below or doublings above the measured ones); data_sizes adds, "
        "while fewer than 4, geometric midpoints between them and the nearest measured size "
        "(sizes not measured yet), so that the command's sweep fits on its own; analyze with "
        "both sweeps (`--sweep OLD --sweep NEW`): their L(D) tables are combined.",
    )
    training_runs: int = Field(
        description="Training runs of the command's first round (one child job each): every "
        "size at every lr-grid multiplier."
    )
    lr_grid_runs: int = Field(default=1, description="Runs per size (the lr grid's multipliers).")
    batch_size: int = Field(description="Examples per step of every run.")
    max_steps_per_run: int = Field(description="Steps of the longest run (the epoch rule).")
    steps_rule: str | None = Field(default=None, description="Steps per size, in words.")
    max_examples_processed: int = Field(
        description="Examples the first round processes: the sum over its runs of steps × "
        "batch_size."
    )
    max_tokens_processed: float | None = Field(
        default=None, description="max_examples_processed × tokens per example."
    )
    estimated_seconds: float | None = Field(
        default=None,
        description="Training time of the first round on one worker, from the cost model's "
        "FLOPs prior (6·P·T per example; evaluations not included); null: model size unknown.",
    )
    later_rounds: str | None = Field(
        default=None, description="What later rounds may add (the sweep's round and run caps)."
    )
    estimated_cost: str = Field(description="The cost, in words.")


class BudgetData(_ReadsStored):
    """How many TRAINING examples to have, from a data sweep's L(D), and what that number
    guarantees; `not_available` with the command that gets one otherwise."""

    REMOVED = frozenset({"loss_accuracy_examples"})

    recommended_examples: int | None = Field(
        description="Training examples (rows: sequences) predicted to reach the target loss."
    )
    recommended_examples_ci: tuple[float | None, float | None] | None = Field(
        default=None, description="Interval of recommended_examples, examples."
    )
    recommended_tokens: float | None = Field(
        default=None, description="recommended_examples × tokens per example."
    )
    unit: Literal["examples"] = "examples"
    source: Literal["data_sweep", "extrapolated", "not_available", "loss_accuracy"] = Field(
        description="data_sweep: the fitted L(D) of a data sweep (or loss_vs_data pilot runs), "
        "at a size within 1.5× of the measured sizes; extrapolated: the fitted size lies more "
        "than 1.5× outside them (a warning, its interval open on that side, next_step the "
        "next round's sizes); not_available: no predictive number (next_step says how to get "
        "one). "
        "'loss_accuracy' is never produced any more (only in recommendations stored before)."
    )
    criterion: str = Field(description="Which number leads and why.")
    guarantee: str = Field(description="What the number guarantees, in a user's words.")
    target_loss: float | None = Field(
        default=None, description="Held-out loss the data-sweep size is for (nats per token)."
    )
    target_status: Literal["reachable", "uncertain", "unreachable"] | None = Field(
        default=None,
        description="reachable: the target is above the fitted irreducible loss E; uncertain: "
        "it is between E's lower confidence end and E; unreachable: below E's lower "
        "confidence end (null: no data sweep or no target).",
    )
    irreducible_loss: float | None = Field(
        default=None, description="E of the fitted L(D) (nats per token)."
    )
    irreducible_loss_ci: Interval | None = None
    tolerance: float | None = Field(
        default=None, description="ε of the evaluation-set size, loss units (nats per token)."
    )
    evaluation_set_size: EvaluationSetSize | None = Field(
        default=None,
        description="Examples that measure the loss at w* to ±ε (an evaluation number, never "
        "compared with available_samples).",
    )
    landscape_stabilisation: LandscapeStabilisation | None = None
    available_samples: int | None = Field(
        default=None, description="targets.available_samples: examples you have, examples."
    )
    available_is_enough: bool | None = Field(
        default=None,
        description="available_samples ≥ the upper end of the data sweep's interval of "
        "recommended_examples (false below the point value; null: no data sweep number, "
        "available_samples not given, or between the point and an unbounded upper end).",
    )
    available_note: str | None = None
    measured_sizes: tuple[float, float] | None = Field(
        default=None, description="The smallest and largest size the L(D) fit measured."
    )
    next_step: DataSweepNextStep | None = Field(
        default=None,
        description="How to get a data-sweep number (source not_available), or the next "
        "round's sizes (source extrapolated).",
    )
    reason: str | None = Field(default=None, description="Why nothing is recommended.")


class BatchWarmupStage(_Out):
    """One stage of a batch-size warm-up: from ``from_step`` on, train at ``batch_size``."""

    from_step: int | None = Field(
        description="Training step the stage starts at (the checkpoint's step; null: the "
        "checkpoint declared none)."
    )
    batch_size: int = Field(
        description="The batch of the leading estimate at that checkpoint (the ladder CBS, or "
        "the power of two nearest the leading continuous estimate), examples."
    )
    batch_size_tokens: float | None = None
    status: BranchStatus = Field(description="The leading estimate's status there.")
    loss: float | None = Field(default=None, description="Evaluation loss at the checkpoint.")


class BatchSweepFitOut(_Out):
    """One batch sweep's critical batch from S = S_min(1 + B_crit/B), and whether the law
    uses it."""

    tokens: float
    b_crit: float | None = None
    b_crit_ci: Interval | None = None
    batch_sizes: int
    used: bool
    reason: str | None = Field(default=None, description="Why the law does not use it.")


class BatchScalingLawOut(_Out):
    """B_crit(D) = c·D^γ over the tokens D trained on (Zhang et al. 2024; Bergsma et al.
    2025), fitted to the batch sweeps' critical batches (docs/budget.md#batch)."""

    formula: str
    c: float | None = Field(
        description="Coefficient c, examples per tokens^γ (null: beyond float range)."
    )
    c_ci: Interval
    gamma: float = Field(description="Exponent γ of the tokens.")
    gamma_ci: Interval
    excess_scatter: float = Field(
        description="τ: scatter of log B_crit about the law beyond the sweeps' own intervals "
        "(0: the intervals explain it)."
    )
    measured_tokens_range: tuple[float, float] = Field(
        description="Smallest and largest token count of the sweeps the law is fitted to."
    )
    target_tokens: float
    extrapolation_factor: float = Field(
        description="target_tokens / the largest measured token count."
    )
    sweeps: list[BatchSweepFitOut]
    method: str = Field(description="How the law and its intervals are fitted, in words.")


class BudgetBatch(_Out):
    """Which batch size to train at; every batch size in examples, and in tokens."""

    recommended: int | None = Field(
        description="Power of two nearest the critical batch (branch sweep led by the ladder: "
        "the ladder CBS itself), examples."
    )
    recommended_tokens: float | None = None
    critical: float | None = Field(
        description="Critical batch size B_crit (the batch trading steps against examples "
        "equally: S = 2·S_min, E = 2·E_min), examples."
    )
    critical_ci: tuple[float | None, float | None] | None = None
    critical_tokens: float | None = None
    critical_tokens_ci: tuple[float | None, float | None] | None = None
    unit: Literal["examples"] = "examples"
    tokens_per_example: float | None = None
    source: Literal[
        "batch_scaling_law", "branch_sweep", "batch_sweep", "noise_scale_trend", "not_available"
    ]
    basis: str = Field(description="Where the critical batch comes from, in words.")
    critical_formula: str | None = Field(
        default=None, description="The formula of `critical` (branch sweep)."
    )
    critical_bracket: tuple[int | None, int | None] | None = Field(
        default=None,
        description="Branch sweep: the swept batches the critical batch lies between, "
        "[low, high) in examples (null end: beyond the swept range).",
    )
    warmup_schedule: list[BatchWarmupStage] = Field(
        default_factory=list,
        description="Branch sweep: the batch-size warm-up over training, the batch of the "
        "leading estimate at each checkpoint's step (Merrill et al. 2025); `recommended` is "
        "its last stage.",
    )
    critical_method: BranchEstimateMethod | None = Field(
        default=None,
        description="Branch sweep: which of its estimates at the latest checkpoint is "
        "`critical` (the one the predictive benchmark found nearest the brute-force B_crit).",
    )
    branch_estimates: list[BranchedBatchEstimate] = Field(
        default_factory=list,
        description="Branch sweep: every estimate at the latest checkpoint (ladder CBS, "
        "efficiency fit, ε-crossing), the leading one among them.",
    )
    target_loss: float | None = Field(default=None, description="Loss the batch is for (nats).")
    expected_steps: float | None = Field(
        default=None, description="Optimizer steps to the target at `recommended` (steps)."
    )
    expected_steps_ci: tuple[float | None, float | None] | None = None
    expected_steps_formula: str | None = None
    expected_examples: float | None = Field(
        default=None, description="expected_steps × recommended, examples."
    )
    reason: str | None = Field(default=None, description="Why something is not available.")
    scaling_law: BatchScalingLawOut | None = Field(
        default=None,
        description="Batch scaling law: B_crit(D) = c·D^γ fitted to the batch sweeps at "
        "several token counts, which gives `critical` at targets.target_tokens.",
    )


class BudgetLearningRate(_ReadsStored):
    """2/λ_max of the whole-model Hessian: the gradient-descent sharpness threshold (Cohen et
    al. 2021, "Gradient Descent on Neural Networks Typically Occurs at the Edge of
    Stability"). Above it full-batch GD's loss stops decreasing monotonically and the
    sharpness adjusts until λ_max ≈ 2/η; it is not a divergence limit, nor a limit for SGD or
    Adam (docs/budget.md#learning-rate)."""

    gd_sharpness_threshold: float | None = Field(
        default=None,
        description="2/λ_max(full model), learning-rate units of plain full-batch GD (null "
        "without measurements.full_model).",
    )
    lambda_max_full: float | None = Field(
        default=None, description="λ_max of the whole-model Hessian (loss / parameter²)."
    )
    lambda_max_full_products: int | None = Field(
        default=None, description="Hessian-vector products of its Lanczos run (its cost)."
    )
    lambda_max_full_converged: bool | None = None
    lambda_max_block: float | None = Field(
        default=None,
        description="Largest block λ_max: a lower bound on lambda_max_full (interlacing).",
    )
    lambda_max_block_name: str | None = None
    block_threshold: float | None = Field(
        default=None,
        description="2/lambda_max_block: an upper bound on gd_sharpness_threshold.",
    )
    meaning: str = Field(description="What the threshold means, in words.")
    label: str
    reason: str | None = None

    REMOVED = frozenset({"gd_stability_limit", "lambda_max", "lambda_max_source"})


class BudgetDefaults(_Out):
    """What the budget assumed where `targets` was silent (docs/budget.md)."""

    tolerances_given: bool
    tolerance_ratio: float = Field(description="r: default tolerance = r × mean loss at w*.")
    mean_loss_at_w_star: float | None = Field(description="Nats per token.")
    tolerances: list[float] = Field(description="Tolerances used, loss units (nats per token).")
    target_loss_given: bool
    target_loss: float | None = Field(description="Target loss used, nats per token.")
    target_loss_rule: str


class Budget(_Out):
    """The answer in one place: how much data, which batch size, the gradient-descent
    sharpness threshold.

    A pipeline reads this; the sections below it hold the measurements and fits behind it
    (docs/budget.md says what leads where and why)."""

    data: BudgetData
    batch: BudgetBatch
    learning_rate: BudgetLearningRate
    defaults: BudgetDefaults
    warnings: list[str] = Field(default_factory=list)


class Recommendation(_Out):
    """`result.recommendation` (docs/openapi.json): the budget first (docs/budget.md), then the
    sections behind it."""

    budget: Budget | None = Field(
        default=None,
        description="How much data, which batch size, the gradient-descent sharpness threshold "
        "(always set by the planner; null only in recommendations stored before it existed).",
    )
    sample_size: SampleSizeSection | NotComputed
    batch_size: BatchSizeSection | NotComputed
    scaling: ScalingSection | NotComputed
    curvature: CurvatureSection | NotComputed
    warnings: list[PlanWarning] = Field(default_factory=list)
    seed: int
